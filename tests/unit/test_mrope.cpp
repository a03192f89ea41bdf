// Qwen3-VL's multimodal rotary positions and interleaved frequency rows, worked by hand from
// transformers' get_rope_index / apply_interleaved_mrope.
#include <gtest/gtest.h>

#include <cmath>

#include "error_of.h"
#include "reference_cpu/layers/mrope.h"
#include "reference_cpu/layers/rope.h"

namespace qparity::reference {
namespace {

using test::error_of;

constexpr int64_t kImg = 9, kStart = 7, kEnd = 8;

TEST(Mrope, TextImageTextPositionsAndDelta) {
  // text text <vision_start> [2 x 2 merged image: 4 placeholders] <vision_end> text
  const std::vector<int64_t> tokens = {1, 2, kStart, kImg, kImg, kImg, kImg, kEnd, 3};
  const GridThw grid{1, 4, 4};
  const MropePositions p = mrope_positions(tokens, kImg, {&grid, 1}, 2);
  EXPECT_EQ(p.t, (std::vector<int64_t>{0, 1, 2, 3, 3, 3, 3, 5, 6}));
  EXPECT_EQ(p.h, (std::vector<int64_t>{0, 1, 2, 3, 3, 4, 4, 5, 6}));
  EXPECT_EQ(p.w, (std::vector<int64_t>{0, 1, 2, 3, 4, 3, 4, 5, 6}));
  EXPECT_EQ(p.delta, 7 - 9);  // decode step 9 gets position 9 + delta = 7
}

TEST(Mrope, TwoImagesAndAWideGrid) {
  // An image first (no text before it), then a 1 x 3 merged grid.
  const std::vector<int64_t> tokens = {kImg, kImg, kImg, kImg, kEnd, kStart, kImg, kImg, kImg};
  const GridThw grids[2] = {{1, 4, 4}, {1, 2, 6}};
  const MropePositions p = mrope_positions(tokens, kImg, grids, 2);
  // The first image's largest position is 1: its text continues at 2, 3 and the second image
  // starts at 2 + 2 (st_idx + text_len).
  EXPECT_EQ(p.t, (std::vector<int64_t>{0, 0, 0, 0, 2, 3, 4, 4, 4}));
  EXPECT_EQ(p.h, (std::vector<int64_t>{0, 0, 1, 1, 2, 3, 4, 4, 4}));
  EXPECT_EQ(p.w, (std::vector<int64_t>{0, 1, 0, 1, 2, 3, 4, 5, 6}));
  EXPECT_EQ(p.delta, 7 - 9);
}

TEST(Mrope, TextOnlyIsTheOneDimensionalPositions) {
  const std::vector<int64_t> tokens = {4, 5, 6};
  const MropePositions p = mrope_positions(tokens, kImg, {}, 2);
  EXPECT_EQ(p.t, (std::vector<int64_t>{0, 1, 2}));
  EXPECT_EQ(p.h, p.t);
  EXPECT_EQ(p.w, p.t);
  EXPECT_EQ(p.delta, 0);
}

TEST(Mrope, PlaceholderRunsMustMatchTheirGrids) {
  const GridThw grid{1, 4, 4};
  const std::vector<int64_t> short_run = {1, kImg, kImg, kImg, 2};
  EXPECT_NE(error_of([&] {
              mrope_positions(short_run, kImg, {&grid, 1}, 2);
            }).find("image 0's placeholder run is 3 tokens, not the 4"),
            std::string::npos);
  const std::vector<int64_t> long_run = {kImg, kImg, kImg, kImg, kImg};
  EXPECT_NE(error_of([&] {
              mrope_positions(long_run, kImg, {&grid, 1}, 2);
            }).find("longer than"),
            std::string::npos);
  const std::vector<int64_t> none = {1, 2};
  EXPECT_NE(error_of([&] {
              mrope_positions(none, kImg, {&grid, 1}, 2);
            }).find("has no placeholder run"),
            std::string::npos);
  const std::vector<int64_t> extra = {kImg, kImg, kImg, kImg, 3, kImg};
  EXPECT_NE(error_of([&] {
              mrope_positions(extra, kImg, {&grid, 1}, 2);
            }).find("token 5: an image placeholder with no image grid left"),
            std::string::npos);
}

TEST(Mrope, EachImageMustOpenWithItsVisionStartToken) {
  const GridThw grids[2] = {{1, 4, 4}, {1, 2, 4}};
  const std::vector<int64_t> good = {1, kStart, kImg, kImg, kImg, kImg, kEnd, kStart, kImg, kImg};
  EXPECT_EQ(mrope_positions(good, kImg, grids, 2, kStart).t,
            mrope_positions(good, kImg, grids, 2).t);
  // The second run follows vision_end, not vision_start: transformers 4.57 would not count it.
  const std::vector<int64_t> bad = {1, kStart, kImg, kImg, kImg, kImg, kEnd, kImg, kImg};
  EXPECT_NE(error_of([&] {
              mrope_positions(bad, kImg, grids, 2, kStart);
            }).find("token 7: image 1's placeholder run must directly follow the vision_start"),
            std::string::npos);
  const std::vector<int64_t> first = {kImg, kImg, kImg, kImg};
  EXPECT_NE(error_of([&] {
              mrope_positions(first, kImg, {grids, 1}, 2, kStart);
            }).find("token 0"),
            std::string::npos);
}

TEST(Mrope, InterleavedFrequencyRowsOfTheReleasedSections) {
  const std::vector<int64_t> sections = {24, 20, 20};
  const std::vector<int> rows = mrope_frequency_rows(64, sections);
  int counts[3] = {0, 0, 0};
  for (int r : rows)
    ++counts[r];
  EXPECT_EQ(counts[0], 24);
  EXPECT_EQ(counts[1], 20);
  EXPECT_EQ(counts[2], 20);
  EXPECT_EQ(rows[0], 0);
  EXPECT_EQ(rows[1], 1);
  EXPECT_EQ(rows[2], 2);
  EXPECT_EQ(rows[58], 1);
  EXPECT_EQ(rows[59], 2);
  for (int i : {57, 60, 61, 62, 63})
    EXPECT_EQ(rows[static_cast<size_t>(i)], 0) << i;
  // Sections longer than the frequencies stop at them (the fixture's [11, 11, 10] over 4).
  EXPECT_EQ(mrope_frequency_rows(4, std::vector<int64_t>{11, 11, 10}),
            (std::vector<int>{0, 1, 2, 0}));
}

ModelConfig mrope_config() {
  ModelConfig c;
  c.head_dim = 16;
  c.rotary_dim = 16;
  c.rope_theta = 5000000.0;
  return c;
}

Matrix values(int64_t rows, int64_t cols) {
  Matrix x(rows, cols);
  for (int64_t i = 0; i < rows * cols; ++i)
    x.data[static_cast<size_t>(i)] = std::sin(0.7 * static_cast<double>(i) + 0.1);
  return x;
}

TEST(Mrope, EqualRowsRotateExactlyAsOneDimensionalRope) {
  const Rope rope(mrope_config());
  const std::vector<int64_t> tokens = {3, 1, 4, 1, 5};
  const MropePositions p = mrope_positions(tokens, kImg, {}, 2);
  Matrix a = values(5, 32), b = a;
  rope.apply_mrope(a, 2, p, mrope_frequency_rows(8, std::vector<int64_t>{3, 3, 2}));
  rope.apply(b, 2, p.t);
  EXPECT_EQ(a.data, b.data);
}

TEST(Mrope, EachFrequencyReadsItsRow) {
  // t = 2, h = 5, w = 7 for one token: frequency i rotates the pair (i, i + 8) by the angle of
  // its row's position, as 1-D RoPE at that position rotates it.
  const Rope rope(mrope_config());
  MropePositions p;
  p.t = {2};
  p.h = {5};
  p.w = {7};
  const std::vector<int> rows = mrope_frequency_rows(8, std::vector<int64_t>{3, 3, 2});
  Matrix x = values(1, 16);
  rope.apply_mrope(x, 1, p, rows);
  for (int64_t pos : {2, 5, 7}) {
    Matrix y = values(1, 16);
    rope.apply(y, 1, std::vector<int64_t>{pos});
    for (size_t i = 0; i < 8; ++i) {
      const int64_t want = rows[i] == 0 ? 2 : rows[i] == 1 ? 5 : 7;
      if (want != pos) continue;
      EXPECT_EQ(x.data[i], y.data[i]) << "frequency " << i << " at " << pos;
      EXPECT_EQ(x.data[i + 8], y.data[i + 8]) << "frequency " << i << " at " << pos;
    }
  }
  EXPECT_EQ(rows, (std::vector<int>{0, 1, 2, 0, 1, 2, 0, 1}));
}

}  // namespace
}  // namespace qparity::reference
