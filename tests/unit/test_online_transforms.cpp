// compressed-tensors' online transforms (transform_config locations input / output: QuIP's V and
// U, SpinQuant's R4): planned on the linears their targets match, their matrices read from the
// checkpoint (one saved copy per group and size), applied around the layer in fp64; written by
// quantize as compressed-tensors leaves a model (offline locations fused, online matrices saved).
// The applied matrix is checked against compressed-tensors' HadamardTransform.forward written out
// here independently; the written checkpoint's logits against the unrotated model's.
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <cmath>
#include <cstring>
#include <filesystem>
#include <functional>
#include <map>
#include <random>
#include <string>
#include <vector>

#include "core/error.h"
#include "core/json_util.h"
#include "core/safetensors/checkpoint.h"
#include "core/safetensors/safetensors_writer.h"
#include "fixtures/checkpoint_quantizer.h"
#include "fixtures/fixture_model.h"
#include "reference_cpu/models/model_loader.h"
#include "schemes/description/compressed_tensors_config.h"
#include "schemes/description/quant_plan.h"
#include "schemes/method/linear_transforms.h"
#include "schemes/method/tensor_decode.h"
#include "tests/unit/error_of.h"

namespace qparity {
namespace {

namespace fs = std::filesystem;
using test::error_of;
using ::testing::AllOf;
using ::testing::HasSubstr;

// hidden 256, 4 heads of 64, 2 KV heads (k/v out 128), intermediate 512.
ModelConfig tiny_llama() {
  return parse_model_config(Json::parse(R"({
    "architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 256,
    "intermediate_size": 512, "num_attention_heads": 4, "num_key_value_heads": 2,
    "num_hidden_layers": 2, "vocab_size": 1000, "rms_norm_eps": 1e-5,
    "torch_dtype": "bfloat16", "tie_word_embeddings": false})"),
                            "config.json");
}

// llm-compressor's QuIPModifier defaults (modifiers/transform/quip/base.py: _create_v_scheme,
// _create_u_scheme; rotations ["v", "u"], targets "Linear", ignore "lm_head", precision float64)
// with the type and randomize given.
std::string quip(const std::string& type, bool randomize = false) {
  const std::string common = R"("type": ")" + type + R"(", "randomize": )" +
                             (randomize ? "true" : "false") +
                             R"(, "requires_grad": false, "head_dim": null,
      "precision": "torch.float64")";
  return R"({"config_groups": {
    "v": {)" +
         common + R"(, "apply": [
      {"targets": ["Linear"], "location": "input", "inverse": false, "ignore": ["lm_head"]},
      {"targets": ["Linear"], "location": "weight_input", "inverse": true, "ignore": ["lm_head"]}]},
    "u": {)" +
         common + R"(, "apply": [
      {"targets": ["Linear"], "location": "weight_output", "inverse": false, "ignore": ["lm_head"]},
      {"targets": ["Linear"], "location": "output", "inverse": true, "ignore": ["lm_head"]}]}}})";
}

Json ct_block(const std::string& transform) {
  Json qc = Json::parse(R"({"quant_method": "compressed-tensors", "format": "float-quantized",
      "ignore": ["lm_head"], "config_groups": {"FP8_DYNAMIC": ["Linear"]}})");
  qc["transform_config"] = Json::parse(transform);
  return qc;
}

const OnlineTransform* transform_at(const PlanEntry& e, TransformLocation l) {
  for (const OnlineTransform& t : e.transforms)
    if (t.location == l) return &t;
  return nullptr;
}

