// The GPU engine on quantized checkpoints against the reference golden of the same checkpoint in
// emulate mode: every weight-only scheme on every fixture architecture (Qwen3-MoE with its
// experts left in bf16: quantized experts are issue 26), layer-local dumps judged by the scheme's
// engine policy at every capture point, prefill-sized and decode-sized batches (the separate-norm
// path a quantized qkv / gate_up takes), the free run by top-1 agreement, reruns bit-identical.
// The quantized KV caches (kv-int8, kv-fp8, kv-fp8-head) likewise, their own capture points
// (attn.k_cache / v_cache) judged with the rest, and a K scale planted x1.5 in layer 1 shows first
// at that layer's k_cache. Loader refusals (schemes, transforms the GPU cannot run yet) need no
// device.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cstring>

#include "../accuracy/accuracy_util.h"
#include "../unit/checkpoint_edit.h"
#include "../unit/error_of.h"
#include "../unit/test_seed.h"
#include "code_flips.h"
#include "core/capture/capture_points.h"
#include "golden/compare.h"
#include "golden/engine_golden.h"
#include "gpu_engine/engine.h"
#include "gpu_engine/model_loader.h"
#include "gpu_test.h"

namespace qparity {
namespace {

namespace fs = std::filesystem;
using ::testing::AllOf;
using ::testing::HasSubstr;

fs::path test_root(const std::string& what) {
  const fs::path r = fs::temp_directory_path() /
                     ("qparity_gpu_quant_" + what + "_" + std::to_string(test::test_seed()));
  fs::create_directories(r);
  return r;
}

// The engine the fixtures' rows run on: prefill batches of up to 256 tokens, 8 sequences of up
// to 64 positions.
gpu::EngineOptions fixture_engine_options() {
  gpu::EngineOptions eo;
  eo.max_tokens = 256;
  eo.max_seqs = 8;
  eo.max_context = 64;
  return eo;
}

// The tiny fixture of `arch` quantized into `scheme`; MoE experts stay bf16 unless `experts`;
// the written weights stored in compressed-tensors' `sparsity` format when one is given.
fs::path quantized_fixture(const fs::path& root, const std::string& arch, const std::string& scheme,
                           bool experts = false, const std::string& sparsity = "") {
  const fs::path fp = test::tiny_checkpoint(root, arch, "bf16", 7);
  const fs::path out = root / (arch + "." + scheme + (experts ? ".experts" : ".dense") +
                               (sparsity.empty() ? "" : "." + sparsity));
  if (fs::exists(out)) return out;
  fixtures::QuantizeCheckpointOptions qo;
  qo.sparsity = sparsity;
  qo.ignore_unsupported = true;  // e.g. fp8-block's q/k/v partitions not multiples of 128
  // smoothquant keeps every linear bf16 (experts included); it cannot leave one out.
  if (arch == "qwen3-moe" && scheme != "smoothquant" && !experts)
    qo.ignore = {"re:.*\\.mlp\\.experts\\..*"};
  const ModelConfig cfg = load_model_config(fp / "config.json");
  // Produced under the engine's dialect (vllm), so that its loader's rules hold.
  fixtures::quantize_checkpoint(
      fp, parse_scheme_id(scheme), Dialect::kVllm, out,
      fixtures::calibrate_checkpoint(fp, reference::synthetic_tokens(32, cfg.vocab, 7)),
      OverwritePolicy::kRefuse, nullptr, qo);
  return out;
}

// A layer-local comparison passes, or, where `flips_explain` (activation-quantized schemes),
// fails only through inherited activation-code flips (code_flips.h); says what explained it.
void expect_pass_or_code_flips(const golden::CompareReport& r, bool flips_explain,
                               const std::string& label) {
  EXPECT_TRUE(r.missing_in_candidate.empty());
  if (!flips_explain || r.verdict != golden::Judgement::kFail) {
    EXPECT_EQ(r.verdict, golden::Judgement::kPass) << golden::to_text(r);
    return;
  }
  ASSERT_GE(r.first_failing, 0);
  const test::CodeFlips f = test::code_flips(r);
  EXPECT_GT(f.layer_mismatches, 0) << golden::to_text(r);
  EXPECT_LE(f.mismatches * 10000, f.codes) << "more than 1e-4 of the codes moved";
  std::cout << label << ": layer-local FAIL explained by " << f.layer_mismatches
            << " inherited code flip(s) in layer " << f.layer << " (first failing point "
            << r.points[static_cast<size_t>(r.first_failing)].name << ")\n";
}

// The point with the largest rel_l2, and that value.
std::pair<double, std::string> worst_point(const golden::CompareReport& r) {
  std::pair<double, std::string> w{0.0, ""};
  for (const auto& p : r.points)
    if (p.stats.rel_l2 > w.first) w = {p.stats.rel_l2, p.name};
  return w;
}

// One scheme's engine rows on one architecture's tiny fixture: layer-local dumps at a
// prefill-sized and a decode-sized batch judged by the scheme's engine policy, the activation
// codes dumped, free runs bit-identical and within the end-to-end top-1 gate.
void expect_scheme_rows(const fs::path& root, const std::string& arch, const std::string& scheme,
                        const std::string& sparsity = "") {
  SCOPED_TRACE(arch + " " + scheme + (sparsity.empty() ? "" : " " + sparsity));
  const golden::Policy policy =
      golden::load_policy(fs::path(QPARITY_SOURCE_DIR) / "policies" / (scheme + ".json"));
  golden::CompareOptions co;
  co.policy = &policy;
  const fs::path dir = quantized_fixture(root, arch, scheme, false, sparsity);
  const ModelConfig cfg = load_model_config(dir / "config.json");
  const gpu::EngineOptions eo = fixture_engine_options();
  auto model = gpu::load_gpu_model(dir, nullptr);
  EXPECT_EQ(model->scheme, scheme);
  int64_t attn_layer = 0;  // (Qwen3.5: the first full-attention layer)
  while (cfg.is_linear_attention_layer(attn_layer))
    ++attn_layer;
  const gpu::GpuLayerWeights& l0 = model->layers[static_cast<size_t>(attn_layer)];
  if (scheme == "smoothquant") {  // bf16 linears beside the folded norms' weight and bias
    EXPECT_GT(l0.input_norm_bias.size(), 0u) << "the folded norm bias runs";
  } else if (scheme.rfind("kv-", 0) != 0 && scheme != "bf16") {
    EXPECT_TRUE(l0.o_proj_q != nullptr) << "o_proj runs quantized";
  }
  // Qwen3.5's quantized qkv in the checkpoint's rows, gathered into the kernels' row.
  if (cfg.attn_output_gate) {
    EXPECT_EQ(model->qkv_sources.size() > 0, l0.qkv_q != nullptr);
    std::cout << arch << " " << scheme << ": qkv "
              << (l0.qkv_q ? "quantized, gathered" : "bf16, rows moved at load") << "\n";
  }
  gpu::Engine e(std::move(model), eo);
  golden::ReferenceRunOptions ro;
  ro.mode = reference::PrecisionMode::kEmulate;
  ro.dialect = Dialect::kVllm;  // the engine's default dialect
  for (const int64_t seq_len : {int64_t{32}, gpu::kSkinnyMaxM}) {
    SCOPED_TRACE("seq_len " + std::to_string(seq_len));
    const golden::TokenInputs in = golden::synthetic_inputs(3, seq_len, cfg.vocab, 5);
    const std::string base = arch + "." + scheme + (sparsity.empty() ? "" : "." + sparsity) + "." +
                             std::to_string(seq_len);
    const fs::path gfile = root / (base + ".ref.h5"), lfile = root / (base + ".local.h5"),
                   ffile = root / (base + ".free.h5");
    golden::write_golden(gfile, golden::run_reference(dir, in, ro, nullptr),
                         OverwritePolicy::kReplace);
    const golden::GoldenReader ref = golden::GoldenReader::open(gfile);
    golden::Golden local = gpu::engine_golden_local(e, ref, "*", nullptr);
    EXPECT_EQ(local.meta.scheme, scheme);
    golden::write_golden(lfile, local, OverwritePolicy::kReplace);
    const golden::CompareReport r =
        golden::compare_goldens(ref, golden::GoldenReader::open(lfile), co);
    // e2m1 codes are 2^-2..2^-1 apart: an inherited bf16 flip moves whole fp4 steps.
    // (and the WnA8 points' per-token codes: one flip moves a whole int8 / fp8 step of a channel)
    const bool int_a8 = scheme.rfind("ct-w", 0) == 0 && (scheme.find("a8-") != std::string::npos ||
                                                         scheme.find("afp8-") != std::string::npos);
    expect_pass_or_code_flips(r, scheme == "mxfp4" || int_a8, base);
    const auto [worst, where] = worst_point(r);
    std::cout << base << ": layer-local worst rel_l2 " << worst << " at " << where;
    int64_t codes = 0, mismatches = 0, code_points = 0;
    for (const auto& p : r.points)
      if (is_activation_code_point(p.name)) {
        ++code_points;
        codes += static_cast<int64_t>(p.stats.row_rel_l2.size()) * p.cols;
        mismatches += p.stats.mismatches;
      }
    // nvfp4a16, mxfp4a16, mxfp8a16, fp8-*-a16: no codes
    const bool weight_only_float = scheme.ends_with("a16");
    if (!weight_only_float && (scheme.rfind("w8a8", 0) == 0 || scheme.rfind("ct-w8a8", 0) == 0 ||
                               scheme == "w4a8-dyn" || int_a8 || scheme.rfind("fp8", 0) == 0 ||
                               scheme.rfind("mxfp", 0) == 0 || scheme == "nvfp4")) {
      EXPECT_GT(code_points, 0) << "the engine dumps the activation codes";
      std::cout << "; activation codes/scales: " << mismatches << " mismatches of " << codes
                << " in " << code_points << " points";
    }
    // Free run, twice: bit-identical, and top-1 within the policy's end-to-end gate.
    const golden::Golden f1 = gpu::engine_golden(e, in, "*", true, nullptr);
    const golden::Golden f2 = gpu::engine_golden(e, in, "*", true, nullptr);
    EXPECT_EQ(f1.logits.data, f2.logits.data) << "reruns must be bit-identical";
    golden::write_golden(ffile, f1, OverwritePolicy::kReplace);
    const golden::CompareReport fr =
        golden::compare_goldens(ref, golden::GoldenReader::open(ffile), {});
    EXPECT_GE(fr.e2e.top1.lo, 0.75) << golden::to_text(fr);
    std::cout << "; free run mean KLD " << fr.e2e.kld_mean.value << ", top-1 " << fr.e2e.top1.value
              << "\n";
  }
}

class GpuEngineQuantized : public test::GpuTest {};

// The planned loader (every quantized checkpoint's path) against the streaming bf16 loader on
// unquantized checkpoints: it places unquantized linears from their stored bytes (F16 / F32
// rounded once to bf16, as the bf16 loader rounds them), Qwen3.5's gated q / k rows moved row by
// row, norms from the processed weights, MoE routers and expert stacks, lm_head tied or not. The
// same weights on the device give the same dumps bit for bit: every capture point and the logits
// of a free run, on every architecture and stored dtype.
TEST_F(GpuEngineQuantized, PlannedLoaderPlacesUnquantizedWeightsAsTheBf16LoaderDoes) {
  const fs::path root = test_root("planned_vs_bf16");
  struct Case {
    std::string arch;
    DType dtype;
  };
  const std::vector<Case> cases = {
      {"llama", DType::kBF16},   {"qwen3", DType::kBF16},    {"qwen3-moe", DType::kBF16},
      {"mistral", DType::kBF16}, {"chatglm2", DType::kBF16}, {"qwen3.5", DType::kBF16},
      {"llama", DType::kF32},    {"qwen3.5", DType::kF16},   {"qwen3-moe", DType::kF16}};
  for (const Case& c : cases) {
    const std::string label = c.arch + "." + std::string(dtype_name(c.dtype));
    SCOPED_TRACE(label);
    const fs::path dir = root / label;
    if (!fs::exists(dir)) {
      fixtures::FixtureSpec spec;
      spec.arch = fixtures::parse_fixture_arch(c.arch);
      spec.seed = 11;
      spec.dtype = c.dtype;
      fixtures::write_fp_checkpoint(spec, dir, OverwritePolicy::kRefuse);
    }
    const ModelConfig cfg = load_model_config(dir / "config.json");
    // (8 positions: the Mistral fixture's sliding window, past which the engine refuses)
    const golden::TokenInputs in = golden::synthetic_inputs(3, 8, cfg.vocab, 5);
    std::vector<golden::Golden> dumps;
    size_t bytes[2] = {0, 0};
    for (const bool planned : {false, true}) {
      gpu::GpuLoadOptions lo;
      lo.planned_even_if_unquantized = planned;
      auto model = gpu::load_gpu_model(dir, nullptr, lo);
      EXPECT_EQ(model->scheme, "bf16");
      bytes[planned] = model->weight_bytes;
      gpu::Engine e(std::move(model), fixture_engine_options());
      dumps.push_back(gpu::engine_golden(e, in, "*", true, nullptr));
    }
    EXPECT_EQ(bytes[0], bytes[1]) << "device weight bytes";
    const golden::Golden &a = dumps[0], &b = dumps[1];
    ASSERT_EQ(a.points.size(), b.points.size());
    for (size_t i = 0; i < a.points.size(); ++i) {
      ASSERT_EQ(a.points[i].name, b.points[i].name);
      EXPECT_EQ(a.points[i].values.data, b.points[i].values.data)
          << a.points[i].name << " differs between the loaders";
    }
    EXPECT_EQ(a.logits.data, b.logits.data) << "logits differ between the loaders";
    std::cout << label << ": planned and bf16 loaders bit-identical over " << a.points.size()
              << " points and the logits\n";
  }
}

TEST_F(GpuEngineQuantized, WeightOnlySchemesMatchTheReferenceOnAllArchitectures) {
  const fs::path root = test_root("rows");
  for (const std::string scheme : {"w8a16-ch",
                                   "w8a16-g64",
                                   "w4a16-g32",
                                   "ct-w4a16-g128",
                                   "ct-w4a16-g128-asym",
                                   "ct-w8a16-g128",
                                   "ct-w8a16-ch-asym",
                                   "w8a8-static",
                                   "w8a8s",
                                   "smoothquant",
                                   "w8a8-int8-dyn",
                                   "ct-w8a8-int8-static-asym",
                                   "ct-w8a8-int8-wtensor-static",
                                   "w4a8-dyn",
                                   "fp8-tensor",
                                   "fp8-channel",
                                   "fp8-block",
                                   "mxfp8",
                                   "mxfp4",
                                   "nvfp4",
                                   "mxfp4a16",
                                   "nvfp4a16"})
    for (const std::string arch : {"llama", "qwen3", "qwen3-moe"})
      expect_scheme_rows(root, arch, scheme);
  fs::remove_all(root);
}

// compressed-tensors points new on the GPU: act order (the inputs gathered into the codes' column
// order), FP8 weights with bf16 inputs (per tensor, channel, block; MXFP8A16), and the WnA8 /
// WnAFP8 presets W4A8 and W4AFP8 (group-scaled integer GEMM over per-token int8 / fp8 codes).
TEST_F(GpuEngineQuantized, ActOrderFp8WeightOnlyAndW4A8MatchTheReferenceOnAllArchitectures) {
  const fs::path root = test_root("ct_points");
  for (const std::string scheme :
       {"ct-w4a16-g128-actorder", "ct-w8a16-g128-actorder", "fp8-tensor-a16", "fp8-channel-a16",
        "fp8-block-a16", "mxfp8a16", "ct-w4a8-g128", "ct-w4afp8-g128"})
    for (const std::string arch : {"llama", "qwen3", "qwen3-moe"})
      expect_scheme_rows(root, arch, scheme);
  fs::remove_all(root);
}

// compressed-tensors' 2:4 sparse storage (sparse-24-bitmask) on the points vLLM's
// CompressedTensors24 runs (unquantized, fp8 and int8 W8A8): the host loader decompresses the
// `weight` parts exactly, and the engine runs the dense method.
TEST_F(GpuEngineQuantized, SparseCompressedCheckpointsMatchTheReference) {
  const fs::path root = test_root("sparse");
  for (const std::string scheme : {"bf16", "fp8-channel", "fp8-tensor", "w8a8-int8-dyn"})
    for (const std::string arch : {"llama", "qwen3-moe"})
      expect_scheme_rows(root, arch, scheme, "sparse-24-bitmask");
  fs::remove_all(root);
}

// Qwen3.5 (hybrid Gated DeltaNet) in the schemes its producers write (compressed-tensors, the
// Gated DeltaNet's projections left unquantized): the full-attention layers' quantized qkv in
// the checkpoint's rows, gathered into the kernels' [q | k | v | gate] row (rope_layout.h
// kernel_qkv_sources), an unquantized one (kv-fp8) moved row by row at load.
TEST_F(GpuEngineQuantized, Qwen35CompressedTensorsSchemesMatchTheReference) {
  const fs::path root = test_root("qwen35");
  for (const std::string scheme : {"w8a8-int8-dyn", "w4a16-g32", "fp8-tensor", "fp8-channel",
                                   "fp8-block", "mxfp8", "mxfp4", "nvfp4", "kv-fp8"})
    expect_scheme_rows(root, "qwen3.5", scheme);
  fs::remove_all(root);
}

TEST_F(GpuEngineQuantized, BatchesAreInvariantForQuantizedLinears) {
  // A sequence's logits alone and beside others in one forward: the weight-only kernels sum each
  // token on its own, and batches of up to kSkinnyMaxM tokens keep attention's order too.
  const fs::path root = test_root("batch");
  const fs::path dir = quantized_fixture(root, "qwen3", "w4a16-g32");
  gpu::EngineOptions eo;
  eo.max_tokens = 64;
  eo.max_seqs = 8;
  eo.max_context = 64;
  gpu::Engine e(gpu::load_gpu_model(dir, nullptr), eo);
  const int64_t vocab = e.config().vocab;
  gpu::Batch one, many;
  for (int32_t s = 0; s < 4; ++s) {
    many.tokens.push_back(11 + 7 * s);
    many.slots.push_back(s);
    many.positions.push_back(0);
  }
  one.tokens = {many.tokens[2]};
  one.slots = {0};
  one.positions = {0};
  e.forward(many);
  const std::vector<float> batched = e.logits_host(4);
  for (int32_t s = 0; s < 4; ++s)
    e.release(s);
  e.forward(one);
  const std::vector<float> alone = e.logits_host(1);
  EXPECT_TRUE(std::equal(alone.begin(), alone.end(), batched.begin() + 2 * vocab));
  fs::remove_all(root);
}

TEST_F(GpuEngineQuantized, GraphDecodeEqualsEagerDecodeForEveryKernelFamily) {
  // Decode steps through CUDA graphs capture the quantized methods' launches (the activation
  // quantizers, the dp4a / fp8 / weight-only GEMMs, fp8's per-tensor amax reset): every step's
  // logits must equal the eager forward's bit for bit.
  const fs::path root = test_root("graphs");
  for (const std::string scheme :
       {"w4a16-g32", "w8a8-static", "w8a8-int8-dyn", "fp8-tensor", "fp8-channel", "fp8-block"}) {
    SCOPED_TRACE(scheme);
    const fs::path dir = quantized_fixture(root, "qwen3", scheme);
    gpu::EngineOptions eo;
    eo.max_tokens = 64;
    eo.max_seqs = 4;
    eo.max_context = 64;
    gpu::Engine e(gpu::load_gpu_model(dir, nullptr), eo);
    const int64_t vocab = e.config().vocab;
    std::vector<std::vector<float>> out[2];
    for (const bool graph : {false, true}) {
      gpu::Batch prefill;
      for (int32_t i = 0; i < 8; ++i)
        prefill.tokens.push_back(3 + 11 * i), prefill.slots.push_back(0),
            prefill.positions.push_back(i);
      e.forward(prefill);
      for (int32_t i = 8; i < 14; ++i) {
        gpu::Batch step;
        step.tokens = {7 + 5 * i}, step.slots = {0}, step.positions = {i};
        graph ? e.forward_graph(step) : e.forward(step);
        out[graph].push_back(e.logits_host(1));
      }
      e.release(0);
    }
    for (size_t j = 0; j < out[0].size(); ++j)
      EXPECT_TRUE(std::equal(out[0][j].begin(), out[0][j].begin() + vocab, out[1][j].begin()))
          << "graph decode differs from eager decode at step " << j;
  }
  fs::remove_all(root);
}

// The engine's row for a quantized KV cache: layer-local against the reference golden within the
// scheme's engine policy at every point, the cache's own points included; the compare's KV error
// by position comes from them; the free run by top-1 agreement.
// ChatGLM2 in msModelSlim's formats (its own example model): the fused query_key_value cut into
// q/k/v under canonical names, q / k rows re-laid out for the rotate-half RoPE kernels (scales,
// offsets, quant_bias, deq_scale and the C8 key scales with them; W4A8's int4 row pairs unpacked
// and packed again), the q/k/v biases added after the projection. Layer-local within each scheme's
// policy; a w8a8 failure must be explained by inherited activation-code flips (code_flips.h).
TEST_F(GpuEngineQuantized, ChatGlm2MsModelSlimSchemesMatchTheReference) {
  const fs::path root = test_root("chatglm2");
  for (const std::string scheme :
       {"w8a16-ch", "w8a16-g64", "w8a8-static", "w8a8s", "w4a8-dyn", "smoothquant", "kv-int8"}) {
    SCOPED_TRACE("chatglm2 " + scheme);
    const golden::Policy policy =
        golden::load_policy(fs::path(QPARITY_SOURCE_DIR) / "policies" / (scheme + ".json"));
    golden::CompareOptions co;
    co.policy = &policy;
    const fs::path dir = quantized_fixture(root, "chatglm2", scheme);
    const ModelConfig cfg = load_model_config(dir / "config.json");
    const gpu::EngineOptions eo = fixture_engine_options();
    auto model = gpu::load_gpu_model(dir, nullptr);
    EXPECT_EQ(model->scheme, scheme);
    // The bias is the quantized method's (its epilogue) or, for a bf16 qkv, the decoder's.
    EXPECT_NE(model->layers[0].qkv_q != nullptr, model->layers[0].qkv_bias.size() > 0);
    gpu::Engine e(std::move(model), eo);
    golden::ReferenceRunOptions ro;
    ro.mode = reference::PrecisionMode::kEmulate;
    ro.dialect = Dialect::kVllm;
    const golden::TokenInputs in = golden::synthetic_inputs(3, 32, cfg.vocab, 5);
    const fs::path gfile = root / (scheme + ".ref.h5"), lfile = root / (scheme + ".local.h5");
    golden::write_golden(gfile, golden::run_reference(dir, in, ro, nullptr),
                         OverwritePolicy::kReplace);
    const golden::GoldenReader ref = golden::GoldenReader::open(gfile);
    golden::write_golden(lfile, gpu::engine_golden_local(e, ref, "*", nullptr),
                         OverwritePolicy::kReplace);
    const golden::CompareReport r =
        golden::compare_goldens(ref, golden::GoldenReader::open(lfile), co);
    expect_pass_or_code_flips(r, scheme.rfind("w8a8", 0) == 0 || scheme == "w4a8-dyn",
                              "chatglm2 " + scheme);
    const auto [worst, where] = worst_point(r);
    std::cout << "chatglm2 " << scheme << ": layer-local " << golden::to_string(r.verdict)
              << ", worst rel_l2 " << worst << " at " << where << "\n";
  }
  fs::remove_all(root);
}

TEST_F(GpuEngineQuantized, QuantizedKvCachesMatchTheReferenceOnAllArchitectures) {
  const fs::path root = test_root("kv");
  for (const std::string scheme : {"kv-int8", "kv-fp8", "kv-fp8-head"}) {
    const golden::Policy policy =
        golden::load_policy(fs::path(QPARITY_SOURCE_DIR) / "policies" / (scheme + ".json"));
    golden::CompareOptions co;
    co.policy = &policy;
    for (const std::string arch : {"llama", "qwen3", "qwen3-moe"}) {
      SCOPED_TRACE(arch + " " + scheme);
      const fs::path dir = quantized_fixture(root, arch, scheme);
      const ModelConfig cfg = load_model_config(dir / "config.json");
      auto model = gpu::load_gpu_model(dir, nullptr);
      EXPECT_EQ(model->layers[0].kv.quant.fp8_heads != nullptr, scheme == "kv-fp8-head");
      EXPECT_EQ(model->scheme, scheme);
      EXPECT_EQ(model->layers[0].kv.quant.format,
                scheme == "kv-int8" ? gpu::KvCacheFormat::kInt8 : gpu::KvCacheFormat::kFp8E4m3);
      const gpu::EngineOptions eo = fixture_engine_options();
      gpu::Engine e(std::move(model), eo);
      golden::ReferenceRunOptions ro;
      ro.mode = reference::PrecisionMode::kEmulate;
      ro.dialect = Dialect::kVllm;
      const golden::TokenInputs in = golden::synthetic_inputs(3, 32, cfg.vocab, 5);
      const std::string base = arch + "." + scheme;
      const fs::path gfile = root / (base + ".ref.h5"), lfile = root / (base + ".local.h5"),
                     ffile = root / (base + ".free.h5");
      golden::write_golden(gfile, golden::run_reference(dir, in, ro, nullptr),
                           OverwritePolicy::kReplace);
      const golden::GoldenReader ref = golden::GoldenReader::open(gfile);
      ASSERT_TRUE(ref.has_point("layers.0.attn.k_cache"));
      golden::write_golden(lfile, gpu::engine_golden_local(e, ref, "*", nullptr),
                           OverwritePolicy::kReplace);
      const golden::CompareReport r =
          golden::compare_goldens(ref, golden::GoldenReader::open(lfile), co);
      EXPECT_EQ(r.verdict, golden::Judgement::kPass) << golden::to_text(r);
      EXPECT_TRUE(r.missing_in_candidate.empty());
      EXPECT_EQ(r.kv_error_source, "attn.k_cache+attn.v_cache");
      double worst_cache = 0;
      int64_t cache_points = 0;
      for (const auto& p : r.points)
        if (p.name.ends_with(".attn.k_cache") || p.name.ends_with(".attn.v_cache"))
          ++cache_points, worst_cache = std::max(worst_cache, p.stats.rel_l2);
      EXPECT_EQ(cache_points, 2 * cfg.num_layers);
      golden::write_golden(ffile, gpu::engine_golden(e, in, "*", true, nullptr),
                           OverwritePolicy::kReplace);
      const golden::CompareReport fr =
          golden::compare_goldens(ref, golden::GoldenReader::open(ffile), {});
      EXPECT_GE(fr.e2e.top1.lo, 0.75) << golden::to_text(fr);
      std::cout << base << ": layer-local worst cache-point rel_l2 " << worst_cache
                << "; free run mean KLD " << fr.e2e.kld_mean.value << ", top-1 "
                << fr.e2e.top1.value << "\n";
    }
  }
  fs::remove_all(root);
}

// A K scale planted x1.5 in layer 1 (every key of that layer stored on another lattice): the
// engine's dump of the planted checkpoint, run layer-local on the clean checkpoint's golden, is
// within the policy at every point before layers.1.attn.k_cache and fails there first.
TEST_F(GpuEngineQuantized, PlantedKvScaleShowsFirstAtTheCache) {
  const fs::path root = test_root("kv_planted");
  const fs::path dir = quantized_fixture(root, "qwen3", "kv-fp8"), planted = root / "planted";
  fs::remove_all(planted);
  fs::copy(dir, planted, fs::copy_options::recursive);
  test::edit_tensor(
      planted, "model.layers.1.self_attn.k_scale",
      [](const TensorInfo& info, std::vector<uint8_t>& bytes) {
        ASSERT_TRUE(info.dtype == DType::kF32 || info.dtype == DType::kBF16);
        const size_t w = info.dtype == DType::kF32 ? 4 : 2;
        for (size_t i = 0; i < bytes.size(); i += w) {
          uint32_t u = 0;
          std::memcpy(reinterpret_cast<uint8_t*>(&u) + (w == 2 ? 2 : 0), &bytes[i], w);
          float f;
          std::memcpy(&f, &u, 4);
          f *= 1.5f;  // 1.5 is exact in bf16's mantissa
          std::memcpy(&u, &f, 4);
          std::memcpy(&bytes[i], reinterpret_cast<uint8_t*>(&u) + (w == 2 ? 2 : 0), w);
        }
      });
  const golden::Policy policy =
      golden::load_policy(fs::path(QPARITY_SOURCE_DIR) / "policies" / "kv-fp8.json");
  golden::CompareOptions co;
  co.policy = &policy;
  co.allow_other_checkpoint = true;  // the engine runs the planted copy on purpose
  const ModelConfig cfg = load_model_config(dir / "config.json");
  golden::ReferenceRunOptions ro;
  ro.mode = reference::PrecisionMode::kEmulate;
  ro.dialect = Dialect::kVllm;
  const fs::path gfile = root / "clean.ref.h5", lfile = root / "planted.local.h5";
  golden::write_golden(
      gfile, golden::run_reference(dir, golden::synthetic_inputs(2, 16, cfg.vocab, 3), ro, nullptr),
      OverwritePolicy::kReplace);
  const golden::GoldenReader ref = golden::GoldenReader::open(gfile);
  gpu::EngineOptions eo;
  eo.max_tokens = 64;
  eo.max_seqs = 4;
  eo.max_context = 64;
  gpu::Engine e(gpu::load_gpu_model(planted, nullptr), eo);
  golden::write_golden(lfile, gpu::engine_golden_local(e, ref, "*", nullptr),
                       OverwritePolicy::kReplace);
  const golden::CompareReport r =
      golden::compare_goldens(ref, golden::GoldenReader::open(lfile), co);
  EXPECT_EQ(r.verdict, golden::Judgement::kFail);
  ASSERT_GE(r.first_failing, 0) << golden::to_text(r);
  EXPECT_EQ(r.points[static_cast<size_t>(r.first_failing)].name, "layers.1.attn.k_cache")
      << golden::to_text(r);
  std::cout << "planted k_scale x1.5: first failing point "
            << r.points[static_cast<size_t>(r.first_failing)].name << ", rel_l2 "
            << r.points[static_cast<size_t>(r.first_failing)].stats.rel_l2 << "\n";
  fs::remove_all(root);
}

// Quantized MoE experts (each expert its own GPU method; grouped launches on the device for
// decode-sized batches, per expert from the host's grouping otherwise): every scheme the GPU
// runs on experts, on the Qwen3-MoE fixture with its experts quantized too, layer-local
// against the reference golden within the scheme's engine policy (moe.expert_out included), the
// free run by top-1 agreement; fp8-tensor's w13 scales unified by the shared processing.
TEST_F(GpuEngineQuantized, QuantizedExpertsMatchTheReference) {
  const fs::path root = test_root("experts");
  for (const std::string scheme : {"w8a16-ch", "w8a16-g64", "w4a16-g32", "ct-w4a16-g128",
                                   "ct-w4a16-g128-asym", "w8a8-int8-dyn", "w4a8-dyn", "fp8-tensor",
                                   "fp8-channel", "fp8-block", "mxfp8", "mxfp4", "nvfp4"}) {
    SCOPED_TRACE(scheme);
    const golden::Policy policy =
        golden::load_policy(fs::path(QPARITY_SOURCE_DIR) / "policies" / (scheme + ".json"));
    golden::CompareOptions co;
    co.policy = &policy;
    const fs::path dir = quantized_fixture(root, "qwen3-moe", scheme, true);
    const ModelConfig cfg = load_model_config(dir / "config.json");
    auto model = gpu::load_gpu_model(dir, nullptr);
    if (!model->layers[0].quantized_experts()) {
      // The fixture's expert shapes break the scheme's rule (fp8-block: K % 128), so the
      // quantizer left them bf16: nothing of this test applies.
      std::cout << scheme << ": the fixture's experts stay bf16 under this scheme's rules\n";
      continue;
    }
    EXPECT_EQ(model->layers[0].w13_q.size(), static_cast<size_t>(cfg.num_experts));
    const gpu::EngineOptions eo = fixture_engine_options();
    gpu::Engine e(std::move(model), eo);
    // Decode-sized batches run the stacks as grouped launches on the device (the 3 x 4 tokens
    // below, and the free run's decode steps); nvfp4 / mxfp4 (packed), w8a8-int8-dyn and
    // w4a8-dyn stay on the per-expert host path. The 3 x 32 tokens take the host path in every
    // scheme.
    const bool grouped =
        scheme != "nvfp4" && scheme != "mxfp4" && scheme != "w8a8-int8-dyn" && scheme != "w4a8-dyn";
    EXPECT_EQ(e.moe_on_device(3 * gpu::kSkinnyMaxM), grouped);
    EXPECT_FALSE(e.moe_on_device(3 * 32));
    golden::ReferenceRunOptions ro;
    ro.mode = reference::PrecisionMode::kEmulate;
    ro.dialect = Dialect::kVllm;
    for (const int64_t seq_len : {int64_t{32}, gpu::kSkinnyMaxM}) {
      SCOPED_TRACE("seq_len " + std::to_string(seq_len));
      const golden::TokenInputs in = golden::synthetic_inputs(3, seq_len, cfg.vocab, 5);
      const std::string base = scheme + "." + std::to_string(seq_len);
      const fs::path gfile = root / (base + ".ref.h5"), lfile = root / (base + ".local.h5"),
                     ffile = root / (base + ".free.h5");
      golden::write_golden(gfile, golden::run_reference(dir, in, ro, nullptr),
                           OverwritePolicy::kReplace);
      const golden::GoldenReader ref = golden::GoldenReader::open(gfile);
      golden::write_golden(lfile, gpu::engine_golden_local(e, ref, "*", nullptr),
                           OverwritePolicy::kReplace);
      const golden::CompareReport r =
          golden::compare_goldens(ref, golden::GoldenReader::open(lfile), co);
      EXPECT_EQ(r.verdict, golden::Judgement::kPass) << golden::to_text(r);
      double worst = 0;
      for (const auto& p : r.points)
        if (p.name.ends_with("moe.expert_out")) worst = std::max(worst, p.stats.rel_l2);
      if (grouped && seq_len == gpu::kSkinnyMaxM) {
        // The grouped launches and the per-expert host path give the same bits.
        gpu::EngineOptions host_eo = eo;
        host_eo.grouped_experts = false;
        gpu::Engine host(gpu::load_gpu_model(dir, nullptr), host_eo);
        ASSERT_FALSE(host.moe_on_device(3 * gpu::kSkinnyMaxM));
        const fs::path hfile = root / (base + ".host.h5");
        golden::write_golden(hfile, gpu::engine_golden_local(host, ref, "*", nullptr),
                             OverwritePolicy::kReplace);
        const golden::CompareReport same = golden::compare_goldens(
            golden::GoldenReader::open(lfile), golden::GoldenReader::open(hfile), {});
        int64_t expert_points = 0;
        for (const auto& p : same.points) {
          EXPECT_EQ(p.stats.max_abs, 0.0) << p.name << ": grouped vs host path";
          expert_points += p.name.ends_with("moe.expert_out");
        }
        EXPECT_GT(expert_points, 0);
      }
      golden::write_golden(ffile, gpu::engine_golden(e, in, "*", true, nullptr),
                           OverwritePolicy::kReplace);
      const golden::CompareReport fr =
          golden::compare_goldens(ref, golden::GoldenReader::open(ffile), {});
      EXPECT_GE(fr.e2e.top1.lo, 0.75) << golden::to_text(fr);
      std::cout << "qwen3-moe " << base << " (experts quantized): layer-local worst expert_out "
                << "rel_l2 " << worst << "; free run mean KLD " << fr.e2e.kld_mean.value
                << ", top-1 " << fr.e2e.top1.value << "\n";
    }
  }
  fs::remove_all(root);
}

// A model whose first MoE layer keeps bf16 experts and whose others have quantized ones: a
// decode-sized batch runs the first through the grouped skinny GEMMs and the others through the
// grouped quantized launches, in one forward, every point within the scheme's policy.
TEST_F(GpuEngineQuantized, MixedBf16AndQuantizedExpertLayers) {
  const fs::path root = test_root("mixed");
  const std::string scheme = "w4a16-g32";
  // The small Qwen3-MoE fixture (MoE layers 0-2; the tiny one has a single MoE layer), layer 0's
  // experts left bf16.
  fixtures::FixtureSpec spec;
  spec.arch = Arch::kQwen3Moe;
  spec.size = fixtures::FixtureSize::kSmall;
  spec.seed = 7;
  const fs::path fp = root / "qwen3-moe-small.fp", dir = root / "qwen3-moe-small.mixed";
  fixtures::write_fp_checkpoint(spec, fp, OverwritePolicy::kReplace);
  const ModelConfig cfg = load_model_config(fp / "config.json");
  fixtures::QuantizeCheckpointOptions qo;
  qo.ignore_unsupported = true;
  qo.ignore = {"re:model\\.layers\\.0\\.mlp\\.experts\\..*"};
  fixtures::quantize_checkpoint(
      fp, parse_scheme_id(scheme), Dialect::kVllm, dir,
      fixtures::calibrate_checkpoint(fp, reference::synthetic_tokens(32, cfg.vocab, 7)),
      OverwritePolicy::kReplace, nullptr, qo);
  auto model = gpu::load_gpu_model(dir, nullptr);
  ASSERT_GE(model->layers.size(), 2u);
  ASSERT_FALSE(model->layers[0].quantized_experts());
  ASSERT_TRUE(model->layers[1].quantized_experts());
  gpu::EngineOptions eo;
  eo.max_tokens = 64;
  eo.max_seqs = 4;
  eo.max_context = 64;
  gpu::Engine e(std::move(model), eo);
  EXPECT_TRUE(e.moe_on_device(gpu::kSkinnyMaxM));
  const golden::Policy policy =
      golden::load_policy(fs::path(QPARITY_SOURCE_DIR) / "policies" / (scheme + ".json"));
  golden::CompareOptions co;
  co.policy = &policy;
  golden::ReferenceRunOptions ro;
  ro.mode = reference::PrecisionMode::kEmulate;
  ro.dialect = Dialect::kVllm;
  const golden::TokenInputs in = golden::synthetic_inputs(1, gpu::kSkinnyMaxM, cfg.vocab, 9);
  const fs::path gfile = root / "mixed.ref.h5", lfile = root / "mixed.local.h5";
  golden::write_golden(gfile, golden::run_reference(dir, in, ro, nullptr),
                       OverwritePolicy::kReplace);
  const golden::GoldenReader ref = golden::GoldenReader::open(gfile);
  golden::write_golden(lfile, gpu::engine_golden_local(e, ref, "*", nullptr),
                       OverwritePolicy::kReplace);
  const golden::CompareReport r =
      golden::compare_goldens(ref, golden::GoldenReader::open(lfile), co);
  // Every point within the policy (the end-to-end gates need more than 4 tokens to judge; the
  // MoE points must be exact here: both layers' experts match the reference's bits).
  EXPECT_LT(r.first_failing, 0) << golden::to_text(r);
  int64_t expert_points = 0;
  for (const auto& p : r.points)
    if (p.name.ends_with("moe.expert_out")) {
      ++expert_points;
      EXPECT_EQ(p.stats.rel_l2, 0.0) << p.name;
    }
  EXPECT_EQ(expert_points, 3);
  fs::remove_all(root);
}

// No device needed below: the refusals come before any weight is read.
TEST(GpuEngineQuantizedLoader, RefusesWhatTheGpuCannotRunByName) {
  const fs::path root = test_root("refuse");
  const auto refusal = [&](const std::string& arch, const std::string& scheme) {
    return test::error_of(
        [&] { gpu::load_gpu_model(test::tiny_checkpoint(root, arch, scheme, 3), nullptr); });
  };
  // An ideal-dialect fp8-block file whose k/v partitions are not multiples of 128: the vllm
  // loader's own rule, naming the tensor.
  EXPECT_THAT(refusal("llama", "fp8-block"),
              AllOf(HasSubstr("k_proj.weight_scale"), HasSubstr("not a multiple of block_n 128")));
  EXPECT_THAT(refusal("qwen3-moe", "w8a8-static"),
              AllOf(HasSubstr("experts"), HasSubstr("quantized MoE experts"),
                    HasSubstr("static-activation int8 MoE experts are not on the GPU yet")));
  // WnA8 points of widths the integer kernels do not take: never run as bf16.
  for (const char* s : {"ct-w3a8-g128", "ct-w2a8-g128"})
    EXPECT_THAT(refusal("llama", s),
                AllOf(HasSubstr(s), HasSubstr("the GPU's integer-weight kernels take 4 or 8 bits"),
                      HasSubstr("never runs a quantized layer as bf16")));
  // SpinQuant R4 (an online Hadamard on down_proj's input): the reference applies it, the GPU
  // refuses the layer by name rather than run it unrotated.
  const fs::path fp = test::tiny_checkpoint(root, "llama", "bf16", 3), r4 = root / "llama.r4";
  fixtures::QuantizeCheckpointOptions o;
  o.transform_config = Json::parse(R"({"config_groups": {"R4": {"type": "hadamard", "apply": [
      {"targets": ["re:.*down_proj$"], "location": "input"},
      {"targets": ["re:.*down_proj$"], "location": "weight_input", "inverse": true}]}}})");
  fixtures::quantize_checkpoint(fp, parse_scheme_id("fp8-channel"), Dialect::kIdeal, r4, {},
                                OverwritePolicy::kRefuse, nullptr, o);
  EXPECT_THAT(
      test::error_of([&] { gpu::load_gpu_model(r4, nullptr); }),
      AllOf(HasSubstr("model.layers.0.mlp.down_proj"), HasSubstr("online input hadamard transform"),
            HasSubstr("not run on the GPU yet")));
  fs::remove_all(root);
}

}  // namespace
}  // namespace qparity
