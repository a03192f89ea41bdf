// Every tolerance policy is proven able to fail. For each policies/<scheme>.json:
// the reference golden of a tiny fixture in that scheme (emulate mode, as an engine stores
// activations), then candidates:
//   - within-noise: every value moved by up to 2^-12 relative (below the derived bounds): passes;
//   - a 1-ULP (bf16) change of every element of one layer's output (layers.1.attn.out);
//   - a wrong scale in one output channel (channel 3 of layers.0.attn.qkv scaled by 1.25);
//   - a swapped gate/up shard (the two halves of a layer's mlp.gate_up exchanged);
//   - an off-by-one group index (group schemes: o_proj of layer 0 reads group g+1's scale; a real
//     faulty checkpoint run through the reference, so the error also flows downstream);
// each must fail the engine policy at exactly the planted capture point.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <filesystem>
#include <functional>

#include "../unit/checkpoint_edit.h"
#include "../unit/test_seed.h"
#include "accuracy_util.h"
#include "core/error.h"
#include "core/safetensors/safetensors_file.h"
#include "core/safetensors/safetensors_writer.h"
#include "golden/compare.h"
#include "golden/layer_rerun.h"
#include "reference_cpu/models/model_loader.h"

namespace qparity::golden {
namespace {

namespace fs = std::filesystem;

class PlantedFaults : public testing::Test {
 protected:
  static void SetUpTestSuite() {
    root_ = fs::temp_directory_path() / ("qparity_planted_" + std::to_string(test::test_seed()));
    fs::create_directories(root_);
  }
  static void TearDownTestSuite() { fs::remove_all(root_); }

  static std::string arch_for(const std::string& scheme) {
    return scheme == "mxint4" ? "qwen3-moe" : "llama";
  }

  static TokenInputs inputs(const fs::path& dir) {
    const ModelConfig cfg = load_model_config(dir / "config.json");
    return synthetic_inputs(2, 16, cfg.vocab, 5);
  }

  static Golden golden_of(const fs::path& dir) {
    ReferenceRunOptions o;
    o.mode = reference::PrecisionMode::kEmulate;
    return run_reference(dir, inputs(dir), o, nullptr);
  }

  // Compares `candidate` (as a GPU engine's dump) with the golden under `policy`.
  static CompareReport judge(const fs::path& golden_file, Golden candidate, const Policy& policy) {
    candidate.meta.producer = "planted-fault engine";
    candidate.meta.device = "NVIDIA H100 80GB HBM3 sm90";
    // A copy of the golden with one point changed is what a layer-local dump of an engine with
    // that one fault shows: the per-point gates judge it (a free run is judged end to end).
    candidate.meta.run_mode = RunMode::kLayerLocal;
    const fs::path c = root_ / "candidate.h5";
    write_golden(c, candidate, OverwritePolicy::kReplace);
    CompareOptions o;
    o.policy = &policy;
    // Some faults are planted in a checkpoint's weights: the candidate then records that
    // checkpoint's hashes, which compare refuses unless told.
    o.allow_other_checkpoint = true;
    return compare_goldens(GoldenReader::open(golden_file), GoldenReader::open(c), o);
  }

  static Array2D& point(Golden& g, const std::string& name) {
    for (auto& p : g.points)
      if (p.name == name) return p.values;
    throw Error("test", "no point " + name);
  }

  static std::string first_failing(const CompareReport& r) {
    return r.first_failing < 0 ? "(none)" : r.points[static_cast<size_t>(r.first_failing)].name;
  }