TEST(OnlineTransformPlan, QuipPutsAnInputAndAnOutputRotationOnEveryTargetedLinear) {
  const QuantPlan p =
      plan_from_quantization_config(tiny_llama(), ct_block(quip("hadamard")), "config.json");
  const PlanEntry& q = p.method_for("model.layers.0.self_attn.q_proj");
  const OnlineTransform* in = transform_at(q, TransformLocation::kInput);
  const OnlineTransform* out = transform_at(q, TransformLocation::kOutput);
  ASSERT_TRUE(in && out);
  EXPECT_EQ(in->group, "v");
  EXPECT_FALSE(in->inverse);
  EXPECT_EQ(in->size, 256);
  EXPECT_EQ(in->precision, "float64");
  EXPECT_EQ(out->group, "u");
  EXPECT_TRUE(out->inverse);
  EXPECT_EQ(out->size, 256);
  EXPECT_EQ(
      transform_at(p.method_for("model.layers.1.self_attn.k_proj"), TransformLocation::kOutput)
          ->size,
      128);
  EXPECT_EQ(
      transform_at(p.method_for("model.layers.1.mlp.down_proj"), TransformLocation::kInput)->size,
      512);
  EXPECT_TRUE(p.method_for("lm_head").transforms.empty());
  const Json j = p.to_json();
  bool listed = false;
  for (const Json& m : j.at("modules"))
    if (m.at("prefix") == "model.layers.0.mlp.down_proj" && m.contains("online_transforms"))
      for (const Json& t : m.at("online_transforms"))
        listed = listed || t.at("tensor") == "model.layers.0.mlp.down_proj.v_input.weight";
  EXPECT_TRUE(listed) << j.dump();
}

// llm-compressor's SpinQuantModifier R2 (offline, per head) and R4 (down_proj's input online)
// with the Llama mappings (spinquant/base.py _create_r2_scheme / _create_r4_scheme).
TEST(OnlineTransformPlan, SpinQuantR4RotatesTheDownProjectionInputAndR2IsInTheWeights) {
  const std::string spin = R"({"config_groups": {
    "R2": {"type": "hadamard", "head_dim": 64, "apply": [
      {"targets": ["re:.*v_proj$"], "location": "weight_output"},
      {"targets": ["re:.*o_proj$"], "location": "weight_input", "inverse": true}]},
    "R4": {"type": "hadamard", "apply": [
      {"targets": ["re:.*down_proj$"], "location": "input"},
      {"targets": ["re:.*down_proj$"], "location": "weight_input", "inverse": true}]}}})";
  const QuantPlan p = plan_from_quantization_config(tiny_llama(), ct_block(spin), "config.json");
  for (const PlanEntry& e : p) {
    const bool down = e.prefix.ends_with("down_proj");
    EXPECT_EQ(e.transforms.size(), down ? 1u : 0u) << e.prefix;
  }
  EXPECT_EQ(p.method_for("model.layers.0.mlp.down_proj").transforms[0].stem(), "R4_input");
  bool warned = false;
  for (const std::string& w : p.warnings())
    warned = warned || (w.find("config_groups.R2") != std::string::npos &&
                        w.find("offline locations only") != std::string::npos);
  EXPECT_TRUE(warned);
}

