#include "schemes/method/linear_transforms.h"

#include <cmath>
#include <string>

#include "core/error.h"
#include "schemes/math/matmul.h"

namespace qparity::reference {

Matrix apply_transform(const Matrix& x, const TransformMatrix& m) {
  const int64_t b = m.block;
  if (b <= 0 || x.cols % b != 0 || m.t.size() != static_cast<size_t>(b * b))
    throw Error("online transform", "a block of " + std::to_string(b) + " does not divide " +
                                        std::to_string(x.cols) + " features");
  // x viewed as [rows * K / b, b] (row-major, so the view is the same data), times T: matmul_nt
  // takes T^T as its weight.
  Matrix xv;
  xv.rows = x.rows * (x.cols / b);
  xv.cols = b;
  xv.data = x.data;
  Matrix tt(b, b);
  for (int64_t r = 0; r < b; ++r)
    for (int64_t c = 0; c < b; ++c)
      tt(c, r) = m.t[static_cast<size_t>(r * b + c)];
  Matrix y = matmul_nt(xv, tt);
  y.rows = x.rows;
  y.cols = x.cols;
  return y;
}

TransformMatrix applied_transform(TransformType type, bool inverse, int64_t n,
                                  const std::vector<double>& stored,
                                  const std::vector<int64_t>& perm) {
  if (n <= 0 || stored.size() != static_cast<size_t>(n * n) ||
      (!perm.empty() && perm.size() != static_cast<size_t>(n)))
    throw Error("online transform", "a stored matrix of " + std::to_string(stored.size()) +
                                        " values for order " + std::to_string(n));
  TransformMatrix m;
  m.block = n;
  m.t.resize(static_cast<size_t>(n * n));
  const bool hadamard = type != TransformType::kRandomMatrix;
  // RandomMatrixTransform holds the inverse itself when inverse; HadamardTransform transposes.
  const bool transpose = hadamard && inverse;
  const double scale = hadamard ? 1.0 / std::sqrt(static_cast<double>(n)) : 1.0;
  for (int64_t r = 0; r < n; ++r)
    for (int64_t c = 0; c < n; ++c) {
      // weight[perm][:, perm], then .T when inverse.
      int64_t sr = transpose ? c : r, sc = transpose ? r : c;
      if (!perm.empty()) sr = perm[static_cast<size_t>(sr)], sc = perm[static_cast<size_t>(sc)];
      m.t[static_cast<size_t>(r * n + c)] = stored[static_cast<size_t>(sr * n + sc)] * scale;
    }
  return m;
}

bool LinearTransforms::empty() const {
  if (input) return false;
  for (const auto& o : output)
    if (o) return false;
  return true;
}

}  // namespace qparity::reference
