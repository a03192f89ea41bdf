// The GPU engine against the reference: the fixtures of all three architectures (tiny and
// small), reference goldens in emulate mode (bf16 storage, fp64 arithmetic). The engine's
// layer-local dump (each layer on the golden's own inputs) is judged by the bf16 policy's engine
// section at every capture point and end to end; its free run by top-1 agreement. Then the
// runtime's promises: bit-identical reruns, batch-size invariance, prefill/decode consistency,
// CUDA-graph decode equal to eager decode. Loader refusals that need no device run everywhere.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <fstream>

#include "../accuracy/accuracy_util.h"
#include "../unit/error_of.h"
#include "../unit/test_seed.h"
#include "core/error.h"
#include "core/json_util.h"
#include "core/safetensors/safetensors_file.h"
#include "core/safetensors/safetensors_writer.h"
#include "golden/compare.h"
#include "golden/engine_golden.h"
#include "golden/reference_run.h"
#include "gpu_engine/engine.h"
#include "gpu_engine/kernels/decode_attention.h"
#include "gpu_engine/kernels/sampling.h"
#include "gpu_engine/kernels/skinny_gemm.h"
#include "gpu_engine/model_loader.h"
#include "gpu_test.h"
#include "reference_cpu/models/image_input.h"

namespace qparity {
namespace {

namespace fs = std::filesystem;
using ::testing::HasSubstr;

class GpuEngine : public test::GpuTest {
 protected:
  static void SetUpTestSuite() {
    root_ = fs::temp_directory_path() / ("qparity_gpu_engine_" + std::to_string(test::test_seed()));
    fs::create_directories(root_);
  }
  static void TearDownTestSuite() { fs::remove_all(root_); }

  static fs::path fixture(const std::string& arch, fixtures::FixtureSize size) {
    const fs::path dir =
        root_ / (arch + (size == fixtures::FixtureSize::kTiny ? "-tiny" : "-small"));
    if (!fs::exists(dir)) {
      fixtures::FixtureSpec spec;
      spec.arch = fixtures::parse_fixture_arch(arch);
      spec.size = size;
      spec.seed = 7;
      fixtures::write_fp_checkpoint(spec, dir, OverwritePolicy::kRefuse);
    }
    return dir;
  }

  static std::unique_ptr<gpu::Engine> engine(const fs::path& dir, int64_t max_tokens = 512) {
    gpu::EngineOptions o;
    o.max_tokens = max_tokens;
    o.max_seqs = 8;
    o.max_context = 256;
    return std::make_unique<gpu::Engine>(gpu::load_gpu_model(dir, nullptr), o);
  }

  static double rel_l2(const std::vector<float>& a, const std::vector<float>& b, size_t first,
                       size_t count) {
    long double e = 0, r = 0;
    for (size_t i = first; i < first + count; ++i) {
      const long double d = static_cast<long double>(a[i]) - b[i];
      e += d * d;
      r += static_cast<long double>(b[i]) * b[i];
    }
    return static_cast<double>(std::sqrt(e / r));
  }

  // The engine on `dir` against the reference's emulate-mode golden: layer-local (prefill-sized
  // and decode-sized batches) every point within the bf16 policy, every point dumped; the free
  // run by top-1 agreement.
  static void expect_matches_reference(const fs::path& dir) {
    const golden::Policy policy =
        golden::load_policy(fs::path(QPARITY_SOURCE_DIR) / "policies/bf16.json");
    SCOPED_TRACE(dir.filename().string());
    const ModelConfig cfg = load_model_config(dir / "config.json");
    const golden::TokenInputs in = golden::synthetic_inputs(3, 32, cfg.vocab, 5);
    golden::ReferenceRunOptions ro;
    ro.mode = reference::PrecisionMode::kEmulate;
    const fs::path gfile = root_ / (dir.filename().string() + ".ref.h5");
    const fs::path cfile = root_ / (dir.filename().string() + ".engine.h5");
    golden::write_golden(gfile, golden::run_reference(dir, in, ro, nullptr),
                         OverwritePolicy::kReplace);
    auto e = engine(dir);
    const golden::GoldenReader ref = golden::GoldenReader::open(gfile);
    // Layer-local: every point within the policy.
    const golden::CompareReport r = layer_local(*e, ref, policy, dir.filename().string());
    {  // Decode-sized forwards (8 sequences of kSkinnyMaxM tokens, one forward each): the
      // fused skinny-GEMM path, every point within the policy.
      SCOPED_TRACE("decode-sized batch");
      const golden::TokenInputs small = golden::synthetic_inputs(8, gpu::kSkinnyMaxM, cfg.vocab, 6);
      const fs::path sg = root_ / (dir.filename().string() + ".ref8.h5");
      golden::write_golden(sg, golden::run_reference(dir, small, ro, nullptr),
                           OverwritePolicy::kReplace);
      layer_local(*e, golden::GoldenReader::open(sg), policy, dir.filename().string() + "8");
    }
    // Free run: judged end to end by top-1 agreement (Wilson lower bound, the policy's gate);
    // its KLD and per-point error are printed: they grow with depth as the model amplifies
    // bf16-level differences, which the per-point bounds do not model.
    golden::write_golden(cfile, gpu::engine_golden(*e, in, "*", true, nullptr),
                         OverwritePolicy::kReplace);
    const golden::CompareReport fr =
        golden::compare_goldens(ref, golden::GoldenReader::open(cfile), {});
    EXPECT_GE(fr.e2e.top1.lo, 0.75) << golden::to_text(fr);
    std::cout << dir.filename().string() << " free run: mean KLD " << fr.e2e.kld_mean.value << " ["
              << fr.e2e.kld_mean.lo << ", " << fr.e2e.kld_mean.hi << "], top-1 "
              << fr.e2e.top1.value << " (lower " << fr.e2e.top1.lo << "), logits rel_l2 "
              << fr.points.back().stats.rel_l2 << " at " << fr.points.back().name;
    for (const auto& l : fr.router)
      std::cout << ", " << l.point << " flips " << l.flips.flipped << "/" << l.flips.tokens;
    std::cout << "\n";
    // The numbers, for the closing note (ctest --output-on-failure -V shows them).
    double worst = 0;
    std::string where;
    for (const auto& p : r.points)
      if (p.name.find("topk_ids") == std::string::npos && p.stats.rel_l2 > worst)
        worst = p.stats.rel_l2, where = p.name;
    std::cout << dir.filename().string() << " layer-local: worst point " << where << " rel_l2 "
              << worst << " (" << r.policy_section << ")\n";
  }