TEST(OnlineTransformPlan, WhatNoEngineRunsIsRefusedNamingTheKey) {
  auto plan = [](const std::string& t) {
    plan_from_quantization_config(tiny_llama(), ct_block(t), "config.json");
  };
  // SpinQuant R3 (spinquant/base.py _create_r3_scheme): queries and cached keys.
  EXPECT_THAT(error_of([&] {
                plan(R"({"config_groups": {"R3": {"type": "hadamard", "head_dim": 64, "apply": [
                  {"targets": ["re:.*self_attn$"], "location": "q_attn"},
                  {"targets": ["re:.*self_attn$"], "location": "k_cache"}]}}})");
              }),
              AllOf(HasSubstr("transform_config.config_groups.R3.apply[0].location"),
                    HasSubstr("SpinQuant R3"), HasSubstr("vLLM refuses it as well")));
  EXPECT_THAT(error_of([&] {
                plan(R"({"config_groups": {"e": {"type": "hadamard", "apply": [
                  {"targets": ["re:.*embed_tokens$"], "location": "output"}]}}})");
              }),
              AllOf(HasSubstr("config_groups.e.apply[0]"), HasSubstr("model.embed_tokens"),
                    HasSubstr("which is not a linear")));
  EXPECT_THAT(error_of([&] {
                plan(R"({"config_groups": {
                  "a": {"type": "hadamard", "apply": [{"targets": ["Linear"], "location": "input",
                        "ignore": ["lm_head"]}]},
                  "b": {"type": "hadamard", "apply": [{"targets": ["re:.*q_proj$"],
                        "location": "input"}]}}})");
              }),
              AllOf(HasSubstr("config_groups.b.apply[0]"), HasSubstr("a second input transform")));
  EXPECT_THAT(error_of([&] {
                plan(R"({"config_groups": {"h": {"type": "hadamard", "head_dim": 48, "apply": [
                  {"targets": ["re:.*down_proj$"], "location": "input"}]}}})");
              }),
              HasSubstr("head_dim 48 does not divide model.layers.0.mlp.down_proj's in_features"));
  EXPECT_THAT(error_of([&] {
                plan(R"({"config_groups": {"h": {"type": "hadamard", "precision": "int8",
                  "apply": [{"targets": ["re:.*down_proj$"], "location": "input"}]}}})");
              }),
              HasSubstr("unknown precision 'int8'"));
  EXPECT_THAT(
      error_of([&] { plan(R"({"config_groups": {"h": {"type": "givens", "apply": []}}})"); }),
      HasSubstr("unknown transform type 'givens'"));
}

// compressed-tensors' HadamardTransform.forward, written out: weight[perm][:, perm], .T when
// inverse, value @ weight / sqrt(n); RandomMatrixTransform: value @ weight as stored.
TEST(OnlineTransformMatrix, IsCompressedTensorsForwardForEveryTypeInverseAndPermutation) {
  const int64_t n = 8;
  std::mt19937_64 rng(5);
  std::vector<double> h(n * n);
  for (int64_t i = 0; i < n; ++i)
    for (int64_t j = 0; j < n; ++j)
      h[i * n + j] = (__builtin_popcountll(static_cast<uint64_t>(i & j)) % 2 ? -1.0 : 1.0) *
                     (j % 3 == 0 ? -1.0 : 1.0);  // random-hadamard-like: signed columns
  const std::vector<int64_t> perm = {3, 0, 7, 1, 6, 2, 5, 4};
  Matrix x(3, 16);
  std::uniform_real_distribution<double> u(-1, 1);
  for (double& v : x.data)
    v = u(rng);
  for (const TransformType type :
       {TransformType::kHadamard, TransformType::kRandomHadamard, TransformType::kRandomMatrix})
    for (const bool inverse : {false, true})
      for (const bool permuted : {false, true}) {
        const std::vector<int64_t> p = permuted ? perm : std::vector<int64_t>{};
        const reference::TransformMatrix t = reference::applied_transform(type, inverse, n, h, p);
        const bool had = type != TransformType::kRandomMatrix;
        for (int64_t r = 0; r < n; ++r)
          for (int64_t c = 0; c < n; ++c) {
            // The permuted weight W[a][b] = h[perm[a]][perm[b]]; transposed: W[b][a].
            auto w = [&](int64_t a, int64_t b) {
              const int64_t pa = p.empty() ? a : p[a], pb = p.empty() ? b : p[b];
              return h[pa * n + pb];
            };
            const double want = (had && inverse ? w(c, r) : w(r, c)) / (had ? std::sqrt(8.0) : 1.0);
            ASSERT_EQ(t.t[r * n + c], want) << static_cast<int>(type) << inverse << permuted;
          }
        // Block diagonal over 16 features: each 8-column half times T, summed in fp64.
        const Matrix y = reference::apply_transform(x, t);
        for (int64_t i = 0; i < x.rows; ++i)
          for (int64_t b = 0; b < 2; ++b)
            for (int64_t c = 0; c < n; ++c) {
              double s = 0;
              for (int64_t r = 0; r < n; ++r)
                s += x(i, b * n + r) * t.t[r * n + c];
              ASSERT_NEAR(y(i, b * n + c), s, 1e-14);
            }
      }
}

