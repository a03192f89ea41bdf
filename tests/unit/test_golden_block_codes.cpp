// Block-scaled activation codes (MX, fp8-block, NVFP4) compare on code x block scale: a block whose
// scale moved by a power of two (every code rescaled, the values it stands for unchanged up to
// rounding) weighs what it changes, while its codes are still counted as mismatches; a wrong code
// still shows in the float metrics; per-token codes compare as codes.
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <string>
#include <vector>

#include "golden/compare.h"
#include "golden/golden_file.h"
#include "scratch_dir.h"
#include "test_seed.h"

namespace qparity::golden {
namespace {

namespace fs = std::filesystem;

constexpr int64_t kRows = 4, kCols = 64, kBlock = 32;

Golden with_codes(const std::vector<double>& codes, const std::vector<double>& scales,
                  int64_t scale_cols) {
  Golden g;
  g.meta.producer_version = "test";
  g.meta.model = "m";
  g.meta.architecture = "LlamaForCausalLM";
  g.meta.model_config_hash = std::string(64, 'a');
  g.meta.checkpoint_hash = std::string(64, 'b');
  g.meta.scheme = "mxfp8";
  g.meta.dialect = "vllm";
  g.meta.precision_mode = "emulate";
  g.meta.input_set = "synthetic:2x2:seed=1";
  g.meta.device = "cpu-reference";
  g.sequences = 2;
  g.seq_len = 2;
  g.tokens = {5, 1, 4, 2};
  g.targets = {1, -1, 2, -1};
  g.points.push_back({"layers.0.mlp.down_proj.x_values", Array2D{kRows, kCols, codes}});
  g.points.push_back({"layers.0.mlp.down_proj.x_scales", Array2D{kRows, scale_cols, scales}});
  g.logits = Array2D{kRows, 3, {0.5, 1, 2, 0.5, 1, 2, 0.5, 1, 2, 0.5, 1, 2}};
  g.target_logprobs = {-1.5, std::nan(""), -0.5, std::nan("")};
  g.sequence_nll = {1.5, 0.5};
  g.sequence_ppl = {std::exp(1.5), std::exp(0.5)};
  return g;
}

fs::path file(const std::string& name) {
  return test::scratch_dir("qparity_block_codes") / name;
}

PointStats point_stats(const Golden& a, const Golden& b, const std::string& tag,
                       const std::string& point) {
  const fs::path fa = file(tag + ".golden.h5"), fb = file(tag + ".candidate.h5");
  write_golden(fa, a, OverwritePolicy::kReplace);
  write_golden(fb, b, OverwritePolicy::kReplace);
  const CompareReport r =
      compare_goldens(GoldenReader::open(fa), GoldenReader::open(fb), CompareOptions{});
  for (const auto& p : r.points)
    if (p.name == point) return p.stats;
  ADD_FAILURE() << "no " << point << " point compared";
  return {};
}

PointStats codes_stats(const Golden& a, const Golden& b, const std::string& tag) {
  return point_stats(a, b, tag, "layers.0.mlp.down_proj.x_values");
}

TEST(GoldenBlockCodes, ARescaledBlockWeighsWhatItChangesAndItsCodesStillCount) {
  std::vector<double> codes(kRows * kCols), scales(kRows * (kCols / kBlock));
  for (size_t i = 0; i < codes.size(); ++i)
    codes[i] = static_cast<double>(static_cast<int>(i % 29) - 14) * 2.0;  // even: halving exact
  for (size_t i = 0; i < scales.size(); ++i)
    scales[i] = i % 2 ? 0.25 : 0.5;
  const Golden g = with_codes(codes, scales, kCols / kBlock);
  // Row 1's second block: scale doubled, codes halved - the same values.
  std::vector<double> c2 = codes, s2 = scales;
  for (int64_t k = kBlock; k < kCols; ++k)
    c2[static_cast<size_t>(kCols + k)] /= 2.0;
  s2[3] *= 2.0;
  const PointStats same = codes_stats(g, with_codes(c2, s2, kCols / kBlock), "rescaled");
  EXPECT_EQ(same.rel_l2, 0.0) << "code x scale is unchanged";
  EXPECT_TRUE(same.integer_codes);
  EXPECT_GT(same.mismatches, 20) << "the block's codes still count as moved";
  // A wrong code shows in the float metrics.
  std::vector<double> c3 = codes;
  c3[5] += 6.0;
  const PointStats wrong = codes_stats(g, with_codes(c3, scales, kCols / kBlock), "wrong");
  EXPECT_GT(wrong.rel_l2, 1e-3);
  EXPECT_EQ(wrong.mismatches, 1);
  // Per-token scales (one column): codes compare as codes, a rescaled row is a large change.
  std::vector<double> tok(kRows, 0.5), tok2 = tok, c4 = codes;
  tok2[1] = 1.0;
  for (int64_t k = 0; k < kCols; ++k)
    c4[static_cast<size_t>(kCols + k)] /= 2.0;
  const PointStats per_token =
      codes_stats(with_codes(codes, tok, 1), with_codes(c4, tok2, 1), "per_token");
  EXPECT_GT(per_token.rel_l2, 0.1);
}

// Scales compare at fp32, the precision engines hold them in: the reference's NVFP4 scale
// s / gs_in (an fp64 quotient) against the engine's fl32(s / gs_in) is no mismatch; one fp32 ULP
// off is one.
TEST(GoldenBlockCodes, ScalesCompareAtFp32) {
  std::vector<double> codes(kRows * kCols, 1.0), scales(kRows * (kCols / 16));
  for (size_t i = 0; i < scales.size(); ++i)
    scales[i] = (1.0 + static_cast<double>(i)) * 0.125 / 2687.9999;  // not fp32 values
  std::vector<double> f32 = scales;
  for (double& v : f32)
    v = static_cast<double>(static_cast<float>(v));
  ASSERT_NE(f32, scales);
  const Golden g = with_codes(codes, scales, kCols / 16);
  const std::string point = "layers.0.mlp.down_proj.x_scales";
  EXPECT_EQ(point_stats(g, with_codes(codes, f32, kCols / 16), "f32", point).mismatches, 0);
  f32[2] = static_cast<double>(std::nextafter(static_cast<float>(f32[2]), 1.f));
  EXPECT_EQ(point_stats(g, with_codes(codes, f32, kCols / 16), "ulp", point).mismatches, 1);
}

}  // namespace
}  // namespace qparity::golden