  // The engine's layer-local dump of `ref` (written beside it) judged by `policy`: every point
  // within it, every point the reference has dumped.
  static golden::CompareReport layer_local(gpu::Engine& e, const golden::GoldenReader& ref,
                                           const golden::Policy& policy, const std::string& tag) {
    const fs::path lfile = root_ / (tag + ".engine-local.h5");
    golden::write_golden(lfile, gpu::engine_golden_local(e, ref, "*", nullptr),
                         OverwritePolicy::kReplace);
    golden::CompareOptions co;
    co.policy = &policy;
    golden::CompareReport r = golden::compare_goldens(ref, golden::GoldenReader::open(lfile), co);
    EXPECT_TRUE(r.pass) << golden::to_text(r);
    EXPECT_TRUE(r.missing_in_candidate.empty())
        << "the engine dumps every point the reference does; first missing: "
        << r.missing_in_candidate.front();
    return r;
  }

  static inline fs::path root_;
};

TEST_F(GpuEngine, MatchesTheReferenceAtEveryCapturePointOnAllArchitectures) {
  for (const std::string arch : {"llama", "qwen3", "qwen3-moe"})
    for (const auto size : {fixtures::FixtureSize::kTiny, fixtures::FixtureSize::kSmall})
      expect_matches_reference(fixture(arch, size));
}

// ChatGLM2 (q/k/v biases, RoPE on half of each head in interleaved pairs, run on the
// rotate-half kernels with q / k rows re-laid out: rope_layout.h) and Mistral (a sliding window
// the 32-token sequences stay inside: the small fixture's 64) against the reference, as above.
// Past the window the engine refuses by name (the tiny Mistral's window is 8).
TEST_F(GpuEngine, ChatGlm2AndMistralMatchTheReference) {
  for (const auto size : {fixtures::FixtureSize::kTiny, fixtures::FixtureSize::kSmall})
    expect_matches_reference(fixture("chatglm2", size));
  expect_matches_reference(fixture("mistral", fixtures::FixtureSize::kSmall));
  auto e = engine(fixture("mistral", fixtures::FixtureSize::kTiny));
  gpu::Batch b;
  for (int32_t i = 0; i < 9; ++i) {
    b.tokens.push_back(i + 1);
    b.slots.push_back(0);
    b.positions.push_back(i);
  }
  try {
    e->forward(b);
    ADD_FAILURE() << "a position past the sliding window ran";
  } catch (const Error& err) {
    EXPECT_NE(std::string(err.what()).find("sliding_window 8"), std::string::npos) << err.what();
  }
}

// Qwen3-VL's language model on text (the image-text checkpoint's wrapper names; its vision tower
// is not the engine's): Qwen3's decoder, and M-RoPE with three equal rows is the 1-D RoPE.
TEST_F(GpuEngine, Qwen3VlTextDecoderMatchesTheReference) {
  for (const auto size : {fixtures::FixtureSize::kTiny, fixtures::FixtureSize::kSmall})
    expect_matches_reference(fixture("qwen3-vl", size));
}

// Two sequences of 24 tokens: the first with a 4 x 4 image (4 placeholders after 2 text
// tokens), the second with a 4 x 6 one (6) and a 4 x 4 one (4); text after them.
golden::TokenInputs image_prompt_inputs(const ModelConfig& cfg, int64_t patch_dim) {
  const int64_t img = cfg.image_token_id, vs = cfg.vision_start_token_id, ve = vs + 1;
  golden::TokenInputs in;
  in.sequences = 2;
  in.seq_len = 24;
  in.tokens = {3,  14, vs, img, img, img, img, ve, 92, 7,  8,   9,   10,  11,  12,  13,
               14, 15, 16, 17,  18,  19,  20,  21, 5,  vs, img, img, img, img, img, img,
               ve, 20, vs, img, img, img, img, ve, 21, 22, 23,  24,  25,  26,  27,  28};
  in.description = "image prompts";
  in.pixels.grids = {{1, 4, 4}, {1, 4, 6}, {1, 4, 4}};
  in.pixels.pixels = Matrix(56, patch_dim);
  for (size_t i = 0; i < in.pixels.pixels.data.size(); ++i)
    in.pixels.pixels.data[i] = std::sin(0.29 * static_cast<double>(i));
  return in;
}

// An image prompt's rows [0, n) of a batch (slot `slot`): tokens, rotary rows, features.
gpu::Batch image_batch(const std::vector<int64_t>& tokens, const reference::ImagePrompt& p,
                       int64_t n, int32_t slot) {
  gpu::Batch b;
  for (int64_t i = 0; i < n; ++i) {
    b.tokens.push_back(static_cast<int32_t>(tokens[static_cast<size_t>(i)]));
    b.slots.push_back(slot);
    b.positions.push_back(static_cast<int32_t>(i));
  }
  for (const auto* row : {&p.positions.t, &p.positions.h, &p.positions.w})
    for (int64_t i = 0; i < n; ++i)
      b.rope_rows.push_back(static_cast<int32_t>((*row)[static_cast<size_t>(i)]));
  for (int64_t r : p.rows)
    b.image_rows.push_back(static_cast<int32_t>(r));
  b.image_embeds = p.embeds.data;
  for (const Matrix& d : p.deepstack)
    b.deepstack.push_back(d.data);
  return b;
}

// Image prompts on the engine, which has no vision tower: the reference's tower features (fp64,
// computed once) are fed in. The placeholders take the features, attention rotates by the
// interleaved M-RoPE rows (the prologue path at any batch size), the deepstack features join the
// image rows after the first layers, and layers.<k>.residual is the sum. Against the reference's
// image golden (golden make --pixels): layer-local every point within the bf16 policy, free run
// by top-1. Then decode after a prompt: steps rotating at position + mrope_position_delta give
// the full forward's logits within the policy's bound; a text model refuses image rows by name.
TEST_F(GpuEngine, Qwen3VlImagePromptsMatchTheReference) {
  const golden::Policy policy =
      golden::load_policy(fs::path(QPARITY_SOURCE_DIR) / "policies/bf16.json");
  for (const auto size : {fixtures::FixtureSize::kTiny, fixtures::FixtureSize::kSmall}) {
    const fs::path dir = fixture("qwen3-vl", size);
    SCOPED_TRACE(dir.filename().string());
    const ModelConfig cfg = load_model_config(dir / "config.json");
    const reference::Qwen3VlVisionTower tower = reference::load_vision_tower(dir.string(), cfg);
    const golden::TokenInputs in = image_prompt_inputs(cfg, tower.config().patch_dim());
    golden::ReferenceRunOptions ro;
    ro.mode = reference::PrecisionMode::kEmulate;
    const fs::path gfile = root_ / (dir.filename().string() + ".images.ref.h5");
    golden::write_golden(gfile, golden::run_reference(dir, in, ro, nullptr),
                         OverwritePolicy::kReplace);
    const golden::GoldenReader ref = golden::GoldenReader::open(gfile);
    auto e = engine(dir);
    const golden::CompareReport r =
        layer_local(*e, ref, policy, dir.filename().string() + ".images");
    double worst = 0;
    std::string where;
    for (const auto& p : r.points)
      if (p.stats.rel_l2 > worst) worst = p.stats.rel_l2, where = p.name;
    const fs::path cfile = root_ / (dir.filename().string() + ".images.engine.h5");
    golden::write_golden(cfile, gpu::engine_golden(*e, in, "*", true, nullptr),
                         OverwritePolicy::kReplace);
    const golden::CompareReport fr =
        golden::compare_goldens(ref, golden::GoldenReader::open(cfile), {});
    EXPECT_GE(fr.e2e.top1.lo, 0.75) << golden::to_text(fr);
    std::cout << dir.filename().string() << " image prompts: layer-local worst " << where
              << " rel_l2 " << worst << "; free run top-1 " << fr.e2e.top1.value << ", mean KLD "
              << fr.e2e.kld_mean.value << ", logits rel_l2 " << fr.points.back().stats.rel_l2
              << "\n";

    // Sequence 1 whole, against its first 16 tokens (both images) and 8 decode steps (the tiny
    // fixture, as PrefillAndDecodeAgreeAndGraphsReplayExactly: the small one's logits carry
    // bf16 noise the size of that bound, 6e-3 against the reference). Rotating the steps at
    // the bare position instead (delta 0) must do worse.
    if (size != fixtures::FixtureSize::kTiny) continue;
    const std::vector<int64_t> seq(in.tokens.begin() + 24, in.tokens.end());
    const golden::GoldenImages gi = ref.images();
    const reference::ImagePrompt whole = reference::prepare_image_prompt(
        cfg, cfg.num_layers, seq, golden::sequence_image_features(gi, 1));
    const reference::ImagePrompt prompt = reference::prepare_image_prompt(
        cfg, cfg.num_layers, std::span<const int64_t>(seq.data(), 16),
        golden::sequence_image_features(gi, 1));
    ASSERT_NE(prompt.positions.delta, 0) << "the images must shift the rotary positions";
    e->forward(image_batch(seq, whole, 24, 0));
    const int64_t v = cfg.vocab;
    const std::vector<float> want = e->logits_host(24);
    e->release(0);
    double err[2] = {0, 0};  // worst step: with the delta, without
    for (const bool shifted : {true, false}) {
      e->forward(image_batch(seq, prompt, 16, 1));
      for (int32_t i = 16; i < 24; ++i) {
        gpu::Batch step;
        step.tokens = {static_cast<int32_t>(seq[static_cast<size_t>(i)])};
        step.slots = {1};
        step.positions = {i};
        const auto at = static_cast<int32_t>(i + (shifted ? prompt.positions.delta : 0));
        step.rope_rows = {at, at, at};
        e->forward(step);
        const std::vector<float> got = e->logits_host(1);
        const std::vector<float> row(want.begin() + i * v, want.begin() + (i + 1) * v);
        err[shifted ? 0 : 1] = std::max(err[shifted ? 0 : 1], rel_l2(got, row, 0, got.size()));
      }
      e->release(1);
    }
    std::cout << "decode after the image prompt (delta " << prompt.positions.delta
              << "): worst step rel_l2 " << err[0] << "; without the delta " << err[1] << "\n";
    EXPECT_LE(err[0], 0x1p-9);
    EXPECT_GT(err[1], 4 * err[0]) << "the rotary shift is not exercised";
  }
  auto text = engine(fixture("qwen3", fixtures::FixtureSize::kTiny));
  gpu::Batch b;
  b.tokens = {1, 2};
  b.slots = {0, 0};
  b.positions = {0, 1};
  b.image_rows = {1};
  b.image_embeds.assign(static_cast<size_t>(text->config().hidden), 0.5);
  EXPECT_THAT(test::error_of([&] { text->forward(b); }), HasSubstr("takes no image prompts"));
}

// Qwen3.5, hybrid: Gated DeltaNet layers (kernels/gated_delta_net.h, the recurrent state in the
// cache's slot) beside gated full attention with partial RoPE, zero-centred norms. Against the
// reference as above (linear_attn.* points included, the per-token state too); then the slot's
// state: one batch holding two sequences equals each alone within the policy's logits bound, and
// a batch that does not continue a slot's state (a position skipped, a sequence's tokens split,
// a state that graph replays fed again) is refused by name before anything runs. (Prefill against
// decode steps and graph decode: PrefillAndDecodeAgreeAndGraphsReplayExactly.)
TEST_F(GpuEngine, Qwen35HybridDecoderMatchesTheReference) {
  for (const auto size : {fixtures::FixtureSize::kTiny, fixtures::FixtureSize::kSmall})
    expect_matches_reference(fixture("qwen3.5", size));
  auto e = engine(fixture("qwen3.5", fixtures::FixtureSize::kTiny));
  const int64_t t = 12, v = e->config().vocab;
  const golden::TokenInputs in = golden::synthetic_inputs(2, t, v, 4);
  gpu::Batch both;
  for (int32_t s = 0; s < 2; ++s)
    for (int32_t i = 0; i < t; ++i) {
      both.tokens.push_back(static_cast<int32_t>(in.tokens[static_cast<size_t>(s * t + i)]));
      both.slots.push_back(s);
      both.positions.push_back(i);
    }
  e->forward(both);
  const std::vector<float> together = e->logits_host(both.size());
  for (int32_t s = 0; s < 2; ++s) {
    gpu::Batch one;
    one.tokens.assign(both.tokens.begin() + s * t, both.tokens.begin() + (s + 1) * t);
    one.slots.assign(static_cast<size_t>(t), 3);
    for (int32_t i = 0; i < t; ++i)
      one.positions.push_back(i);
    e->forward(one);  // slot 3 restarts at position 0 each time
    const std::vector<float> alone = e->logits_host(t);
    const std::vector<float> part(together.begin() + s * t * v, together.begin() + (s + 1) * t * v);
    EXPECT_LE(rel_l2(alone, part, 0, alone.size()), 0x1p-9) << "sequence " << s;
  }
  gpu::Batch skip;  // slot 0 has taken 12 tokens
  skip.tokens = {1};
  skip.slots = {0};
  skip.positions = {13};
  EXPECT_THAT(test::error_of([&] { e->forward(skip); }),
              AllOf(HasSubstr("slot 0"), HasSubstr("holds 12 tokens"), HasSubstr("position 13")));
  gpu::Batch split;
  split.tokens = {1, 2, 3};
  split.slots = {1, 2, 1};
  split.positions = {12, 0, 13};
  EXPECT_THAT(test::error_of([&] { e->forward(split); }),
              AllOf(HasSubstr("slot 1"), HasSubstr("not consecutive rows")));
  gpu::Batch next;  // both still continue where they were
  next.tokens = {1, 2};
  next.slots = {0, 1};
  next.positions = {12, 12};
  e->forward(next);
  // Graph replays feed the same tokens to the states again: every slot must then restart.
  next.positions = {13, 13};
  e->forward_graph(next);
  e->replay_graph(2, 3);
  next.positions = {14, 14};
  EXPECT_THAT(test::error_of([&] { e->forward(next); }), HasSubstr("graph replays"));
  next.positions = {0, 0};
  e->forward(next);
}

// Shapes the kernels take only zero-padded (shape_padding.h): head_dim 8 (a real small trained
// checkpoint's, hidden 32 over 4 heads) and 16 with Qwen3's q/k norm, intermediate 172 and
// moe_intermediate 172 (K = 172 is no multiple of 8). The same judgement as the fixtures': the
// padding must change no logical value beyond the bf16 policy, and every capture point keeps the
// model's own shape.
TEST_F(GpuEngine, PaddedHeadDimAndIntermediateMatchTheReference) {
  struct Shape {
    const char* arch;
    int64_t hidden, intermediate, moe_intermediate;
  };
  for (const Shape& sh :
       {Shape{"llama", 32, 172, 0}, Shape{"qwen3", 64, 172, 0}, Shape{"qwen3-moe", 64, 0, 172}}) {
    const fs::path dir = root_ / (std::string(sh.arch) + "-padded");
    if (!fs::exists(dir)) {
      fixtures::FixtureSpec spec;
      spec.arch = fixtures::parse_fixture_arch(sh.arch);
      spec.size = fixtures::FixtureSize::kTiny;
      spec.seed = 11;
      spec.hidden = sh.hidden;
      spec.intermediate = sh.intermediate;
      spec.moe_intermediate = sh.moe_intermediate;
      fixtures::write_fp_checkpoint(spec, dir, OverwritePolicy::kRefuse);
    }
    const auto m = gpu::load_gpu_model(dir, nullptr);
    ASSERT_TRUE(m->padded.has_value()) << sh.arch << ": these shapes need padding";
    EXPECT_EQ(m->padded->head_dim % 32, 0);
    EXPECT_EQ(m->padded->intermediate % 8, 0);
    EXPECT_EQ(m->padded->moe_intermediate_size % 8, 0);
    expect_matches_reference(dir);
  }
}

// A quantized linear is not padded (its layout is its kernel's): the load refuses it by name
// rather than run a padded shape it was not built for.
TEST_F(GpuEngine, RefusesQuantizedLinearsThatWouldNeedPadding) {
  const fs::path fp = root_ / "llama-i172.fp";
  if (!fs::exists(fp)) {
    fixtures::FixtureSpec spec;
    spec.seed = 12;
    spec.intermediate = 172;
    fixtures::write_fp_checkpoint(spec, fp, OverwritePolicy::kRefuse);
  }
  const fs::path q = root_ / "llama-i172.w8a16-ch";
  if (!fs::exists(q)) {
    const ModelConfig cfg = load_model_config(fp / "config.json");
    fixtures::quantize_checkpoint(
        fp, parse_scheme_id("w8a16-ch"), Dialect::kIdeal, q,
        fixtures::calibrate_checkpoint(fp, reference::synthetic_tokens(32, cfg.vocab, 12)),
        OverwritePolicy::kRefuse, nullptr);
  }
  EXPECT_THAT(test::error_of([&] { gpu::load_gpu_model(q, nullptr); }),
              AllOf(HasSubstr("model.layers.0.mlp.gate_up_proj"),
                    HasSubstr("intermediate_size 172"), HasSubstr("bf16 linears only")));
}

// Same batch twice: bit-identical. Each sequence alone against all four together: within the
// bf16 policy's logits bound (GEMM algorithms may change with the token count).
TEST_F(GpuEngine, DeterministicAndBatchInvariant) {
  const fs::path dir = fixture("qwen3", fixtures::FixtureSize::kSmall);
  auto e = engine(dir);
  const int64_t t = 20, n = 4, v = e->config().vocab;
  const golden::TokenInputs in = golden::synthetic_inputs(n, t, v, 9);
  gpu::Batch all;
  for (int64_t s = 0; s < n; ++s)
    for (int64_t i = 0; i < t; ++i) {
      all.tokens.push_back(static_cast<int32_t>(in.tokens[static_cast<size_t>(s * t + i)]));
      all.slots.push_back(static_cast<int32_t>(s));
      all.positions.push_back(static_cast<int32_t>(i));
    }
  const auto release_all = [&] {
    for (int32_t s = 0; s < n; ++s)
      e->release(s);
  };
  e->forward(all);
  const std::vector<float> a = e->logits_host(all.size());
  release_all();
  e->forward(all);
  const std::vector<float> b = e->logits_host(all.size());
  release_all();
  ASSERT_EQ(std::memcmp(a.data(), b.data(), a.size() * 4), 0) << "rerun not bit-identical";
  int identical = 0;
  for (int64_t s = 0; s < n; ++s) {
    gpu::Batch one;
    for (int64_t i = 0; i < t; ++i) {
      one.tokens.push_back(all.tokens[static_cast<size_t>(s * t + i)]);
      one.slots.push_back(0);
      one.positions.push_back(static_cast<int32_t>(i));
    }
    e->forward(one);
    const std::vector<float> c = e->logits_host(one.size());
    e->release(0);
    std::vector<float> part(a.begin() + s * t * v, a.begin() + (s + 1) * t * v);
    const double err = rel_l2(c, part, 0, c.size());
    EXPECT_LE(err, 0x1p-9) << "sequence " << s;
    identical += std::memcmp(c.data(), part.data(), c.size() * 4) == 0;
  }
  std::cout << identical << " of " << n << " sequences bit-identical alone and batched\n";
}

// One prefill of T tokens against a prefill of T - 8 followed by 8 single-token decode steps
// (eager, then through CUDA graphs): the decode logits match the prefill's rows within the
// policy's logits bound, and graph decode equals eager decode bit for bit.
TEST_F(GpuEngine, PrefillAndDecodeAgreeAndGraphsReplayExactly) {
  for (const std::string arch : {"llama", "qwen3", "qwen3-moe", "chatglm2", "qwen3.5"}) {
    SCOPED_TRACE(arch);
    const fs::path dir = fixture(arch, fixtures::FixtureSize::kTiny);
    auto e = engine(dir);
    const int64_t t = 40, tail = 8, v = e->config().vocab;
    const golden::TokenInputs in = golden::synthetic_inputs(1, t, v, 3);
    gpu::Batch full;
    for (int64_t i = 0; i < t; ++i) {
      full.tokens.push_back(static_cast<int32_t>(in.tokens[static_cast<size_t>(i)]));
      full.slots.push_back(0);
      full.positions.push_back(static_cast<int32_t>(i));
    }
    e->forward(full);
    const std::vector<float> want = e->logits_host(t);
    e->release(0);
    std::vector<std::vector<float>> eager, graph;
    for (const bool use_graph : {false, true}) {
      gpu::Batch pre;
      for (int64_t i = 0; i < t - tail; ++i) {
        pre.tokens.push_back(full.tokens[static_cast<size_t>(i)]);
        pre.slots.push_back(1);
        pre.positions.push_back(static_cast<int32_t>(i));
      }
      e->forward(pre);
      for (int64_t i = t - tail; i < t; ++i) {
        gpu::Batch step;
        step.tokens = {full.tokens[static_cast<size_t>(i)]};
        step.slots = {1};
        step.positions = {static_cast<int32_t>(i)};
        use_graph ? e->forward_graph(step) : e->forward(step);
        (use_graph ? graph : eager).push_back(e->logits_host(1));
      }
      e->release(1);
    }
    for (int64_t j = 0; j < tail; ++j) {
      const std::vector<float>& d = eager[static_cast<size_t>(j)];
      const std::vector<float> row(want.begin() + (t - tail + j) * v,
                                   want.begin() + (t - tail + j + 1) * v);
      const double err = rel_l2(d, row, 0, d.size());
      EXPECT_LE(err, 0x1p-9) << "decode step " << j;
      ASSERT_EQ(std::memcmp(d.data(), graph[static_cast<size_t>(j)].data(), d.size() * 4), 0)
          << "graph decode differs from eager decode at step " << j;
    }
  }
}

// Graph decode of 1 to kSkinnyMaxM sequences (the fused decode attention, the fused argmax): two
// engines on the same inputs give the same logits bit for bit; the greedy ids read from the
// argmax fused into the lm_head GEMM equal the argmax kernel's and the host's over the same
// logits; a prefill-sized forward (no fused argmax) still answers greedy through the kernel.
TEST_F(GpuEngine, DecodeIsReproducibleAndFusedArgmaxMatchesTheKernel) {
  for (const std::string arch : {"llama", "qwen3", "qwen3-moe"}) {
    SCOPED_TRACE(arch);
    const fs::path dir = fixture(arch, fixtures::FixtureSize::kTiny);
    const ModelConfig cfg = load_model_config(dir / "config.json");
    const int64_t v = cfg.vocab, seqs = gpu::kSkinnyMaxM, pre = 12;
    const golden::TokenInputs in = golden::synthetic_inputs(seqs, pre + 3, v, 5);
    const auto tok = [&](int64_t s, int64_t i) {
      return static_cast<int32_t>(in.tokens[static_cast<size_t>(s * (pre + 3) + i)]);
    };
    std::vector<std::vector<float>> runs;
    for (int run = 0; run < 2; ++run) {
      SCOPED_TRACE("engine " + std::to_string(run));
      gpu::EngineOptions o;
      o.max_tokens = 64, o.max_seqs = seqs, o.max_context = 64;
      gpu::Engine e(gpu::load_gpu_model(dir, nullptr), o);
      gpu::Batch prefill;
      for (int32_t s = 0; s < seqs; ++s)
        for (int32_t i = 0; i < pre; ++i)
          prefill.tokens.push_back(tok(s, i)), prefill.slots.push_back(s),
              prefill.positions.push_back(i);
      e.forward(prefill);
      const std::vector<float> pl = e.logits_host(prefill.size());
      const std::vector<int32_t> pg = e.greedy(prefill.size());  // the kernel: no fused keys
      for (int64_t r = 0; r < prefill.size(); ++r) {
        const auto row = pl.begin() + r * v;
        ASSERT_EQ(pg[static_cast<size_t>(r)], std::max_element(row, row + v) - row) << "row " << r;
      }
      std::vector<float> all;
      for (int64_t step = 0; step < 3; ++step)
        for (int64_t t = 1; t <= seqs; ++t) {  // t sequences step together
          if (step > 0 && t < seqs) continue;
          gpu::Batch b;
          for (int32_t s = 0; s < t; ++s)
            b.tokens.push_back(tok(s, pre + step)), b.slots.push_back(s),
                b.positions.push_back(static_cast<int32_t>(pre + step));
          // (step 0 runs t = 1..kSkinnyMaxM at one position: each rewrites the same K/V bits,
          // batches this size being batch-invariant bit for bit)
          e.forward_graph(b);
          const std::vector<float> l = e.logits_host(t);
          const std::vector<int32_t> fused = e.greedy(t);
          gpu::DeviceBuffer<int32_t> ids(static_cast<size_t>(t));
          gpu::launch_argmax({e.logits(), ids.get(), t, v}, nullptr);  // then the copy waits
          std::vector<int32_t> kernel(static_cast<size_t>(t));
          ASSERT_EQ(cudaMemcpy(kernel.data(), ids.get(), kernel.size() * 4, cudaMemcpyDeviceToHost),
                    cudaSuccess);
          for (int64_t r = 0; r < t; ++r) {
            const auto row = l.begin() + r * v;
            const int32_t host = static_cast<int32_t>(std::max_element(row, row + v) - row);
            EXPECT_EQ(fused[static_cast<size_t>(r)], kernel[static_cast<size_t>(r)])
                << t << " tokens, row " << r;
            EXPECT_EQ(fused[static_cast<size_t>(r)], host) << t << " tokens, row " << r;
          }
          all.insert(all.end(), l.begin(), l.end());
        }
      runs.push_back(all);
    }
    for (size_t r = 1; r < runs.size(); ++r) {
      ASSERT_EQ(runs[r].size(), runs[0].size());
      EXPECT_EQ(std::memcmp(runs[r].data(), runs[0].data(), runs[0].size() * 4), 0)
          << "a second engine gave other logits";
    }
  }
}

// The kernel timeline of a graph decode step: the probed kernels in launch order (embedding;
// per layer qkv, attention, o_proj, gate_up, down; lm_head with the final norm in its prologue),
// each stamped start <= release <= end, each released only after the kernel before it ended (what
// pdl_wait promises); the decode attention's stage stamps in stage order for every block of the
// token's chunks; neither changes a logit, and a graph replayed back to back recomputes the same
// step bit for bit.
TEST_F(GpuEngine, KernelTimelineFollowsTheLaunchOrderAndChangesNothing) {
  const fs::path dir = fixture("qwen3", fixtures::FixtureSize::kTiny);
  const ModelConfig cfg = load_model_config(dir / "config.json");
  std::vector<std::vector<float>> logits;
  std::vector<gpu::TimelineEntry> tl;
  std::vector<unsigned long long> stages;
  const int32_t pre_len = 130, last = pre_len + 2;  // three 64-key chunks at the last step
  int64_t max_chunks = 0, chunk = 0;
  for (const int mode : {0, 1, 2}) {  // plain, kernel timeline, attention stages
    SCOPED_TRACE("mode " + std::to_string(mode));
    gpu::EngineOptions o;
    o.max_tokens = 256, o.max_seqs = 2, o.max_context = 256;
    o.kernel_timeline = mode == 1, o.attention_stages = mode == 2;
    chunk = o.decode_attention_chunk;
    max_chunks = (o.max_context + chunk - 1) / chunk;
    gpu::Engine e(gpu::load_gpu_model(dir, nullptr), o);
    gpu::Batch pre;
    for (int32_t i = 0; i < pre_len; ++i)
      pre.tokens.push_back(3 * i % 97 + 1), pre.slots.push_back(0), pre.positions.push_back(i);
    e.forward(pre);
    EXPECT_TRUE(e.timeline().empty()) << "a prefill-sized forward is not probed";
    for (int32_t i = pre_len; i <= last; ++i) {
      gpu::Batch b;
      b.tokens = {5 + i % 50}, b.slots = {0}, b.positions = {i};
      if (mode == 2 && i == last) gpu::reset_decode_attention_stages();
      e.forward_graph(b);
    }
    logits.push_back(e.logits_host(1));
    if (mode == 1) tl = e.timeline();
    if (mode == 2) stages = gpu::read_decode_attention_stages(cfg.num_heads * max_chunks);
    if (mode == 0) {
      e.replay_graph(1, 2);
      const std::vector<float> again = e.logits_host(1);
      ASSERT_EQ(std::memcmp(again.data(), logits[0].data(), again.size() * 4), 0)
          << "the replayed step gave other logits";
    }
  }
  ASSERT_EQ(std::memcmp(logits[0].data(), logits[1].data(), logits[0].size() * 4), 0)
      << "probing changed the logits";
  ASSERT_EQ(std::memcmp(logits[0].data(), logits[2].data(), logits[0].size() * 4), 0)
      << "stage stamps changed the logits";
  std::vector<std::string> want = {"embedding"};
  for (int64_t l = 0; l < cfg.num_layers; ++l)
    for (const char* k : {"qkv", "attention", "o_proj", "gate_up", "down"})
      want.push_back(k);
  want.push_back("lm_head");
  ASSERT_EQ(tl.size(), want.size());
  for (size_t i = 0; i < tl.size(); ++i) {
    SCOPED_TRACE(std::to_string(i) + " " + tl[i].kernel);
    EXPECT_EQ(tl[i].kernel, want[i]);
    EXPECT_LE(tl[i].start_us, tl[i].release_us);
    EXPECT_LE(tl[i].release_us, tl[i].end_us);
    EXPECT_LE(tl[i].start_us, tl[i].last_start_us);
    EXPECT_LE(tl[i].release_us, tl[i].last_release_us);
    if (i > 0) {
      EXPECT_GE(tl[i].release_us, tl[i - 1].end_us) << "released before its predecessor ended";
    }
  }
  // Stage stamps: blocks of the token's chunks stamped in order, the others untouched.
  const int64_t chunks = last / chunk + 1;
  ASSERT_EQ(chunks, 3);
  const int S = gpu::kStageSlots;
  for (int64_t h = 0; h < cfg.num_heads; ++h)
    for (int64_t c = 0; c < max_chunks; ++c) {
      SCOPED_TRACE("head " + std::to_string(h) + " chunk " + std::to_string(c));
      const unsigned long long* x = &stages[static_cast<size_t>((h * max_chunks + c) * S)];
      if (c >= chunks) {
        EXPECT_EQ(x[0], 0u) << "a block past the token's chunks stamped";
        continue;
      }
      EXPECT_EQ(x[8], static_cast<unsigned long long>(chunks));
      EXPECT_NE(x[6], 0u) << "every block of a three-chunk token counts itself";
      for (int s2 = 1; s2 < 8; ++s2)
        EXPECT_LE(x[s2 - 1], x[s2]) << "stage " << s2;
    }
}

// NaN router logits never turn into a silently wrong forward: the router's -1 ids refuse it,
// naming the first MoE layer, on the host path (more than kSkinnyMaxM tokens), on the device path
// (eager and through a CUDA graph).
TEST_F(GpuEngine, NanRouterLogitsRefuseTheForwardNamingTheLayer) {
  const fs::path dir = fixture("qwen3-moe", fixtures::FixtureSize::kTiny);
  auto model = gpu::load_gpu_model(dir, nullptr);
  int64_t l = 0;
  while (!model->layers[static_cast<size_t>(l)].moe)
    ++l;
  gpu::Bf16Buffer& router = model->layers[static_cast<size_t>(l)].router;
  ASSERT_EQ(cudaMemset(router.get(), 0xFF, router.bytes()), cudaSuccess);  // 0xFFFF: a bf16 NaN
  gpu::EngineOptions o;
  o.max_tokens = 64, o.max_seqs = 2, o.max_context = 64;
  gpu::Engine e(std::move(model), o);
  const std::string where = "layers." + std::to_string(l) + ".moe";
  for (const int64_t t : {int64_t{8}, int64_t{1}})
    for (const bool graph : {false, true}) {
      if (graph && t > gpu::kSkinnyMaxM) continue;
      SCOPED_TRACE(std::to_string(t) + " tokens" + (graph ? ", graph" : ""));
      gpu::Batch b;
      for (int32_t i = 0; i < t; ++i)
        b.tokens.push_back(i + 1), b.slots.push_back(0), b.positions.push_back(i);
      EXPECT_THAT(test::error_of([&] { graph ? e.forward_graph(b) : e.forward(b); }),
                  ::testing::AllOf(HasSubstr(where), HasSubstr("NaN router logits")));
      e.release(0);
    }
}

// One layer re-run from the reference golden's own inputs reproduces that layer within policy.
TEST_F(GpuEngine, LayerRerunFromGoldenInputs) {
  const fs::path dir = fixture("qwen3-moe", fixtures::FixtureSize::kTiny);
  const ModelConfig cfg = load_model_config(dir / "config.json");
  const golden::TokenInputs in = golden::synthetic_inputs(2, 16, cfg.vocab, 4);
  golden::ReferenceRunOptions ro;
  ro.mode = reference::PrecisionMode::kEmulate;
  const fs::path gfile = root_ / "rerun.ref.h5";
  golden::write_golden(gfile, golden::run_reference(dir, in, ro, nullptr),
                       OverwritePolicy::kReplace);
  const auto ref = golden::GoldenReader::open(gfile);
  auto e = engine(dir);
  for (int64_t layer = 0; layer < cfg.num_layers; ++layer) {
    const std::string out = "layers." + std::to_string(layer) + ".residual";
    bool seen = false;
    for (const auto& p : gpu::engine_rerun_layer(*e, ref, layer))
      if (p.name == out) {
        seen = true;
        EXPECT_LE(p.stats.rel_l2, 0x1p-9) << out;
      }
    EXPECT_TRUE(seen) << out << " not re-run";
  }
}

// Where did it break, on the GPU: an engine running a checkpoint whose layer-0 o_proj has one
// output row scaled by 1.25 fails the bf16 policy first at layers.0.attn.out; re-running layer 0
// in the engine on the golden's inputs still fails there (LOCAL), layer 1 passes (INHERITED).
TEST_F(GpuEngine, PlantedFaultIsLocalToItsLayerInEngineReruns) {
  const fs::path good = fixture("llama", fixtures::FixtureSize::kTiny);
  const fs::path bad = root_ / "llama-tiny-faulty-o-proj";
  fs::remove_all(bad);
  fs::copy(good, bad);
  {
    fs::path file;
    for (const auto& f : fs::directory_iterator(bad))
      if (f.path().extension() == ".safetensors") file = f.path();
    std::vector<std::pair<TensorInfo, std::vector<uint8_t>>> all;
    {
      const auto sf = SafetensorsFile::open(file);
      for (const auto& t : sf.tensors()) {
        const auto b = sf.bytes(t);
        all.push_back({t, {b.begin(), b.end()}});
      }
    }
    std::vector<TensorToWrite> w;
    for (auto& [info, bytes] : all) {
      if (info.name == "model.layers.0.self_attn.o_proj.weight") {
        ASSERT_EQ(info.dtype, DType::kBF16);
        const size_t cols = info.shape[1];
        for (size_t c = 0; c < cols; ++c) {  // row 3
          uint16_t raw;
          std::memcpy(&raw, &bytes[(3 * cols + c) * 2], 2);
          const uint32_t u = static_cast<uint32_t>(raw) << 16;
          float f;
          std::memcpy(&f, &u, 4);
          const __nv_bfloat16 scaled = __float2bfloat16_rn(f * 1.25f);
          std::memcpy(&bytes[(3 * cols + c) * 2], &scaled, 2);
        }
      }
      w.push_back({info.name, info.dtype, info.shape, bytes});
    }
    write_safetensors(file, std::move(w), std::nullopt, OverwritePolicy::kReplace);
  }
  const ModelConfig cfg = load_model_config(good / "config.json");
  const golden::TokenInputs in = golden::synthetic_inputs(2, 16, cfg.vocab, 6);
  golden::ReferenceRunOptions ro;
  ro.mode = reference::PrecisionMode::kEmulate;
  const fs::path gfile = root_ / "fault.ref.h5", cfile = root_ / "fault.engine.h5";
  golden::write_golden(gfile, golden::run_reference(good, in, ro, nullptr),
                       OverwritePolicy::kReplace);
  auto e = engine(bad);
  const auto ref = golden::GoldenReader::open(gfile);
  // Layer-local: what the per-point gates judge (a free run is judged end to end).
  golden::write_golden(cfile, gpu::engine_golden_local(*e, ref, "*", nullptr),
                       OverwritePolicy::kReplace);
  const golden::Policy policy =
      golden::load_policy(fs::path(QPARITY_SOURCE_DIR) / "policies/bf16.json");
  golden::CompareOptions co;
  co.policy = &policy;
  co.allow_other_checkpoint = true;  // the engine runs the planted copy on purpose
  const golden::CompareReport r =
      golden::compare_goldens(ref, golden::GoldenReader::open(cfile), co);
  ASSERT_FALSE(r.pass);
  ASSERT_GE(r.first_failing, 0) << golden::to_text(r);
  EXPECT_EQ(r.points[static_cast<size_t>(r.first_failing)].name, "layers.0.attn.out");
  const golden::PolicySection& section =
      golden::policy_section(policy, golden::PolicyRole::kEngine, "sm90");
  const auto verdict_of = [&](int64_t layer, const std::string& point) {
    for (const auto& p : gpu::engine_rerun_layer(*e, ref, layer))
      if (p.name == point) return golden::judge_point(section, p.name, p.stats).pass;
    ADD_FAILURE() << point << " not re-run";
    return true;
  };
  EXPECT_FALSE(verdict_of(0, "layers.0.attn.out")) << "layer 0's own error: LOCAL";
  EXPECT_TRUE(verdict_of(1, "layers.1.attn.out")) << "layer 1 on clean inputs: INHERITED";
}

TEST(GpuEngineLoader, RefusesTensorsNothingConsumes) {
  // A compressed-tensors checkpoint whose quantization_config is gone: its plan quantizes
  // nothing, so its weight_packed tensors have no consumer; the loader names one instead of
  // dropping them (and reads no weight, so this runs without a device).
  const fs::path root =
      fs::temp_directory_path() / ("qparity_gpu_loader_" + std::to_string(test::test_seed()));
  fs::create_directories(root);
  const fs::path q = test::tiny_checkpoint(root, "llama", "w4a16-g32", 3);
  Json cfg = Json::parse(std::ifstream(q / "config.json"));
  cfg.erase("quantization_config");
  std::ofstream(q / "config.json") << cfg.dump(2);
  EXPECT_THAT(test::error_of([&] { gpu::load_gpu_model(q, nullptr); }),
              AllOf(HasSubstr("unexpected tensor"), HasSubstr("weight_packed")));
  fs::remove_all(root);
}

// What the engine does not run of Qwen3.5 yet is refused by name before any weight is read (so
// this runs without a device): quantized Gated DeltaNet projections, tensor parallelism, a head_dim
// the kernels would pad (the gate rows are not padded).
// compressed-tensors integer points the integer-weight kernels do not take (3-bit codes) are
// refused naming the layer and the reason, before anything reaches the device; never run as
// bf16.
TEST(GpuEngineLoader, RefusesIntegerWeightPointsTheKernelsCannotRun) {
  const fs::path root =
      fs::temp_directory_path() / ("qparity_gpu_loader_int_" + std::to_string(test::test_seed()));
  fs::create_directories(root);
  const fs::path i3 = test::tiny_checkpoint(root, "llama", "ct-w3a16-g64", 3);
  EXPECT_THAT(test::error_of([&] { gpu::load_gpu_model(i3, nullptr); }),
              AllOf(HasSubstr("model.layers.0.self_attn.q_proj: scheme ct-w3a16-g64"),
                    HasSubstr("int3 weights: the GPU's integer-weight kernels take 4 or 8 bits"),
                    HasSubstr("never runs a quantized layer as bf16")));
  fs::remove_all(root);
}

TEST(GpuEngineLoader, RefusesWhatQwen35DoesNotRunYet) {
  const fs::path root =
      fs::temp_directory_path() / ("qparity_gpu_loader35_" + std::to_string(test::test_seed()));
  fs::create_directories(root);
  // A checkpoint whose config quantizes the Gated DeltaNet's projections (producers ignore them):
  // refused naming the first one, before anything reaches the device.
  const fs::path q = test::tiny_checkpoint(root, "qwen3.5", "w4a16-g32", 3);
  {
    Json config = read_json_file(q / "config.json");
    Json& ignore = config["quantization_config"]["ignore"];
    const auto before = ignore.size();
    ignore.erase(std::remove(ignore.begin(), ignore.end(), Json("re:.*linear_attn.*")),
                 ignore.end());
    ASSERT_EQ(ignore.size() + 1, before) << "the producer's ignore entry for linear_attn";
    std::ofstream(q / "config.json") << config.dump(2);
  }
  EXPECT_THAT(test::error_of([&] { gpu::load_gpu_model(q, nullptr); }),
              AllOf(HasSubstr("model.layers.0.linear_attn."),
                    HasSubstr("quantized Gated DeltaNet projections are not on the GPU")));
  gpu::GpuLoadOptions tp;
  tp.tp = 2;
  EXPECT_THAT(test::error_of([&] { gpu::load_gpu_model(root / "qwen3.5.fp", nullptr, tp); }),
              HasSubstr("under tensor parallelism is not in the GPU engine yet"));
  fixtures::FixtureSpec spec;
  spec.arch = fixtures::parse_fixture_arch("qwen3.5");
  spec.seed = 3;
  spec.hidden = 64;  // head_dim 16 over 4 heads
  fixtures::write_fp_checkpoint(spec, root / "h16", OverwritePolicy::kRefuse);
  EXPECT_THAT(test::error_of([&] { gpu::load_gpu_model(root / "h16", nullptr); }),
              AllOf(HasSubstr("head_dim 16"), HasSubstr("gated attention")));
  fs::remove_all(root);
}

// gpt-oss (bf16 and its MXFP4 layout) is the reference's alone: refused by name before any
// weight is read (so this runs without a device), never run without its sinks or clamps.
TEST(GpuEngineLoader, RefusesGptOssByName) {
  const fs::path root =
      fs::temp_directory_path() / ("qparity_gpu_loader_oss_" + std::to_string(test::test_seed()));
  fs::create_directories(root);
  fixtures::FixtureSpec spec;
  spec.arch = fixtures::parse_fixture_arch("gpt-oss");
  spec.seed = 3;
  fixtures::write_fp_checkpoint(spec, root / "bf16", OverwritePolicy::kRefuse);
  fixtures::QuantizeCheckpointOptions o;
  o.layout = "gpt-oss";
  fixtures::quantize_checkpoint(root / "bf16", parse_scheme_id("mxfp4a16"),
                                Dialect::kCompressedTensors, root / "mxfp4", {},
                                OverwritePolicy::kRefuse, nullptr, o);
  for (const char* d : {"bf16", "mxfp4"})
    EXPECT_THAT(test::error_of([&] { gpu::load_gpu_model(root / d, nullptr); }),
                AllOf(HasSubstr("GptOssForCausalLM"), HasSubstr("attention sinks"),
                      HasSubstr("not in the GPU engine yet")))
        << d;
  fs::remove_all(root);
}

}  // namespace
}  // namespace qparity
