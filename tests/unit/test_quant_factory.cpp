// From a QuantPlan entry to a working LinearMethod, as the model loaders will do it: the
// override plan, compressed-tensors and msModelSlim plans, fused q/k/v partitions and an MoE
// expert stack, for every weight scheme; and the factory's refusals.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <random>

#include "error_of.h"
#include "plan_fixtures.h"
#include "quant_test_util.h"
#include "schemes/description/compressed_tensors_config.h"
#include "schemes/description/msmodelslim_config.h"
#include "schemes/method/method_factory.h"
#include "test_seed.h"

namespace qparity::reference {
namespace {

using test::error_of;
using ::testing::HasSubstr;

const char* const kWeightSchemes[] = {"bf16",        "w8a16-ch",   "w8a16-g64",     "w8a16-g128",
                                      "w8a8-static", "w8a8s",      "w8a8-int8-dyn", "w4a8-dyn",
                                      "w4a16-g32",   "fp8-tensor", "fp8-channel",   "fp8-block",
                                      "nvfp4",       "mxfp4",      "mxfp8"};

ActivationStats stats_of(const Matrix& x) {
  ActivationStats s;
  s.min = *std::min_element(x.data.begin(), x.data.end());
  s.max = *std::max_element(x.data.begin(), x.data.end());
  s.channel_absmax.assign(static_cast<size_t>(x.cols), 0.0);
  for (int64_t r = 0; r < x.rows; ++r)
    for (int64_t c = 0; c < x.cols; ++c)
      s.channel_absmax[static_cast<size_t>(c)] =
          std::max(s.channel_absmax[static_cast<size_t>(c)], std::fabs(x(r, c)));
  return s;
}

// quantize_linear with the plan entry's own args, as a PTQ tool writing that entry would.
TensorMap quantize_for(const PlanEntry& e, const Matrix& w, const Matrix& x, Dialect d,
                       DType model_dtype) {
  QuantizeRequest r;
  r.weight = w;
  r.model_dtype = model_dtype;
  r.dialect = d;
  r.weights = e.weights;
  r.input_activations = e.input_activations;
  r.activations = stats_of(x);
  r.where = e.prefix;
  return quantize_linear(*e.scheme, r);
}

// Sanity bound for a quantized layer against the fp64 product: every scheme here is better than
// 50 % relative error; the per-format bounds live in the scheme tests and the CLI test.
constexpr double kSane = 0.5;
// Except per-channel int4 (w4a8-dyn) on realistic_matrix: its RMS weight error is
// amax / (7 sqrt(12)) = 0.0412 amax per row, and the 20x outlier columns with Student-t(3) tails
// put amax / RMS near 14 (0.58 predicted; 0.59 the largest of 25 seeds measured). Its own bounds
// are the hand-worked cases of test_quant_w4a8.cpp.
constexpr double kSaneInt4Channel = 0.8;
double sane_bound(const std::string& id) {
  return id == "w4a8-dyn" || id == "W4A8_DYNAMIC" ? kSaneInt4Channel : kSane;
}

TEST(MethodFactory, OverridePlanEntriesBuildWorkingMethodsInEveryDialect) {
  const uint64_t seed = test::test_seed();
  std::mt19937_64 rng(seed);
  const ModelConfig cfg = test::tiny_llama();  // F16 model: deq_scale as I64 bit patterns
  const Matrix w = test::realistic_matrix(rng, 256, 512);
  const Matrix x = test::gaussian_matrix(rng, 4, 512);
  const Matrix y_ref = matmul_nt(x, w);
  for (const char* id : kWeightSchemes) {
    const QuantPlan plan = plan_from_override(cfg, parse_scheme_id(id));
    const PlanEntry& e = plan.method_for("model.layers.0.mlp.down_proj");
    ASSERT_TRUE(e.scheme) << id;
    for (Dialect d : kAllDialects) {
      const TensorMap t = quantize_for(e, w, x, d, DType::kF16);
      auto m = make_linear_method(LinearShape::dense(e.prefix, 256, 512, DType::kF16),
                                  method_config(e, d));
      m->load_all(t);
      m->process_weights_after_loading();
      EXPECT_LT(test::relative_l2(m->apply(x), y_ref), sane_bound(id))
          << id << "/" << to_string(d) << " " << test::seed_note(seed);
    }
  }
}

TEST(MethodFactory, FusedQkvEqualsItsPartitions) {
  // q/k/v quantized separately and loaded as partitions 0/1/2 of one layer: the fused weight is
  // the partitions' weights stacked, exactly, except where a scheme's loader reconciles
  // per-partition scales (fp8-tensor requantizes to the max scale: within one fp8 step).
  const uint64_t seed = test::test_seed();
  std::mt19937_64 rng(seed);
  const ModelConfig cfg = test::tiny_llama();
  const std::vector<int64_t> rows = {256, 128, 128};
  const char* names[] = {"q_proj", "k_proj", "v_proj"};
  std::vector<Matrix> ws;
  for (int64_t n : rows)
    ws.push_back(test::realistic_matrix(rng, n, 256));
  const Matrix x = test::gaussian_matrix(rng, 4, 256);
  for (const char* id : kWeightSchemes) {
    const QuantPlan plan = plan_from_override(cfg, parse_scheme_id(id));
    LinearShape s;
    s.prefix = "model.layers.0.self_attn";
    s.partition_names = {"q_proj", "k_proj", "v_proj"};
    s.partitions = rows;
    s.in_features = 256;
    s.model_dtype = DType::kF16;
    const PlanEntry& q = plan.method_for("model.layers.0.self_attn.q_proj");
    auto m = make_linear_method(s, method_config(q, Dialect::kIdeal));
    Matrix stacked(512, 256);
    int64_t off = 0;
    for (int p = 0; p < 3; ++p) {
      const PlanEntry& e = plan.method_for(std::string("model.layers.0.self_attn.") + names[p]);
      const TensorMap t =
          quantize_for(e, ws[static_cast<size_t>(p)], x, Dialect::kIdeal, DType::kF16);
      m->load_all(t, p);
      const Matrix dq = dequantize_linear(method_config(e, Dialect::kIdeal), t,
                                          rows[static_cast<size_t>(p)], 256, DType::kF16);
      std::copy(dq.data.begin(), dq.data.end(), stacked.data.begin() + off * 256);
      off += rows[static_cast<size_t>(p)];
    }
    m->process_weights_after_loading();
    const double bound = std::string(id) == "fp8-tensor" ? 0.07 : 1e-15;
    EXPECT_LT(test::relative_l2(m->dequantized_weight(), stacked), bound)
        << id << " " << test::seed_note(seed);
  }
}

TEST(MethodFactory, ExpertStackFromTheMxint4Plan) {
  const uint64_t seed = test::test_seed();
  std::mt19937_64 rng(seed);
  const ModelConfig cfg = test::tiny_qwen3_moe();  // 4 experts, I = 128, H = 256
  const QuantPlan plan = plan_from_override(cfg, parse_scheme_id("mxint4"));
  const PlanEntry& stack = plan.method_for("model.layers.0.mlp.experts");
  ASSERT_EQ(stack.scheme_string(), "mxint4");
  LinearShape s;
  s.prefix = stack.prefix;
  s.partition_names = {"gate_proj", "up_proj"};
  s.partitions = {128, 128};
  s.in_features = 256;
  s.num_experts = 4;
  auto m = make_linear_method(s, method_config(stack, Dialect::kSglang));
  const Matrix x = test::gaussian_matrix(rng, 3, 256);
  std::vector<Matrix> ref;
  for (int64_t e = 0; e < 4; ++e) {
    Matrix full(256, 256);
    for (int64_t p = 0; p < 2; ++p) {
      const PlanEntry& shard = plan.method_for(stack.prefix + "." + std::to_string(e) +
                                               (p == 0 ? ".gate_proj" : ".up_proj"));
      const Matrix w = test::realistic_matrix(rng, 128, 256);
      m->load_all(quantize_for(shard, w, x, Dialect::kSglang, DType::kBF16), p, e);
      std::copy(w.data.begin(), w.data.end(), full.data.begin() + p * 128 * 256);
    }
    ref.push_back(matmul_nt(x, full));
  }
  m->process_weights_after_loading();
  for (int64_t e = 0; e < 4; ++e)
    EXPECT_LT(test::relative_l2(m->apply(x, e), ref[static_cast<size_t>(e)]), 0.3)
        << "expert " << e << " " << test::seed_note(seed);
  EXPECT_TRUE(m->runtime_tensors().count("w13_weight_scale"));
}

TEST(MethodFactory, CompressedTensorsAndMsModelSlimPlans) {
  const uint64_t seed = test::test_seed();
  std::mt19937_64 rng(seed);
  const ModelConfig cfg = test::tiny_llama();
  const Matrix w = test::realistic_matrix(rng, 256, 512);
  const Matrix x = test::gaussian_matrix(rng, 4, 512);
  const Matrix y_ref = matmul_nt(x, w);
  const std::string prefix = "model.layers.0.mlp.down_proj";
  auto check = [&](const QuantPlan& plan, const char* what, Dialect d) {
    const PlanEntry& e = plan.method_for(prefix);
    auto m =
        make_linear_method(LinearShape::dense(prefix, 256, 512, DType::kF16), method_config(e, d));
    m->load_all(quantize_for(e, w, x, d, DType::kF16));
    m->process_weights_after_loading();
    EXPECT_LT(test::relative_l2(m->apply(x), y_ref), sane_bound(what))
        << what << " " << test::seed_note(seed);
  };
  // Presets by name (the library's preset W4A16 is group 128, which w4a16-g32 refuses; the group
  // 32 variant is spelled out as llm-compressor writes it).
  for (const char* preset :
       {"W8A8", "FP8", "FP8_DYNAMIC", "FP8_BLOCK", "NVFP4", "MXFP4", "W4A16"}) {
    Json q = {{"quant_method", "compressed-tensors"}, {"ignore", {"lm_head"}}};
    if (std::string(preset) == "W4A16")
      q["config_groups"] = {{"group_0",
                             {{"targets", {"Linear"}},
                              {"weights",
                               {{"num_bits", 4},
                                {"type", "int"},
                                {"symmetric", true},
                                {"strategy", "group"},
                                {"group_size", 32}}}}}};
    else
      q["config_groups"] = {{preset, {"Linear"}}};
    check(plan_from_quantization_config(cfg, q, "config.json"), preset, Dialect::kVllm);
  }
  for (const char* type :
       {"W8A16", "W8A8", "W8A8S", "W8A8_DYNAMIC", "WFP8AFP8_DYNAMIC", "W4A8_DYNAMIC"}) {
    const Json desc = test::describe_model(
        cfg, [&](const LinearModule& l) { return test::all_but_head(l, type); }, type);
    const QuantPlan plan = plan_from_msmodelslim(cfg, desc, "quant_model_description.json");
    EXPECT_EQ(plan.method_for(prefix).format, "msmodelslim");
    check(plan, type, Dialect::kMsModelSlim);
  }
}

TEST(MethodFactory, RefusesSchemesOfTheWrongFamily) {
  const auto dense = LinearShape::dense("model.layers.0.self_attn.o_proj", 8, 8);
  EXPECT_THAT(error_of([&] {
                make_linear_method(dense,
                                   method_config(parse_scheme_id("kv-int8"), Dialect::kIdeal));
              }),
              HasSubstr("model.layers.0.self_attn.o_proj: scheme kv-int8 is not a linear-layer"));
  EXPECT_THAT(error_of([&] {
                make_kv_cache_method({"model.layers.0.self_attn", 2, 4, DType::kBF16},
                                     method_config(parse_scheme_id("fp8-tensor"), Dialect::kIdeal));
              }),
              HasSubstr("model.layers.0.self_attn: scheme fp8-tensor is not a KV-cache scheme"));
  QuantizeRequest r;
  r.weight = Matrix(2, 2);
  r.where = "lin";
  EXPECT_THAT(error_of([&] { quantize_linear(parse_scheme_id("smoothquant"), r); }),
              HasSubstr("lin: scheme smoothquant does not quantize a linear weight"));
  EXPECT_THAT(error_of([&] {
                make_linear_method(dense,
                                   method_config(parse_scheme_id("mxint4"), Dialect::kIdeal));
              }),
              HasSubstr("model.layers.0.self_attn.o_proj"));
}

}  // namespace
}  // namespace qparity::reference
