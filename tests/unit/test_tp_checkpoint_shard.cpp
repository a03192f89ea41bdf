// A tensor-parallel rank's shard of a checkpoint (schemes/parallel/checkpoint_shard.h) loaded by
// the reference's own loader with the rank's config (tp_rank_config): every linear of every rank,
// dequantized after the rank's own process_weights_after_loading, must be exactly the rows /
// columns of the whole model's dequantized weight that the rank holds (q / k / v and gate / up
// by their partitions, KV heads replicated past num_key_value_heads, o_proj / down by input
// columns, experts inside each expert), for bf16 and the quantized layouts: per-channel and
// group int (offsets, pack-quantized with its weight_shape), msModelSlim static W8A8 (quant_bias
// on rank 0 alone), fp8, NVFP4 (global scales whole), MoE experts. A partition that cuts a
// 128 x 128 fp8 block is refused naming the tensor.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cstring>

#include "../accuracy/accuracy_util.h"
#include "core/parallel/tp_sharding.h"
#include "error_of.h"
#include "golden/reference_run.h"
#include "reference_cpu/models/model_loader.h"
#include "schemes/parallel/checkpoint_shard.h"
#include "scratch_dir.h"

namespace qparity {
namespace {

namespace fs = std::filesystem;
using test::error_of;
using ::testing::AllOf;
using ::testing::HasSubstr;

struct Span {
  int64_t begin, len;
};

// The rows (`by_rows`) or columns of w listed in `spans`, in order.
Matrix pick(const Matrix& w, const std::vector<Span>& spans, bool by_rows) {
  int64_t n = 0;
  for (const Span& s : spans)
    n += s.len;
  Matrix out(by_rows ? n : w.rows, by_rows ? w.cols : n);
  int64_t at = 0;
  for (const Span& s : spans) {
    for (int64_t i = 0; i < s.len; ++i)
      for (int64_t j = 0; j < (by_rows ? w.cols : w.rows); ++j) {
        if (by_rows)
          out(at + i, j) = w(s.begin + i, j);
        else
          out(j, at + i) = w(j, s.begin + i);
      }
    at += s.len;
  }
  return out;
}

void expect_same(const Matrix& want, const Matrix& got, const std::string& what) {
  ASSERT_EQ(got.rows, want.rows) << what;
  ASSERT_EQ(got.cols, want.cols) << what;
  EXPECT_EQ(std::memcmp(got.data.data(), want.data.data(), want.data.size() * sizeof(double)), 0)
      << what << ": the rank's dequantized weight is not the whole model's slice";
}

std::unique_ptr<reference::CausalLm> load(std::shared_ptr<const Checkpoint> ck, const fs::path& dir,
                                          const ModelConfig& cfg) {
  QuantPlan plan = build_quant_plan(cfg, dir, std::nullopt);
  return reference::load_model(std::move(ck), cfg, std::move(plan), Dialect::kVllm,
                               reference::PrecisionMode::kExact);
}

// Every rank of tp against the whole model.
void check_ranks(const fs::path& dir, int tp) {
  const ModelConfig cfg = load_model_config(dir / "config.json");
  const ModelConfig local = tp_rank_config(cfg, tp);
  auto full = std::make_shared<const Checkpoint>(Checkpoint::open(dir));
  const QuantPlan plan = build_quant_plan(cfg, dir, std::nullopt);
  const auto whole = load(full, dir, cfg);
  const int64_t q = cfg.q_size(), kv = cfg.kv_size();
  const int64_t ql = local.q_size(), kvl = local.kv_size(), il = local.intermediate,
                mil = local.moe_intermediate_size;
  for (int r = 0; r < tp; ++r) {
    SCOPED_TRACE("rank " + std::to_string(r) + " of tp " + std::to_string(tp));
    auto shard = std::make_shared<const Checkpoint>(shard_checkpoint(*full, cfg, plan, r, tp));
    const auto part = load(shard, dir, local);
    const int64_t head = cfg.num_kv_heads >= tp ? r : r / (tp / cfg.num_kv_heads);
    for (size_t l = 0; l < whole->layers().size(); ++l) {
      const reference::DecoderLayer& w = whole->layers()[l];
      const reference::DecoderLayer& p = part->layers()[l];
      const std::string at = "layer " + std::to_string(l);
      expect_same(pick(w.attn.qkv->dequantized_weight(),
                       {{r * ql, ql}, {q + head * kvl, kvl}, {q + kv + head * kvl, kvl}}, true),
                  p.attn.qkv->dequantized_weight(), at + " qkv");
      expect_same(pick(w.attn.o_proj->dequantized_weight(), {{r * ql, ql}}, false),
                  p.attn.o_proj->dequantized_weight(), at + " o_proj");
      if (w.mlp) {
        expect_same(pick(w.mlp->gate_up->dequantized_weight(),
                         {{r * il, il}, {cfg.intermediate + r * il, il}}, true),
                    p.mlp->gate_up->dequantized_weight(), at + " gate_up");
        expect_same(pick(w.mlp->down->dequantized_weight(), {{r * il, il}}, false),
                    p.mlp->down->dequantized_weight(), at + " down");
      }
      if (w.moe) {
        expect_same(w.moe->router->dequantized_weight(), p.moe->router->dequantized_weight(),
                    at + " router");
        for (int64_t e = 0; e < cfg.num_experts; ++e) {
          const std::string ex = at + " expert " + std::to_string(e);
          expect_same(pick(w.moe->w13->dequantized_weight(e),
                           {{r * mil, mil}, {cfg.moe_intermediate_size + r * mil, mil}}, true),
                      p.moe->w13->dequantized_weight(e), ex + " w13");
          expect_same(pick(w.moe->w2->dequantized_weight(e), {{r * mil, mil}}, false),
                      p.moe->w2->dequantized_weight(e), ex + " w2");
        }
      }
    }
  }
}

fs::path quantized(const fs::path& root, const std::string& arch, const std::string& scheme) {
  const fs::path fp = test::tiny_checkpoint(root, arch, "bf16", 11);
  if (scheme == "bf16") return fp;
  const fs::path out = root / (arch + "." + scheme);
  if (fs::exists(out)) return out;
  const ModelConfig cfg = load_model_config(fp / "config.json");
  fixtures::quantize_checkpoint(
      fp, parse_scheme_id(scheme), Dialect::kVllm, out,
      fixtures::calibrate_checkpoint(fp, reference::synthetic_tokens(16, cfg.vocab, 11)),
      OverwritePolicy::kRefuse, nullptr);
  return out;
}

TEST(TpCheckpointShard, EveryRankLoadsTheSlicesOfTheWholeModelsWeights) {
  const fs::path root = test::scratch_dir("qparity_tp_shard") / "tp_shard";
  for (const std::string scheme : {"bf16", "w8a16-ch", "w4a16-g32", "w8a8-static", "w8a8-int8-dyn",
                                   "fp8-channel", "fp8-tensor", "nvfp4"}) {
    for (const std::string arch : {"llama", "qwen3-moe"}) {
      SCOPED_TRACE(arch + " " + scheme);
      const fs::path dir = quantized(root, arch, scheme);
      // tiny: 4 q heads, 2 KV heads (tp 4 replicates them), intermediate 256, experts' 128.
      for (const int tp : {1, 2, 4}) {
        if (tp == 4 && scheme != "bf16" && scheme != "w8a16-ch" && scheme != "w4a16-g32") continue;
        check_ranks(dir, tp);
      }
    }
  }
}

TEST(TpCheckpointShard, TermsAddedOnceAreOnRankZeroAlone) {
  const fs::path root = test::scratch_dir("qparity_tp_shard") / "tp_shard_bias";
  const fs::path dir = quantized(root, "llama", "w8a8-static");
  const ModelConfig cfg = load_model_config(dir / "config.json");
  const Checkpoint full = Checkpoint::open(dir);
  const QuantPlan plan = build_quant_plan(cfg, dir, std::nullopt);
  const std::string name = "model.layers.0.self_attn.o_proj.quant_bias";
  const auto whole = full.at(name).bytes();
  bool nonzero = false;
  for (const uint8_t b : whole)
    nonzero = nonzero || b != 0;
  ASSERT_TRUE(nonzero)
      << "the fixture's quant_bias must not be all zeros for this test to mean anything";
  for (int r = 0; r < 2; ++r) {
    const Checkpoint s = shard_checkpoint(full, cfg, plan, r, 2);
    const auto got = s.at(name).bytes();
    ASSERT_EQ(got.size(), whole.size());
    if (r == 0)
      EXPECT_EQ(std::memcmp(got.data(), whole.data(), got.size()), 0);
    else
      EXPECT_TRUE(std::all_of(got.begin(), got.end(), [](uint8_t b) { return b == 0; }));
    // Column-parallel: quant_bias travels with the rows.
    EXPECT_EQ(s.at("model.layers.0.self_attn.q_proj.quant_bias").info->shape[0],
              static_cast<uint64_t>(cfg.q_size() / 2));
  }
}

TEST(TpCheckpointShard, RefusesAPartitionThatCutsAnFp8Block) {
  const fs::path root = test::scratch_dir("qparity_tp_shard") / "tp_shard_block";
  fixtures::QuantizeCheckpointOptions qo;
  qo.ignore_unsupported = true;  // tiny q / k / v partitions of 64 rows stay bf16
  const fs::path fp = test::tiny_checkpoint(root, "llama", "bf16", 11);
  const fs::path dir = root / "llama.fp8-block";
  const ModelConfig cfg = load_model_config(fp / "config.json");
  fixtures::quantize_checkpoint(
      fp, parse_scheme_id("fp8-block"), Dialect::kVllm, dir,
      fixtures::calibrate_checkpoint(fp, reference::synthetic_tokens(16, cfg.vocab, 11)),
      OverwritePolicy::kRefuse, nullptr, qo);
  const Checkpoint full = Checkpoint::open(dir);
  const QuantPlan plan = build_quant_plan(cfg, dir, std::nullopt);
  // tiny: o_proj [128, 128] is one block; a rank's 64 input columns are half of it.
  EXPECT_THAT(error_of([&] { shard_checkpoint(full, cfg, plan, 1, 2); }),
              AllOf(HasSubstr("o_proj.weight_scale"), HasSubstr("straddles rank 1")));
}

TEST(TpCheckpointShard, ShapesThatDoNotDivideAreRefusedByKey) {
  ModelConfig c;
  c.hidden = 64, c.num_heads = 6, c.num_kv_heads = 3, c.head_dim = 8, c.intermediate = 96;
  c.vocab = 100;
  EXPECT_THAT(error_of([&] { tp_rank_config(c, 4); }), HasSubstr("num_attention_heads 6"));
  c.num_heads = 8;
  EXPECT_THAT(error_of([&] { tp_rank_config(c, 4); }),
              HasSubstr("not a multiple of num_key_value_heads 3"));
  c.num_kv_heads = 2;
  c.intermediate = 90;
  EXPECT_THAT(error_of([&] { tp_rank_config(c, 4); }), HasSubstr("intermediate_size 90"));
  c.intermediate = 96;
  const ModelConfig r = tp_rank_config(c, 4);
  EXPECT_EQ(r.num_heads, 2);
  EXPECT_EQ(r.num_kv_heads, 1);
  EXPECT_EQ(r.intermediate, 24);
  EXPECT_EQ(r.vocab, 64);  // 100 padded to 256, a quarter each
}

}  // namespace
}  // namespace qparity