fs::path scratch(const std::string& name) {
  const fs::path p = fs::temp_directory_path() /
                     ("qparity_test_transforms_" + std::to_string(::getpid()) + "_" + name);
  fs::remove_all(p);
  return p;
}

Matrix logits_of(const fs::path& dir) {
  auto model = reference::load_model(dir, reference::LoadOptions{});
  return model->forward(std::vector<int64_t>{1, 7, 42, 3, 99, 250, 12, 5});
}

double rel_l2(const Matrix& a, const Matrix& b) {
  double d = 0, n = 0;
  for (size_t i = 0; i < a.data.size(); ++i) {
    d += (a.data[i] - b.data[i]) * (a.data[i] - b.data[i]);
    n += b.data[i] * b.data[i];
  }
  return std::sqrt(d / n);
}

// QuIP as llm-compressor's QuIPModifier writes it for a model whose sizes are not all powers of
// two (transform_block_size 128: block-diagonal rotations), random-hadamard and randomized so that
// a wrong transposition or permutation cannot cancel.
std::string quip_blocks() {
  Json j = Json::parse(quip("random-hadamard", true));
  for (auto& [name, g] : j.at("config_groups").items())
    g["head_dim"] = 128;
  return j.dump();
}

fs::path trained_llama() {
  return fs::path(QPARITY_SOURCE_DIR) / "fixtures" / "trained" / "llama";
}

// quantize with QuIP's rotations, then the reference of the written checkpoint: the rotations
// cancel up to the quantization error, which is of the size the unrotated point has (QuIP's
// incoherence may make it smaller, never much larger); a linear the rotation targets but the
// quantization does not is stored rotated in bf16, so a run that rotates every linear but
// quantizes only down_proj is within bf16 rounding plus down_proj's error.
TEST(OnlineTransformCheckpoint, QuantizeWritesWhatTheReaderUndoesToTheQuantizationError) {
  const fs::path fp = trained_llama();
  const Matrix want = logits_of(fp);
  for (const char* scheme : {"ct-w8a16-ch", "fp8-channel"}) {
    const fs::path plain = scratch(std::string("plain_") + scheme),
                   rot = scratch(std::string("rot_") + scheme);
    fixtures::quantize_checkpoint(fp, parse_scheme_id(scheme), Dialect::kIdeal, plain, {},
                                  OverwritePolicy::kRefuse, nullptr);
    fixtures::QuantizeCheckpointOptions o;
    o.transform_config = Json::parse(quip_blocks());
    fixtures::quantize_checkpoint(fp, parse_scheme_id(scheme), Dialect::kIdeal, rot, {},
                                  OverwritePolicy::kRefuse, nullptr, o);
    const double e_plain = rel_l2(logits_of(plain), want), e_rot = rel_l2(logits_of(rot), want);
    std::cerr << scheme << ": logits rel L2 unrotated " << e_plain << ", QuIP " << e_rot << "\n";
    EXPECT_LT(e_rot, 2 * e_plain) << scheme;
    // One saved copy per group and size (one size: the 128 blocks), under the last of the
    // sharing names in sorted order (transformers' save_pretrained), +-1 in float64, with its
    // permutation.
    const Checkpoint ck = Checkpoint::open(rot);
    std::vector<std::string> saved;
    for (const auto& [name, ref] : ck.tensors())
      if (name.find("_input.") != std::string::npos || name.find("_output.") != std::string::npos) {
        saved.push_back(name);
        if (!name.ends_with(".weight")) continue;
        EXPECT_EQ(ref.info->dtype, DType::kF64) << name;
        for (double h :
             reference::decode_all(ref.info->dtype, ref.bytes(), ref.info->numel(), name))
          ASSERT_EQ(std::fabs(h), 1.0) << name;
      }
    EXPECT_EQ(saved, (std::vector<std::string>{"model.layers.2.self_attn.v_proj.u_output.perm",
                                               "model.layers.2.self_attn.v_proj.u_output.weight",
                                               "model.layers.2.self_attn.v_proj.v_input.perm",
                                               "model.layers.2.self_attn.v_proj.v_input.weight"}));
    const Json cfg = read_json_file(rot / "config.json");
    EXPECT_EQ(cfg.at("quantization_config").at("transform_config"), Json::parse(quip_blocks()));
  }
  // Every linear rotated, only down_proj quantized: the others are bf16-rounded rotations.
  const fs::path down_only = scratch("down_only"), down_rot = scratch("down_rot");
  fixtures::QuantizeCheckpointOptions d;
  d.ignore = {"re:.*(q|k|v|o|gate|up)_proj$"};
  fixtures::quantize_checkpoint(fp, parse_scheme_id("ct-w8a16-ch"), Dialect::kIdeal, down_only, {},
                                OverwritePolicy::kRefuse, nullptr, d);
  d.transform_config = Json::parse(quip_blocks());
  fixtures::quantize_checkpoint(fp, parse_scheme_id("ct-w8a16-ch"), Dialect::kIdeal, down_rot, {},
                                OverwritePolicy::kRefuse, nullptr, d);
  const double e_down = rel_l2(logits_of(down_only), want);
  const double e_down_rot = rel_l2(logits_of(down_rot), want);
  std::cerr << "down_proj only: unrotated " << e_down << ", rotated everywhere " << e_down_rot
            << "\n";
  EXPECT_LT(e_down_rot, 2 * e_down + 2e-3);
}