  static inline fs::path root_;
};

// v moved away from zero by one bf16 ULP (v is bf16-representable: emulate mode stores it so).
double bump_one_bf16_ulp(double v) {
  const float f = static_cast<float>(v);
  uint32_t u;
  std::memcpy(&u, &f, 4);
  u += 0x10000u;  // sign-magnitude: +1 in the bf16 mantissa field moves away from zero
  float g;
  std::memcpy(&g, &u, 4);
  return g;
}

TEST_F(PlantedFaults, EveryPolicyFailsAtThePlantedPointAndPassesNoise) {
  const fs::path dir = fs::path(QPARITY_SOURCE_DIR) / "policies";
  int policies = 0;
  for (const auto& e : fs::directory_iterator(dir)) {
    if (e.path().extension() != ".json") continue;
    ++policies;
    const Policy policy = load_policy(e.path());
    const std::string scheme = policy.scheme;
    SCOPED_TRACE(scheme);
    const std::string arch = arch_for(scheme);
    const fs::path ckpt = test::tiny_checkpoint(root_, arch, scheme, 11);
    const Golden g = golden_of(ckpt);
    const fs::path gfile = root_ / (scheme + ".golden.h5");
    write_golden(gfile, g, OverwritePolicy::kReplace);
    const int dense_layer = arch == "qwen3-moe" ? 1 : 0;  // qwen3-moe tiny: layer 1 is dense

    {  // Within noise: passes.
      Golden c = g;
      uint64_t state = 0x9E3779B97F4A7C15ull;
      const auto noise = [&] {
        state = state * 6364136223846793005ull + 1442695040888963407ull;
        return (static_cast<double>(state >> 11) * 0x1p-53 * 2 - 1) * 0x1p-12;
      };
      for (auto& p : c.points)
        if (p.name.find("topk_ids") == std::string::npos)
          for (double& v : p.values.data)
            v *= 1 + noise();
      const CompareReport r = judge(gfile, c, policy);
      EXPECT_TRUE(r.pass) << "noise of 2^-12 failed at " << first_failing(r) << "\n" << to_text(r);
    }
    {  // One bf16 ULP on every element of one layer's output.
      Golden c = g;
      for (double& v : point(c, "layers.1.attn.out").data)
        v = bump_one_bf16_ulp(v);
      const CompareReport r = judge(gfile, c, policy);
      EXPECT_FALSE(r.pass);
      EXPECT_EQ(first_failing(r), "layers.1.attn.out");
    }
    {  // A wrong scale in one output channel.
      Golden c = g;
      Array2D& qkv = point(c, "layers.0.attn.qkv");
      for (int64_t t = 0; t < qkv.rows; ++t)
        qkv.data[static_cast<size_t>(t * qkv.cols + 3)] *= 1.25;
      const CompareReport r = judge(gfile, c, policy);
      EXPECT_FALSE(r.pass);
      EXPECT_EQ(first_failing(r), "layers.0.attn.qkv");
    }
    {  // Gate and up shards swapped.
      Golden c = g;
      const std::string name = "layers." + std::to_string(dense_layer) + ".mlp.gate_up";
      Array2D& gu = point(c, name);
      const int64_t half = gu.cols / 2;
      for (int64_t t = 0; t < gu.rows; ++t)
        for (int64_t j = 0; j < half; ++j)
          std::swap(gu.data[static_cast<size_t>(t * gu.cols + j)],
                    gu.data[static_cast<size_t>(t * gu.cols + half + j)]);
      const CompareReport r = judge(gfile, c, policy);
      EXPECT_FALSE(r.pass);
      EXPECT_EQ(first_failing(r), name);
    }
  }
  EXPECT_GE(policies, 17) << "a policy per scheme";
}

// The format role's gates (what a format may do to the model) fail too: the gated point scaled
// by 1 + 1.5x its bound fails there; by 1 + 0.5x its bound passes.
TEST_F(PlantedFaults, EveryFormatGateFailsAtItsPoint) {
  const fs::path ckpt = test::tiny_checkpoint(root_, "llama", "bf16", 11);
  const Golden g = golden_of(ckpt);
  const fs::path gfile = root_ / "format.golden.h5";
  write_golden(gfile, g, OverwritePolicy::kReplace);
  int gated = 0;
  for (const auto& e : fs::directory_iterator(fs::path(QPARITY_SOURCE_DIR) / "policies")) {
    if (e.path().extension() != ".json") continue;
    const Policy policy = load_policy(e.path());
    SCOPED_TRACE(policy.scheme);
    ASSERT_TRUE(policy.format.has_value());
    ASSERT_FALSE(policy.format->points.empty()) << "every scheme's format role has a gate";
    const PointGate& gate = policy.format->points.front();
    ASSERT_TRUE(gate.max_rel_l2.has_value());
    const std::string name = gate.match == "*" ? "layers.0.attn.qkv" : gate.match;
    for (const double k : {1.5, 0.5}) {
      Golden c = g;
      for (double& v : point(c, name).data)
        v *= 1 + k * *gate.max_rel_l2;
      c.meta.device = "cpu-reference";
      const fs::path cf = root_ / "format.candidate.h5";
      write_golden(cf, c, OverwritePolicy::kReplace);
      CompareOptions o;
      o.policy = &policy;
      o.role = PolicyRole::kFormat;
      const CompareReport r = compare_goldens(GoldenReader::open(gfile), GoldenReader::open(cf), o);
      // The format's math check only (the budget, judged apart, needs more positions than
      // these 32 to bound top-1 agreement at 0.9).
      if (k > 1) {
        EXPECT_FALSE(r.pass);
        EXPECT_EQ(first_failing(r), name);
      } else if (gate.match != "*") {  // bf16's "*" gate is 1e-12: any change fails
        EXPECT_EQ(first_failing(r), "(none)") << to_text(r);
        EXPECT_TRUE(r.e2e_verdict.pass) << to_text(r);
      }
    }
    ++gated;
  }
  EXPECT_GE(gated, 17);
}

// MoE: an engine may list a token's experts in another slot order (passes); one expert whose
// output is off by 1.25 fails at that layer's expert_out, and the per-expert table names it.
// An engine that ran an fp32 checkpoint's weights in bf16 is compared against a golden that did
// not: compare says so by name, whatever the numbers; equal dtypes give no such line.
TEST_F(PlantedFaults, AWeightDtypeMismatchIsNamed) {
  const fs::path ckpt = test::tiny_checkpoint(root_, "llama", "bf16", 11);
  Golden g = golden_of(ckpt);
  g.meta.model_dtype = "F32";
  const fs::path gfile = root_ / "dtype.golden.h5";
  write_golden(gfile, g, OverwritePolicy::kReplace);
  const Policy policy = load_policy(fs::path(QPARITY_SOURCE_DIR) / "policies/bf16.json");
  Golden c = g;
  c.meta.model_dtype = "BF16";
  CompareReport r = judge(gfile, c, policy);
  ASSERT_EQ(r.warnings.size(), 1u);
  EXPECT_NE(r.warnings[0].find("the golden ran the weights in F32, the candidate in BF16"),
            std::string::npos);
  EXPECT_NE(to_text(r).find("warning: weight dtype"), std::string::npos);
  c.meta.model_dtype = "F32";
  EXPECT_TRUE(judge(gfile, c, policy).warnings.empty());
}

TEST_F(PlantedFaults, OneFaultyExpertIsNamedAndSlotOrderIsFree) {
  const Policy policy = load_policy(fs::path(QPARITY_SOURCE_DIR) / "policies/bf16.json");
  const fs::path ckpt = test::tiny_checkpoint(root_, "qwen3-moe", "bf16", 11);
  const Golden g = golden_of(ckpt);
  const fs::path gfile = root_ / "moe-experts.golden.h5";
  write_golden(gfile, g, OverwritePolicy::kReplace);
  Golden base = g;
  const Array2D ids = point(base, "layers.0.moe.topk_ids");
  const int64_t k = ids.cols, width = point(base, "layers.0.moe.expert_out").cols / k;
  ASSERT_GE(k, 2);
  {  // Slots reversed for every token, consistently in ids, weights and outputs.
    Golden c = g;
    for (const char* name :
         {"layers.0.moe.topk_ids", "layers.0.moe.topk_weights", "layers.0.moe.expert_out"}) {
      Array2D& a = point(c, name);
      const int64_t w = a.cols / k;
      for (int64_t t = 0; t < a.rows; ++t)
        for (int64_t s = 0; s < k / 2; ++s)
          for (int64_t j = 0; j < w; ++j)
            std::swap(a.data[static_cast<size_t>(t * a.cols + s * w + j)],
                      a.data[static_cast<size_t>(t * a.cols + (k - 1 - s) * w + j)]);
    }
    const CompareReport r = judge(gfile, c, policy);
    EXPECT_TRUE(r.pass) << to_text(r);
    ASSERT_EQ(r.experts.size(), 1u);
    EXPECT_EQ(r.experts[0].unmatched, 0);
    for (const auto& e : r.experts[0].experts)
      EXPECT_EQ(e.rel_l2, 0.0) << "expert " << e.expert;
  }
  {  // The expert of token 0's first slot computes 1.25x its output.
    Golden c = g;
    const int64_t faulty = static_cast<int64_t>(ids.data[0]);
    Array2D& out = point(c, "layers.0.moe.expert_out");
    for (int64_t t = 0; t < out.rows; ++t)
      for (int64_t s = 0; s < k; ++s)
        if (static_cast<int64_t>(ids.data[static_cast<size_t>(t * k + s)]) == faulty)
          for (int64_t j = 0; j < width; ++j)
            out.data[static_cast<size_t>(t * out.cols + s * width + j)] *= 1.25;
    const CompareReport r = judge(gfile, c, policy);
    EXPECT_FALSE(r.pass);
    EXPECT_EQ(first_failing(r), "layers.0.moe.expert_out");
    ASSERT_EQ(r.experts.size(), 1u);
    for (const auto& e : r.experts[0].experts) {
      if (e.expert == faulty)
        EXPECT_NEAR(e.rel_l2, 0.25, 1e-12);
      else
        EXPECT_EQ(e.rel_l2, 0.0) << "expert " << e.expert;
    }
  }
}

// Rewrites one tensor of a single-file checkpoint.

TEST_F(PlantedFaults, OffByOneGroupIndexFailsAtTheLinearItFeeds) {
  // (scheme, scale tensor of layer 0's o_proj, its file) for the group formats whose scales are
  // plain [N, groups] tensors.
  const std::vector<std::pair<std::string, std::string>> cases = {
      {"w8a16-g64", "model.layers.0.self_attn.o_proj.weight_scale"},
      {"w4a16-g32", "model.layers.0.self_attn.o_proj.weight_scale"}};
  for (const auto& [scheme, tensor] : cases) {
    SCOPED_TRACE(scheme);
    const Policy policy =
        load_policy(fs::path(QPARITY_SOURCE_DIR) / "policies" / (scheme + ".json"));
    const fs::path good = test::tiny_checkpoint(root_, "llama", scheme, 11);
    const fs::path bad = root_ / (scheme + ".off-by-one");
    fs::remove_all(bad);
    fs::copy(good, bad);
    test::edit_tensor(bad, tensor, [](const TensorInfo& t, std::vector<uint8_t>& bytes) {
      // Row-major [N, G]: every row reads group g+1's scale for group g (the last wraps to 0).
      const size_t n = t.shape[0], groups = t.shape[1], es = bytes.size() / (n * groups);
      std::vector<uint8_t> out(bytes.size());
      for (size_t r = 0; r < n; ++r)
        for (size_t g = 0; g < groups; ++g)
          std::memcpy(&out[(r * groups + g) * es], &bytes[(r * groups + (g + 1) % groups) * es],
                      es);
      bytes = out;
    });
    const Golden g = golden_of(good);
    const fs::path gfile = root_ / (scheme + ".golden.h5");
    write_golden(gfile, g, OverwritePolicy::kReplace);
    const CompareReport r = judge(gfile, golden_of(bad), policy);
    EXPECT_FALSE(r.pass);
    EXPECT_EQ(first_failing(r), "layers.0.attn.out");
    // Everything before it is untouched.
    for (int64_t i = 0; i < r.first_failing; ++i)
      EXPECT_EQ(r.points[static_cast<size_t>(i)].stats.max_abs, 0.0)
          << r.points[static_cast<size_t>(i)].name;
    // Re-running the layers of the faulty model on the golden's inputs: layer 0 (the faulty
    // o_proj) still fails - local; layer 1 is fine on clean inputs - its failure is inherited.
    reference::LoadOptions lo;
    lo.mode = reference::PrecisionMode::kEmulate;
    auto faulty = reference::load_model(bad, lo);
    const auto golden = GoldenReader::open(gfile);
    const PolicySection& section = policy_section(policy, PolicyRole::kEngine, "sm90");
    const LayerRerun own = rerun_layer_point(*faulty, golden, "layers.0.attn.out", &section);
    ASSERT_TRUE(own.available) << own.why_not;
    EXPECT_EQ(own.input_point, "embed");
    EXPECT_TRUE(own.local);
    const LayerRerun next = rerun_layer_point(*faulty, golden, "layers.1.attn.out", &section);
    ASSERT_TRUE(next.available);
    EXPECT_FALSE(next.local) << next.stats.rel_l2;
    EXPECT_EQ(next.input_point, "layers.0.residual");
    bool layer1_fails = false;  // ...while in the faulty run it does fail, inherited
    for (const auto& p : r.points)
      layer1_fails = layer1_fails || (p.name == "layers.1.attn.out" && !p.verdict.pass);
    EXPECT_TRUE(layer1_fails);
    const auto clean_model = reference::load_model(good, lo);
    EXPECT_EQ(rerun_layer_point(*clean_model, golden, "layers.1.attn.out", &section).stats.max_abs,
              0.0)
        << "the reference re-run of a clean layer on golden inputs reproduces it exactly";
  }
}

// The layer re-run that bisect's decision table rests on records activation-code points too
// (they reach a run through their own hook): on the golden's inputs the reference reproduces
// each layer's x_values / x_scales exactly, int8 and fp8 codes alike. Before the fix a free run
// whose first failing point was an x_values point stopped bisect with "no capture point".
TEST_F(PlantedFaults, LayerRerunReproducesActivationCodePoints) {
  for (const std::string scheme : {"w8a8-int8-dyn", "fp8-channel"}) {
    SCOPED_TRACE(scheme);
    const fs::path ckpt = test::tiny_checkpoint(root_, "llama", scheme, 11);
    const fs::path gfile = root_ / (scheme + ".codes.golden.h5");
    write_golden(gfile, golden_of(ckpt), OverwritePolicy::kReplace);
    const auto golden = GoldenReader::open(gfile);
    reference::LoadOptions lo;
    lo.mode = reference::PrecisionMode::kEmulate;
    auto model = reference::load_model(ckpt, lo);
    for (const std::string point :
         {"layers.0.attn.qkv_proj.x_values", "layers.1.attn.o_proj.x_scales",
          "layers.1.mlp.down_proj.x_values"}) {
      ASSERT_TRUE(golden.has_point(point)) << point;
      const LayerRerun r = rerun_layer_point(*model, golden, point, nullptr);
      ASSERT_TRUE(r.available) << point << ": " << r.why_not;
      EXPECT_EQ(r.stats.max_abs, 0.0) << point;
    }
  }
}

// Saturation is counted on the stored codes at each format's largest magnitude.
TEST(ActivationSaturation, CountsTheFormatsExtremeCodes) {
  EXPECT_TRUE(saturated_code(127, 1.0));
  EXPECT_TRUE(saturated_code(-128, 1.0));
  EXPECT_FALSE(saturated_code(126, 1.0));
  EXPECT_FALSE(saturated_code(-127, 1.0));
  EXPECT_TRUE(saturated_code(229376, 0x1p-9));  // 448 on the e4m3 lattice
  EXPECT_TRUE(saturated_code(-229376, 0x1p-9));
  EXPECT_FALSE(saturated_code(212992, 0x1p-9));  // 416, the next e4m3 value down
  EXPECT_TRUE(saturated_code(12, 0.5));          // e2m1 6
  EXPECT_FALSE(saturated_code(8, 0.5));          // e2m1 4
}

}  // namespace
}  // namespace qparity::golden