namespace qparity {
namespace {

// The reference with TP's arithmetic (reference_cpu/models/tensor_parallel_emulation.h).
TEST(TpReferenceEmulation, ExactModeIsTheWholeProductAndEmulateModeRoundsEachRanksPartial) {
  const fs::path root = test::scratch_dir("qparity_tp_shard") / "tp_emulation";
  const fs::path dir = quantized(root, "llama", "w8a8-int8-dyn");
  const ModelConfig cfg = load_model_config(dir / "config.json");
  const golden::TokenInputs in = golden::synthetic_inputs(1, 12, cfg.vocab, 4);
  golden::ReferenceRunOptions ro;
  ro.dialect = Dialect::kVllm;
  // Exact: the ranks' fp64 partials sum to the whole product up to reassociation, except that
  // each rank quantizes its own slice of the o_proj / down input (per-token dynamic scales).
  const golden::Golden e1 = golden::run_reference(dir, in, ro, nullptr);
  ro.tp = 2;
  const golden::Golden e2 = golden::run_reference(dir, in, ro, nullptr);
  EXPECT_THAT(e2.meta.device, HasSubstr("tp 2 arithmetic"));
  const auto point = [](const golden::Golden& g, const std::string& name) {
    for (const auto& p : g.points)
      if (p.name == name) return p.values.data;
    throw Error(name, "not in the golden");
  };
  EXPECT_EQ(point(e1, "layers.0.attn.core"), point(e2, "layers.0.attn.core"));
  EXPECT_NE(point(e1, "layers.0.attn.out"), point(e2, "layers.0.attn.out"))
      << "per-rank activation scales must change the o_proj output";
  // bf16 (no activation quantization), emulate mode: each partial rounded, then their sum.
  const fs::path bf = quantized(root, "llama", "bf16");
  golden::ReferenceRunOptions em;
  em.mode = reference::PrecisionMode::kEmulate;
  const golden::Golden b1 = golden::run_reference(bf, in, em, nullptr);
  em.tp = 2;
  const golden::Golden b2 = golden::run_reference(bf, in, em, nullptr);
  const std::vector<double> o1 = point(b1, "layers.0.attn.out"),
                            o2 = point(b2, "layers.0.attn.out");
  ASSERT_EQ(o1.size(), o2.size());
  int64_t moved = 0;
  double num = 0, den = 0;
  for (size_t i = 0; i < o1.size(); ++i) {
    moved += o1[i] != o2[i];
    num += (o1[i] - o2[i]) * (o1[i] - o2[i]);
    den += o1[i] * o1[i];
  }
  EXPECT_GT(moved, 0) << "rounding each rank's partial must move some elements";
  // Two roundings of partials (each up to 2^-9 of a partial, which can exceed the sum) and one
  // of the sum: a few unit roundoffs in relative L2, not more.
  EXPECT_LE(std::sqrt(num / den), std::ldexp(1.0, -6));
  EXPECT_GT(std::sqrt(num / den), std::ldexp(1.0, -12));
  EXPECT_EQ(point(b1, "layers.0.attn.qkv"), point(b2, "layers.0.attn.qkv"));
  // MoE layers: refused by name.
  const fs::path moe = quantized(root, "qwen3-moe", "bf16");
  EXPECT_THAT(error_of([&] {
                golden::run_reference(moe, golden::synthetic_inputs(1, 4, 512, 1), em, nullptr);
              }),
              AllOf(HasSubstr(".moe"), HasSubstr("tensor parallelism inside MoE")));
}

}  // namespace
}  // namespace qparity
