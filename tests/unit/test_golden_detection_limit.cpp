// detection_limit.h: the smallest one-slice error a point gate catches, on hand-made points whose
// limits follow from the gates by arithmetic.
#include <gtest/gtest.h>

#include <cmath>
#include <vector>

#include "golden/detection_limit.h"
#include "golden/policy.h"

namespace qparity::golden {
namespace {

PolicySection gates(double tensor, double median_row, double column) {
  PolicySection s;
  PointGate g;
  g.match = "*";
  g.max_rel_l2 = tensor;
  g.max_median_row_rel_l2 = median_row;
  g.max_col_rel_l2 = column;
  s.points.push_back(g);
  return s;
}

const std::string kPoint = "layers.0.attn.out";

TEST(DetectionLimit, EachSliceIsCaughtWhereItsGateSaysOnTheHalfOctaveGrid) {
  // Every value 1: a channel's error e is its column's rel L2 (caught above 0.02 by the column
  // gate: first grid value 2^-5.5 = 0.0221); one token's e moves the tensor by e / sqrt(64) and
  // each column by as much (the tensor gate 0.01 first: e > 0.08, grid 2^-3.5 = 0.0884); a
  // 32-column block moves every token by e sqrt(32 / 128) = e / 2 (the median-token gate 0.002
  // first: e > 0.004, grid 2^-7.5 = 0.0055).
  const int64_t rows = 64, cols = 128;
  const std::vector<double> g(static_cast<size_t>(rows * cols), 1.0);
  const auto limits = detection_limits(gates(0.01, 0.002, 0.02), kPoint, g, g, rows, cols, 0);
  ASSERT_EQ(limits.size(), 3u);
  for (const auto& d : limits) {
    SCOPED_TRACE(to_string(d.shape));
    ASSERT_TRUE(d.smallest);
    EXPECT_EQ(d.point, kPoint);
    const double want = d.shape == SliceShape::kToken     ? std::exp2(-3.5)
                        : d.shape == SliceShape::kChannel ? std::exp2(-5.5)
                                                          : std::exp2(-7.5);
    EXPECT_DOUBLE_EQ(*d.smallest, want);
  }
  EXPECT_EQ(limits[0].shape, SliceShape::kChannel);
  EXPECT_EQ(limits[0].index, cols / 2);
  EXPECT_EQ(limits[1].shape, SliceShape::kToken);
  EXPECT_EQ(limits[1].index, rows / 2);
  EXPECT_EQ(limits[2].shape, SliceShape::kBlock32);
}

TEST(DetectionLimit, HeadsOfTheAttentionCoreAndWhatIsNotMeasured) {
  const int64_t rows = 16, cols = 128;
  const std::vector<double> g(static_cast<size_t>(rows * cols), 1.0);
  const std::string core = "layers.0.attn.core";
  const auto limits = detection_limits(gates(0.01, 0.002, 0.02), core, g, g, rows, cols, 32);
  ASSERT_EQ(limits.size(), 4u);
  EXPECT_EQ(limits[3].shape, SliceShape::kHead);
  EXPECT_DOUBLE_EQ(*limits[3].smallest, std::exp2(-7.5));  // a quarter of each token, as a block
  // Not caught up to 400 %: a gate so loose only a larger error fails.
  const auto loose = detection_limits(gates(100, 100, 100), kPoint, g, g, rows, cols, 0);
  ASSERT_FALSE(loose.empty());
  EXPECT_FALSE(loose[0].smallest);
  // A candidate already outside the gate, and a point no gate matches: no limits.
  std::vector<double> bad = g;
  for (double& v : bad)
    v *= 1.5;
  EXPECT_TRUE(detection_limits(gates(0.01, 0.002, 0.02), kPoint, g, bad, rows, cols, 0).empty());
  PolicySection none;
  PointGate other;
  other.match = "*.mlp.act";
  other.max_rel_l2 = 0.01;
  none.points.push_back(other);
  EXPECT_TRUE(detection_limits(none, kPoint, g, g, rows, cols, 0).empty());
  EXPECT_TRUE(shows_detection_limit("layers.0.mlp.out"));
  EXPECT_FALSE(shows_detection_limit("layers.1.mlp.out"));
  EXPECT_FALSE(shows_detection_limit("layers.0.moe.topk_ids"));
}

}  // namespace
}  // namespace qparity::golden
