// The engine's host-side logic, which needs no device, so it runs in CI too: the fused greedy
// argmax's 64-bit key (skinny_gemm.h), whose order must be launch_argmax's on every float; the
// q / k row re-layout for partial RoPE (rope_layout.h) on Qwen3.5's gated q_proj and q/k norms.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdint>
#include <limits>
#include <vector>

#include "../unit/test_seed.h"
#include "core/config/model_config.h"
#include "core/safetensors/chatglm_names.h"
#include "fixtures/fixture_model.h"
#include "gpu_engine/kernels/skinny_gemm.h"
#include "gpu_engine/rope_layout.h"

namespace qparity {
namespace {

// launch_argmax's order: larger value first, ties (-0 == +0 included) to the lowest index.
bool better(float a, uint32_t ia, float b, uint32_t ib) {
  return a > b || (a == b && ia < ib);
}

TEST(FusedArgmaxKey, OrdersEveryFloatClassAsTheArgmaxKernel) {
  const float inf = std::numeric_limits<float>::infinity();
  std::vector<float> v = {-inf, -3.4e38f, -1.5f,  -1.0f, -1e-38f, -1e-45f, -0.0f,
                          0.0f, 1e-45f,   1e-38f, 1.0f,  1.5f,    3.4e38f, inf};
  for (const float a : v)
    for (const float b : v)
      for (const uint32_t ia : {0u, 1u, 7u, 151935u})
        for (const uint32_t ib : {0u, 2u, 7u, 4000000000u}) {
          if (ia == ib) continue;
          EXPECT_EQ(gpu::argmax_key(a, ia) > gpu::argmax_key(b, ib), better(a, ia, b, ib))
              << a << "@" << ia << " vs " << b << "@" << ib;
        }
  // NaN (any payload, either sign) outranks every number and decodes to -1.
  for (const uint32_t bits : {0x7fc00000u, 0xffc00000u, 0x7f800001u, 0xffffffffu}) {
    const float nan = std::bit_cast<float>(bits);
    EXPECT_GT(gpu::argmax_key(nan, 5), gpu::argmax_key(inf, 0));
    EXPECT_EQ(gpu::argmax_id(gpu::argmax_key(nan, 5)), -1);
  }
  EXPECT_EQ(gpu::argmax_id(0), -1);  // a key no block set
  for (const uint32_t i : {0u, 1u, 151935u, 1u << 30})
    EXPECT_EQ(gpu::argmax_id(gpu::argmax_key(-inf, i)), static_cast<int32_t>(i));
}

// Monotone over the float line: every float whose low 12 bits are zero, and its two neighbours,
// in numeric order, map to non-decreasing value bits, strictly increasing except across -0 / +0.
TEST(FusedArgmaxKey, ValueBitsAreMonotoneOverTheFloatLine) {
  std::vector<float> line;
  for (uint64_t hi = 0; hi < (uint64_t{1} << 20); ++hi)
    for (const int d : {-1, 0, 1}) {
      const int64_t bits = static_cast<int64_t>(hi << 12) + d;
      if (bits < 0 || bits > 0xffffffffll) continue;
      const float f = std::bit_cast<float>(static_cast<uint32_t>(bits));
      if (!std::isnan(f)) line.push_back(f);
    }
  std::sort(line.begin(), line.end());
  line.erase(std::unique(line.begin(), line.end(),
                         [](float a, float b) {
                           return std::bit_cast<uint32_t>(a) == std::bit_cast<uint32_t>(b);
                         }),
             line.end());
  ASSERT_GT(line.size(), size_t{3100000});
  for (size_t i = 1; i < line.size(); ++i) {
    const uint64_t a = gpu::argmax_key(line[i - 1], 0) >> 32, b = gpu::argmax_key(line[i], 0) >> 32;
    if (line[i - 1] == line[i])  // -0 and +0
      EXPECT_EQ(a, b);
    else
      ASSERT_LT(a, b) << line[i - 1] << " vs " << line[i];
  }
}

// Qwen3.5: RoPE on the first rotary_dim = head_dim / 4 dims (rotate-half pairs), run on the
// kernels' (i, i + head_dim / 2) pairs by re-laying each head's q / k rows out. q_proj's rows are
// per head [q (d) | gate (d)]: only the q rows move, the gate rows stay; the q / k norm weights
// ([d], applied before RoPE) move with the dims. Checked row by row against rope_positions.
TEST(RopeRelayout, GatedQProjMovesItsQRowsAndTheNormWeightsFollow) {
  namespace fs = std::filesystem;
  const fs::path dir =
      fs::temp_directory_path() / ("qparity_relayout_" + std::to_string(test::test_seed()));
  fixtures::FixtureSpec spec;
  spec.arch = fixtures::parse_fixture_arch("qwen3.5");
  spec.seed = 5;
  fixtures::write_fp_checkpoint(spec, dir, OverwritePolicy::kReplace);
  const ModelConfig cfg = load_model_config(dir / "config.json");
  ASSERT_TRUE(cfg.attn_output_gate);
  ASSERT_TRUE(gpu::needs_rope_relayout(cfg)) << "partial rotary";
  const Checkpoint raw = open_model_checkpoint(dir, cfg);
  const Checkpoint out = gpu::relayout_rope_rows(open_model_checkpoint(dir, cfg), cfg);
  const std::vector<int64_t> pos = gpu::rope_positions(cfg);
  const int64_t d = cfg.head_dim;
  int64_t layer = 0;
  while (cfg.is_linear_attention_layer(layer))
    ++layer;
  const std::string p = "model.layers." + std::to_string(layer) + ".self_attn.";
  const auto rows_of = [](const Checkpoint& ck, const std::string& name) {
    const auto b = ck.at(name).bytes();
    return std::vector<uint8_t>(b.begin(), b.end());
  };
  {
    const auto in = rows_of(raw, p + "q_proj.weight"), re = rows_of(out, p + "q_proj.weight");
    const size_t row = in.size() / static_cast<size_t>(2 * cfg.q_size());
    int64_t moved = 0;
    for (int64_t r = 0; r < 2 * cfg.q_size(); ++r) {
      const int64_t w = r % (2 * d);
      const int64_t to = r - w + (w < d ? pos[static_cast<size_t>(w)] : w);
      moved += to != r;
      EXPECT_TRUE(
          std::equal(in.begin() + r * row, in.begin() + (r + 1) * row, re.begin() + to * row))
          << "q_proj row " << r;
    }
    EXPECT_GT(moved, 0);
  }
  for (const char* norm : {"q_norm.weight", "k_norm.weight"}) {
    const auto in = rows_of(raw, p + norm), re = rows_of(out, p + norm);
    const size_t e = in.size() / static_cast<size_t>(d);
    for (int64_t j = 0; j < d; ++j)
      EXPECT_TRUE(std::equal(in.begin() + j * e, in.begin() + (j + 1) * e,
                             re.begin() + pos[static_cast<size_t>(j)] * e))
          << norm << " dim " << j;
  }
  fs::remove_all(dir);
}

// A quantized Qwen3.5's q / k rows stay in the checkpoint's order and the decoder gathers its
// qkv output into the kernels' row by kernel_qkv_sources; the bf16 loader moves weight rows
// instead (relayout_rope_rows, then q_proj's per-head [q | gate] split, gate rows after v). Both
// must give every kernel column the same checkpoint row: checked byte for byte on the rows.
TEST(RopeRelayout, QuantizedQwen35GathersTheRowsTheBf16LoaderMoves) {
  namespace fs = std::filesystem;
  const fs::path dir =
      fs::temp_directory_path() / ("qparity_relayout_gather_" + std::to_string(test::test_seed()));
  fixtures::FixtureSpec spec;
  spec.arch = fixtures::parse_fixture_arch("qwen3.5");
  spec.seed = 5;
  fixtures::write_fp_checkpoint(spec, dir, OverwritePolicy::kReplace);
  const ModelConfig cfg = load_model_config(dir / "config.json");
  const Checkpoint raw = open_model_checkpoint(dir, cfg);
  const Checkpoint moved = gpu::relayout_rope_rows(open_model_checkpoint(dir, cfg), cfg);
  const Checkpoint norms_only =
      gpu::relayout_rope_rows(open_model_checkpoint(dir, cfg), cfg, false);
  int64_t layer = 0;
  while (cfg.is_linear_attention_layer(layer))
    ++layer;
  const std::string p = "model.layers." + std::to_string(layer) + ".self_attn.";
  const auto bytes_of = [](const Checkpoint& ck, const std::string& name) {
    const auto b = ck.at(name).bytes();
    return std::vector<uint8_t>(b.begin(), b.end());
  };
  // Rows of [q_proj | k_proj | v_proj] (the fused projection's output order).
  const auto fused_rows = [&](const Checkpoint& ck) {
    std::vector<uint8_t> all;
    for (const char* proj : {"q_proj.weight", "k_proj.weight", "v_proj.weight"}) {
      const auto b = bytes_of(ck, p + proj);
      all.insert(all.end(), b.begin(), b.end());
    }
    return all;
  };
  const int64_t d = cfg.head_dim, q = cfg.q_size(), kv = cfg.kv_size();
  const std::vector<uint8_t> raw_rows = fused_rows(raw), moved_rows = fused_rows(moved);
  EXPECT_EQ(fused_rows(norms_only), raw_rows) << "projection rows stay in the checkpoint's order";
  for (const char* norm : {"q_norm.weight", "k_norm.weight"})
    EXPECT_EQ(bytes_of(norms_only, p + norm), bytes_of(moved, p + norm)) << norm << " still moves";
  const size_t row = raw_rows.size() / static_cast<size_t>(2 * q + 2 * kv);
  // The bf16 loader's row r of [q | k | v | gate] (bf16_model_loader.cpp), in `moved`.
  const auto bf16_row = [&](int64_t r) {
    int64_t from = 0;
    if (r < q)
      from = (r / d) * 2 * d + r % d;
    else if (r < q + 2 * kv)
      from = q + r;  // k and v follow q_proj's 2q rows
    else
      from = ((r - q - 2 * kv) / d) * 2 * d + d + (r - q - 2 * kv) % d;
    return moved_rows.begin() + from * static_cast<int64_t>(row);
  };
  const std::vector<int32_t> sources = gpu::kernel_qkv_sources(cfg);
  ASSERT_EQ(static_cast<int64_t>(sources.size()), 2 * q + 2 * kv);
  int64_t reordered = 0;
  for (int64_t r = 0; r < 2 * q + 2 * kv; ++r) {
    const auto src = raw_rows.begin() + sources[static_cast<size_t>(r)] * static_cast<int64_t>(row);
    EXPECT_TRUE(std::equal(src, src + static_cast<int64_t>(row), bf16_row(r)))
        << "kernel row " << r;
    reordered += sources[static_cast<size_t>(r)] != r;
  }
  EXPECT_GT(reordered, 0);
  fs::remove_all(dir);
}

}  // namespace
}  // namespace qparity
