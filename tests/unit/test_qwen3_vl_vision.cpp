// Qwen3-VL's vision tower pieces against hand-worked values: the position table's bilinear
// resampling (corners exact, an interior point by the formula, merge-window order), the patch
// coordinates the 2-D rotary reads, LayerNorm, and vision_config parsing and refusals.
#include <gtest/gtest.h>

#include <cmath>

#include "error_of.h"
#include "reference_cpu/models/qwen3_vl_vision.h"

namespace qparity::reference {
namespace {

using test::error_of;

// A 4 x 4 table whose row i is (i, 100 + i): any resampled value is traceable to its corners.
Matrix table4() {
  Matrix t(16, 2);
  for (int64_t i = 0; i < 16; ++i) {
    t(i, 0) = static_cast<double>(i);
    t(i, 1) = 100.0 + static_cast<double>(i);
  }
  return t;
}

TEST(Qwen3VlVision, PositionTableAtItsOwnSizeIsThePermutedTable) {
  const GridThw g{1, 4, 4};
  const Matrix p = vision_position_embedding(table4(), 4, {&g, 1}, 2);
  ASSERT_EQ(p.rows, 16);
  // Merge-window order: (0,0) (0,1) (1,0) (1,1) | (0,2) (0,3) (1,2) (1,3) | (2,0) ...
  const int64_t order[16] = {0, 1, 4, 5, 2, 3, 6, 7, 8, 9, 12, 13, 10, 11, 14, 15};
  for (int64_t r = 0; r < 16; ++r) {
    EXPECT_EQ(p(r, 0), static_cast<double>(order[r])) << r;
    EXPECT_EQ(p(r, 1), 100.0 + static_cast<double>(order[r])) << r;
  }
}

TEST(Qwen3VlVision, PositionTableResampledBilinearlyWithAlignedCorners) {
  // 2 x 2 from 4 x 4: linspace(0, 3, 2) = {0, 3}: the four corners, exactly.
  const GridThw corners{1, 2, 2};
  const Matrix c = vision_position_embedding(table4(), 4, {&corners, 1}, 2);
  EXPECT_EQ(c(0, 0), 0.0);
  EXPECT_EQ(c(1, 0), 3.0);
  EXPECT_EQ(c(2, 0), 12.0);
  EXPECT_EQ(c(3, 0), 15.0);
  // 6 x 2 from 4 x 4: rows at y = 3r/5; row 1 (y = 0.6) col 1 (x = 3): between table rows 3 and
  // 7 (x = 3 clips its ceiling to 3), 0.4 * E[3] + 0.6 * E[7]. It is the 2nd patch of the 1st
  // window's 2nd row: merge-window index 2.
  const GridThw tall{2, 6, 2};  // two frames: the second repeats the first
  const Matrix p = vision_position_embedding(table4(), 4, {&tall, 1}, 2);
  ASSERT_EQ(p.rows, 24);
  EXPECT_NEAR(p(3, 0), 0.4 * 3.0 + 0.6 * 7.0, 1e-14);
  EXPECT_NEAR(p(3, 1), 0.4 * 103.0 + 0.6 * 107.0, 1e-13);
  for (int64_t r = 0; r < 12; ++r)
    EXPECT_EQ(p(r, 0), p(12 + r, 0)) << r;
}

TEST(Qwen3VlVision, PatchCoordinatesFollowTheMergeWindows) {
  const GridThw g[2] = {{1, 2, 4}, {2, 2, 2}};
  const auto c = vision_patch_coordinates(g, 2);
  ASSERT_EQ(c.size(), 16u);
  const std::pair<int64_t, int64_t> first[8] = {{0, 0}, {0, 1}, {1, 0}, {1, 1},
                                                {0, 2}, {0, 3}, {1, 2}, {1, 3}};
  for (int i = 0; i < 8; ++i)
    EXPECT_EQ(c[static_cast<size_t>(i)], first[i]) << i;
  for (int i = 0; i < 4; ++i)  // each frame of the video starts over at (0, 0)
    EXPECT_EQ(c[static_cast<size_t>(8 + i)], c[static_cast<size_t>(12 + i)]);
}

TEST(Qwen3VlVision, LayerNormByHand) {
  Matrix x(1, 4);
  x.data = {1.0, 2.0, 3.0, 6.0};  // mean 3, biased variance (4 + 1 + 0 + 9) / 4 = 3.5
  const std::vector<double> w = {1.0, 2.0, 1.0, 0.5};
  const std::vector<double> b = {0.0, 0.0, 1.0, -1.0};
  const Matrix y = layer_norm(x, w, b, 0.5);  // sqrt(3.5 + 0.5) = 2
  EXPECT_DOUBLE_EQ(y(0, 0), -1.0);
  EXPECT_DOUBLE_EQ(y(0, 1), -1.0);
  EXPECT_DOUBLE_EQ(y(0, 2), 1.0);
  EXPECT_DOUBLE_EQ(y(0, 3), -0.25);  // 1.5 * 0.5 - 1
}

Json vision_config() {
  return Json::parse(R"({"deepstack_visual_indexes": [5, 11, 17], "depth": 24,
    "hidden_act": "gelu_pytorch_tanh", "hidden_size": 1024, "in_channels": 3,
    "intermediate_size": 4096, "model_type": "qwen3_vl", "num_heads": 16,
    "num_position_embeddings": 2304, "out_hidden_size": 2048, "patch_size": 16,
    "spatial_merge_size": 2, "temporal_patch_size": 2,
    "rope_parameters": {"rope_theta": 10000.0, "rope_type": "axial"}})");
}

TEST(Qwen3VlVision, ConfigOfTheReleased2B) {
  const VisionConfig c = parse_vision_config(vision_config(), "vision_config");
  EXPECT_EQ(c.grid_side(), 48);
  EXPECT_EQ(c.head_dim(), 64);
  EXPECT_EQ(c.patch_dim(), 3 * 2 * 16 * 16);
  EXPECT_EQ(c.deepstack_indexes, (std::vector<int64_t>{5, 11, 17}));
  EXPECT_EQ(c.rope_theta, 10000.0);
}

TEST(Qwen3VlVision, ConfigRefusalsNameTheKey) {
  Json j = vision_config();
  j["num_position_embeddings"] = 2300;
  EXPECT_NE(error_of([&] { parse_vision_config(j, "vc"); }).find("is not a square"),
            std::string::npos);
  j = vision_config();
  j["deepstack_visual_indexes"] = {5, 24};
  EXPECT_NE(error_of([&] { parse_vision_config(j, "vc"); }).find("block 24 is out of range"),
            std::string::npos);
  j = vision_config();
  j["hidden_act"] = "quick_gelu";
  EXPECT_NE(error_of([&] { parse_vision_config(j, "vc"); }).find("'hidden_act'"),
            std::string::npos);
  j = vision_config();
  j["num_heads"] = 32;  // head dim 32: fine; 1024 / 512 = 2 is not divisible by 4
  EXPECT_NO_THROW(parse_vision_config(j, "vc"));
  j["num_heads"] = 512;
  EXPECT_NE(error_of([&] { parse_vision_config(j, "vc"); }).find("divisible by 4"),
            std::string::npos);
  j = vision_config();
  j.erase("depth");
  EXPECT_NE(error_of([&] { parse_vision_config(j, "vc"); }).find("'depth'"), std::string::npos);
}

}  // namespace
}  // namespace qparity::reference
