// The tensor-core weight-only tile layout (quant/weight_only_mma_layout.h) read back as the
// kernel reads it (kernels/weight_only_mma.cu) through PTX's m16n8k16 fragment map, written out
// here on its own: lane l = 4 g + c holds A elements i = 0..7 at row g + 8 ((i / 2) % 2) and mma
// k position 2c + (i % 2) + 8 (i / 4), register i / 2 the pair (i, i + 1); the kernel's column
// permutation puts k position 2c + e at memory column 4c + e and 2c + 8 + e at 4c + 2 + e. Every
// code of every (row, column), padding included, must come back; and the refusals. No device.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cstring>
#include <vector>

#include "../unit/error_of.h"
#include "gpu_engine/quant/weight_only_mma_layout.h"

namespace qparity {
namespace {

using gpu::MmaCodes;
using ::testing::HasSubstr;

// The signed code (int4 / int8) or byte (e4m3) that element i of lane `lane`'s A fragment holds
// at step s of chunk q of row tile t, read from the packed bytes as the kernel reads them.
int fragment_code(const gpu::MmaPackedWeight& p, int64_t t, int64_t q, int lane, int s, int i) {
  const int64_t chunk = gpu::weight_only_mma_chunk(p.codes), chunks = (p.k + chunk - 1) / chunk;
  uint32_t words[4];
  std::memcpy(words, p.code_bytes.data() + ((t * chunks + q) * 32 + lane) * 16, 16);
  const int reg = i / 2, half = i % 2;
  if (p.codes == MmaCodes::kInt4) {
    // Register j: nibbles j (low half) and j + 4 (high half) of the step's word.
    const uint32_t u = (words[s] >> (4 * (reg + 4 * half))) & 0xF;
    return static_cast<int>(u) - 8;
  }
  // Register j: bytes 2 (j % 2) + half of word 2s + j / 2.
  const uint32_t b = (words[2 * s + reg / 2] >> (8 * (2 * (reg % 2) + half))) & 0xFF;
  return p.codes == MmaCodes::kInt8 ? static_cast<int8_t>(b) : static_cast<int>(b);
}

void expect_every_code_comes_back(MmaCodes kind, int64_t n, int64_t k, int64_t group) {
  SCOPED_TRACE(std::to_string(static_cast<int>(kind)) + " n=" + std::to_string(n) +
               " k=" + std::to_string(k));
  std::vector<int8_t> q(static_cast<size_t>(n * k));
  for (int64_t r = 0; r < n; ++r)
    for (int64_t c = 0; c < k; ++c) {
      const int64_t v = (r * 7 + c * 3 + c / 64) % (kind == MmaCodes::kInt4 ? 16 : 256);
      q[static_cast<size_t>(r * k + c)] =
          static_cast<int8_t>(kind == MmaCodes::kInt4 ? v - 8 : v - 128);
    }
  const std::vector<double> scales(static_cast<size_t>(n * (k / group)), 0.5);
  const gpu::MmaPackedWeight p =
      gpu::pack_weight_only_mma(kind, n, k, group, q, scales, {}, true, "w");
  ASSERT_EQ(static_cast<int64_t>(p.code_bytes.size()), gpu::weight_only_mma_code_bytes(kind, n, k));
  const int64_t chunk = gpu::weight_only_mma_chunk(kind), chunks = (k + chunk - 1) / chunk;
  const int64_t tiles = gpu::weight_only_mma_rows(n) / 16;
  std::vector<int> seen(static_cast<size_t>(n * k), 0);
  for (int64_t t = 0; t < tiles; ++t)
    for (int64_t c0 = 0; c0 < chunks; ++c0)
      for (int lane = 0; lane < 32; ++lane)
        for (int s = 0; s < chunk / 16; ++s)
          for (int i = 0; i < 8; ++i) {
            const int g = lane / 4, c = lane % 4;
            const int64_t row = t * 16 + g + 8 * ((i / 2) % 2);
            const int kpos = 2 * c + i % 2 + 8 * (i / 4);
            const int64_t col =
                c0 * chunk + 16 * s + (kpos < 8 ? 4 * c + kpos % 2 : 4 * c + 2 + kpos % 2);
            const int got = fragment_code(p, t, c0, lane, s, i);
            if (row >= n || col >= k) {
              EXPECT_EQ(got, 0) << "padding at " << row << "," << col;
              continue;
            }
            const int8_t want = q[static_cast<size_t>(row * k + col)];
            EXPECT_EQ(got, kind == MmaCodes::kE4m3 ? static_cast<uint8_t>(want) : want)
                << "row " << row << " col " << col;
            ++seen[static_cast<size_t>(row * k + col)];
          }
  for (size_t i = 0; i < seen.size(); ++i)
    ASSERT_EQ(seen[i], 1) << "element " << i << " read " << seen[i] << " times";
}

TEST(WeightOnlyMmaLayout, EveryCodeReachesItsFragmentPosition) {
  expect_every_code_comes_back(MmaCodes::kInt4, 64, 1024, 64);
  expect_every_code_comes_back(MmaCodes::kInt4, 40, 96, 32);  // ragged rows and chunk
  expect_every_code_comes_back(MmaCodes::kInt8, 32, 8192, 32);
  expect_every_code_comes_back(MmaCodes::kInt8, 17, 80, 16);
  expect_every_code_comes_back(MmaCodes::kE4m3, 50, 320, 64);
}

TEST(WeightOnlyMmaLayout, ScalesAndZerosAreTiledPerSixteenRows) {
  const int64_t n = 40, k = 128, group = 32, groups = k / group;
  std::vector<double> s, z;
  for (int64_t r = 0; r < n; ++r)
    for (int64_t g = 0; g < groups; ++g) {
      s.push_back(0.25 * static_cast<double>(1 + r * groups + g));
      z.push_back(static_cast<double>((r + g) % 16 - 8));
    }
  const gpu::MmaPackedWeight p = gpu::pack_weight_only_mma(
      MmaCodes::kInt4, n, k, group, std::vector<int8_t>(static_cast<size_t>(n * k), 0), s, z, false,
      "w");
  ASSERT_EQ(static_cast<int64_t>(p.scales_f32.size()), 64 * groups);
  ASSERT_EQ(p.zeros.size(), p.scales_f32.size());
  for (int64_t r = 0; r < 64; ++r)
    for (int64_t g = 0; g < groups; ++g) {
      const size_t at = static_cast<size_t>(((r / 16) * groups + g) * 16 + r % 16);
      const size_t from = static_cast<size_t>(r * groups + g);
      EXPECT_EQ(p.scales_f32[at], r < n ? static_cast<float>(s[from]) : 0.f);
      EXPECT_EQ(p.zeros[at], r < n ? static_cast<int8_t>(z[from]) : 0);
    }
}

TEST(WeightOnlyMmaLayout, RefusesWhatTheKernelCannotRunByName) {
  EXPECT_THAT(gpu::weight_only_mma_refusal(MmaCodes::kInt4, 96, 24, {}), HasSubstr("group 24"));
  EXPECT_THAT(gpu::weight_only_mma_refusal(MmaCodes::kInt8, 40, 16, {}),
              HasSubstr("in_features 40"));
  EXPECT_THAT(gpu::weight_only_mma_refusal(MmaCodes::kInt4, 64, 32, {8.0}),
              HasSubstr("not an integer in [-8"));
  EXPECT_THAT(gpu::weight_only_mma_refusal(MmaCodes::kInt8, 64, 32, {0.5}),
              HasSubstr("zero point 0.5"));
  EXPECT_THAT(gpu::weight_only_mma_refusal(MmaCodes::kE4m3, 64, 32, {1.0}),
              HasSubstr("no zero points"));
  EXPECT_EQ(gpu::weight_only_mma_refusal(MmaCodes::kInt8, 64, 32, {-128.0, 127.0}), "");
  const std::vector<int8_t> q(64 * 32, 0);
  EXPECT_THAT(test::error_of([&] {
                gpu::pack_weight_only_mma(MmaCodes::kInt4, 32, 64, 32,
                                          std::vector<int8_t>(32 * 64, 9),
                                          std::vector<double>(64, 1.0), {}, false, "layers.3.q");
              }),
              HasSubstr("int4 code 9"));
  EXPECT_THAT(test::error_of([&] {
                gpu::pack_weight_only_mma(MmaCodes::kInt8, 32, 64, 32, q,
                                          std::vector<double>(64, static_cast<double>(0.1f)), {},
                                          true, "layers.3.q");
              }),
              HasSubstr("not a bf16 value"));
  EXPECT_THAT(test::error_of([&] {
                gpu::pack_weight_only_mma(MmaCodes::kInt8, 32, 64, 32, q,
                                          std::vector<double>(63, 1.0), {}, false, "layers.3.q");
              }),
              HasSubstr("layers.3.q"));
}

}  // namespace
}  // namespace qparity
