#include "golden/detection_limit.h"

#include <cmath>

#include "core/capture/capture_points.h"
#include "golden/metrics.h"

namespace qparity::golden {

const char* to_string(SliceShape s) {
  switch (s) {
    case SliceShape::kChannel:
      return "one channel";
    case SliceShape::kBlock32:
      return "one 32-column block";
    case SliceShape::kHead:
      return "one head";
    case SliceShape::kToken:
      return "one token";
  }
  return "?";
}

bool shows_detection_limit(const std::string& point) {
  const std::string p = layer_prefix(0) + ".";
  for (std::string_view s :
       {point::kAttnQkv, point::kAttnCore, point::kAttnOut, point::kMlpOut, point::kMoeOut})
    if (point == p + std::string(s)) return true;
  return false;
}

namespace {

constexpr int kGridSteps = 33;  // eps = 2^(-14 + k/2), k = 0..32

double grid_eps(int k) {
  return std::exp2(-14.0 + 0.5 * k);
}

}  // namespace

std::vector<DetectionLimit> detection_limits(const PolicySection& section, const std::string& point,
                                             std::span<const double> g, std::span<const double> c,
                                             int64_t rows, int64_t cols, int64_t head_dim) {
  std::vector<DetectionLimit> out;
  if (rows <= 0 || cols <= 0) return out;
  const Verdict as_dumped = judge_point(section, point, compare_point(g, c, rows, cols));
  if (!as_dumped.gated || !as_dumped.pass) return out;
  struct Plan {
    SliceShape shape;
    int64_t index, col0, ncols, row0, nrows;
  };
  std::vector<Plan> plans = {{SliceShape::kChannel, cols / 2, cols / 2, 1, 0, rows},
                             {SliceShape::kToken, rows / 2, 0, cols, rows / 2, 1}};
  if (cols >= 64) plans.push_back({SliceShape::kBlock32, 1, 32, 32, 0, rows});
  if (head_dim > 0 && cols % head_dim == 0 && cols / head_dim > 1 &&
      point == point_of(layer_prefix(0), point::kAttnCore))
    plans.push_back({SliceShape::kHead, 1, head_dim, head_dim, 0, rows});
  std::vector<double> planted(c.begin(), c.end());
  for (const Plan& p : plans) {
    const auto fails = [&](int k) {
      const double f = 1.0 + grid_eps(k);
      std::copy(c.begin(), c.end(), planted.begin());
      for (int64_t r = p.row0; r < p.row0 + p.nrows; ++r)
        for (int64_t j = p.col0; j < p.col0 + p.ncols; ++j)
          planted[static_cast<size_t>(r * cols + j)] *= f;
      return !judge_point(section, point, compare_point(g, planted, rows, cols)).pass;
    };
    DetectionLimit d{point, p.shape, p.index, std::nullopt};
    if (fails(kGridSteps - 1)) {
      int lo = -1, hi = kGridSteps - 1;  // fails(hi); lo passes (or below the grid)
      while (hi - lo > 1) {
        const int mid = (lo + hi) / 2;
        (fails(mid) ? hi : lo) = mid;
      }
      d.smallest = grid_eps(hi);
    }
    out.push_back(d);
  }
  return out;
}

}  // namespace qparity::golden