// The reader's rules on stored matrices: a normalised Hadamard (off by sqrt(n)), a missing
// randomized matrix, two copies that differ; each an Error naming the tensor.
TEST(OnlineTransformCheckpoint, StoredMatricesThatDoNotDetermineTheRotationAreRefused) {
  const fs::path fp = trained_llama(), rot = scratch("rot2");
  fixtures::QuantizeCheckpointOptions o;
  Json t = Json::parse(quip("random-hadamard"));
  for (auto& [name, g] : t.at("config_groups").items())
    g["head_dim"] = 128;
  o.transform_config = t;
  fixtures::quantize_checkpoint(fp, parse_scheme_id("ct-w8a16-ch"), Dialect::kIdeal, rot, {},
                                OverwritePolicy::kRefuse, nullptr, o);
  const std::string key = "model.layers.2.self_attn.v_proj.v_input.weight";
  // A copy of `rot` with model.safetensors rewritten by `edit` (name -> new bytes, or erased).
  auto variant =
      [&](const std::string& name,
          const std::function<void(std::map<std::string, std::vector<uint8_t>>&,
                                   std::map<std::string, DType>&,
                                   std::map<std::string, std::vector<uint64_t>>&)>& edit) {
        const fs::path dir = scratch(name);
        fs::create_directories(dir);
        fs::copy_file(rot / "config.json", dir / "config.json");
        const Checkpoint ck = Checkpoint::open(rot);
        std::map<std::string, std::vector<uint8_t>> bytes;
        std::map<std::string, DType> dtypes;
        std::map<std::string, std::vector<uint64_t>> shapes;
        for (const auto& [n, ref] : ck.tensors()) {
          bytes[n].assign(ref.bytes().begin(), ref.bytes().end());
          dtypes[n] = ref.info->dtype;
          shapes[n] = ref.info->shape;
        }
        edit(bytes, dtypes, shapes);
        std::vector<TensorToWrite> out;
        for (const auto& [n, b] : bytes)
          out.push_back({n, dtypes.at(n), shapes.at(n), b});
        write_safetensors(dir / "model.safetensors", std::move(out), std::nullopt);
        return dir;
      };
  const fs::path normalised = variant("normalised", [&](auto& bytes, auto&, auto&) {
    std::vector<double> v(128 * 128);
    std::memcpy(v.data(), bytes.at(key).data(), bytes.at(key).size());
    for (double& h : v)
      h /= std::sqrt(128.0);
    std::memcpy(bytes.at(key).data(), v.data(), bytes.at(key).size());
  });
  EXPECT_THAT(error_of([&] { logits_of(normalised); }),
              AllOf(HasSubstr(key), HasSubstr("entries +-1"), HasSubstr("sqrt(128)")));
  const fs::path missing = variant("missing", [&](auto& bytes, auto&, auto&) { bytes.erase(key); });
  EXPECT_THAT(error_of([&] { logits_of(missing); }),
              AllOf(HasSubstr(".v_input.weight"), HasSubstr("missing: no module stores the "
                                                            "random-hadamard matrix")));
  // A second copy under another sharing module's name, one column's sign flipped.
  const std::string other = "model.layers.0.mlp.down_proj.v_input.weight";  // sorts first
  const fs::path differ = variant("differ", [&](auto& bytes, auto& dtypes, auto& shapes) {
    bytes[other] = bytes.at(key);
    dtypes[other] = dtypes.at(key);
    shapes[other] = shapes.at(key);
    double first;
    std::memcpy(&first, bytes[other].data(), 8);
    first = -first;
    std::memcpy(bytes[other].data(), &first, 8);
  });
  EXPECT_THAT(error_of([&] { logits_of(differ); }),
              AllOf(HasSubstr(key), HasSubstr("differs from " + other)));
  // As an attacker writes them: a NaN entry, a matrix of the wrong order, a permutation for a
  // transform that does not randomize.
  const fs::path nan = variant("nan", [&](auto& bytes, auto&, auto&) {
    const double q = std::nan("");
    std::memcpy(bytes.at(key).data() + 8 * 5, &q, 8);
  });
  EXPECT_THAT(error_of([&] { logits_of(nan); }), HasSubstr(key));
  const fs::path order = variant("order", [&](auto& bytes, auto&, auto& shapes) {
    bytes.at(key).resize(64 * 64 * 8);
    shapes.at(key) = {64, 64};
  });
  EXPECT_THAT(error_of([&] { logits_of(order); }),
              AllOf(HasSubstr(key), HasSubstr("expected a float [128, 128] transform matrix")));
  const std::string perm = "model.layers.2.self_attn.v_proj.v_input.perm";
  const fs::path stray = variant("stray", [&](auto& bytes, auto& dtypes, auto& shapes) {
    bytes[perm] = std::vector<uint8_t>(128 * 8, 0);
    dtypes[perm] = DType::kI64;
    shapes[perm] = {128};
  });
  EXPECT_THAT(error_of([&] { logits_of(stray); }),
              AllOf(HasSubstr(perm), HasSubstr("a permutation for a transform without randomize")));
  // A randomized checkpoint whose stored permutation repeats an index.
  const fs::path rnd = scratch("rnd");
  fixtures::QuantizeCheckpointOptions ro;
  ro.transform_config = Json::parse(quip_blocks());
  fixtures::quantize_checkpoint(fp, parse_scheme_id("ct-w8a16-ch"), Dialect::kIdeal, rnd, {},
                                OverwritePolicy::kRefuse, nullptr, ro);
  const Checkpoint rck = Checkpoint::open(rnd);
  ASSERT_TRUE(rck.contains(perm));
  const fs::path repeat = scratch("repeat");
  fs::create_directories(repeat);
  fs::copy_file(rnd / "config.json", repeat / "config.json");
  std::vector<std::vector<uint8_t>> owned;
  owned.reserve(rck.tensors().size());
  std::vector<TensorToWrite> out;
  for (const auto& [n, ref] : rck.tensors()) {
    owned.emplace_back(ref.bytes().begin(), ref.bytes().end());
    if (n == perm) std::memcpy(owned.back().data() + 8, owned.back().data(), 8);  // p[1] = p[0]
    out.push_back({n, ref.info->dtype, ref.info->shape, owned.back()});
  }
  write_safetensors(repeat / "model.safetensors", std::move(out), std::nullopt);
  EXPECT_THAT(error_of([&] { logits_of(repeat); }),
              AllOf(HasSubstr(perm), HasSubstr("not a permutation of 0..127")));
}

}  // namespace
}  // namespace qparity
