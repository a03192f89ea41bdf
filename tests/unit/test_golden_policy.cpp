// Tolerance policies: parsing errors name the file and key; device keys; gates judge the right
// metric; the committed policies all parse and carry derivations.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>

#include "core/json_util.h"
#include "error_of.h"
#include "golden/policy.h"

namespace qparity::golden {
namespace {

using test::error_of;
using ::testing::HasSubstr;

const char* kPolicy = R"({
  "scheme": "fp8-block",
  "engine": {
    "default": {"derivation": "d", "points": [
        {"match": "*.topk_ids", "max_mismatches": 0},
        {"match": "layers.*.attn.*", "max_rel_l2": 0.01, "max_col_rel_l2": 0.05},
        {"match": "*", "max_rel_l2": 0.002, "min_cosine": 0.999}],
      "end_to_end": {"max_kld_upper": 0.001, "min_top1_lower": 0.9}},
    "sm90": {"derivation": "measured", "provenance": "H100 run", "points": [
        {"match": "*", "max_rel_l2": 0.004}]}
  },
  "format": {"derivation": "f", "points": [{"match": "layers.0.attn.qkv", "max_rel_l2": 0.1}]}
})";

TEST(GoldenPolicy, ParsesSectionsAndPicksByDevice) {
  const Policy p = parse_policy(kPolicy, "p.json");
  EXPECT_EQ(p.scheme, "fp8-block");
  EXPECT_EQ(device_key("NVIDIA H100 80GB HBM3 sm90"), "sm90");
  EXPECT_EQ(device_key("NVIDIA H200 sm_90"), "sm90");
  EXPECT_EQ(device_key("cpu-reference"), "cpu-reference");
  EXPECT_EQ(device_key("some engine"), "default");
  std::string key;
  EXPECT_EQ(policy_section(p, PolicyRole::kEngine, "sm90", &key).provenance, "H100 run");
  EXPECT_EQ(key, "sm90");
  policy_section(p, PolicyRole::kEngine, "sm100", &key);
  EXPECT_EQ(key, "default");
  EXPECT_EQ(policy_section(p, PolicyRole::kFormat, "sm90").derivation, "f");
}

TEST(GoldenPolicy, FirstMatchingGateJudgesEachMetric) {
  const Policy p = parse_policy(kPolicy, "p.json");
  const PolicySection& s = p.engine.at("default");
  PointStats st;
  st.rel_l2 = 0.005;
  st.cosine = 0.99999;
  EXPECT_TRUE(judge_point(s, "layers.0.attn.qkv", st).pass);  // attn gate: 0.01
  const Verdict v = judge_point(s, "layers.0.mlp.out", st);   // catch-all: 0.002
  EXPECT_FALSE(v.pass);
  EXPECT_EQ(v.gate, "*");
  EXPECT_THAT(v.failures.at(0), HasSubstr("rel_l2 0.005 > 0.002"));
  st.rel_l2 = 0.001;
  st.max_col_rel_l2 = 0.2;
  st.worst_col = 7;
  EXPECT_THAT(judge_point(s, "layers.0.attn.out", st).failures.at(0),
              HasSubstr("channel 7 rel_l2 0.2 > 0.05"));
  st.max_col_rel_l2 = 0;
  st.nan_candidate = 1;
  st.first_nonfinite = 12;
  EXPECT_THAT(judge_point(s, "layers.0.attn.out", st).failures.at(0), HasSubstr("1 NaN"));
  PointStats ids;
  ids.integer_codes = true;
  ids.mismatches = 1;
  EXPECT_FALSE(judge_point(s, "layers.0.moe.topk_ids", ids).pass);
  EXPECT_TRUE(judge_point(p.engine.at("sm90"), "x", PointStats{}).gated);
}

TEST(GoldenPolicy, EndToEndGatesUseTheConfidenceBounds) {
  const Policy p = parse_policy(kPolicy, "p.json");
  const PolicySection& s = p.engine.at("default");
  EndToEnd e;
  e.kld_mean = {0.0005, 0.0001, 0.0009};
  e.top1 = {1.0, 0.95, 1.0};
  EXPECT_TRUE(judge_end_to_end(s, e).pass);
  e.kld_mean.hi = 0.0011;  // the mean is within, its upper bound is not
  EXPECT_THAT(judge_end_to_end(s, e).failures.at(0), HasSubstr("mean KLD upper bound"));
  e.kld_mean.hi = 0.0009;
  e.top1.lo = 0.85;
  EXPECT_THAT(judge_end_to_end(s, e).failures.at(0), HasSubstr("top-1 agreement lower bound"));
  e.top1.lo = std::nan("");  // no data fails a gate rather than passing it
  EXPECT_FALSE(judge_end_to_end(s, e).pass);
}

// Too few positions for the top-1 gate to pass even at full agreement: undecided (the comparison
// becomes NOT JUDGED), never a failure of identical data (main failed a golden against itself on
// 4 positions); a clear failure (the upper bound below the threshold) still fails.
TEST(GoldenPolicy, TooFewPositionsForTheTop1GateIsUndecided) {
  const Policy p = parse_policy(kPolicy, "p.json");  // min_top1_lower 0.9
  const PolicySection& s = p.engine.at("default");
  EndToEnd e;
  e.positions = 4;
  e.kld_mean = {0, 0, 0};
  e.top1 = wilson_interval(4, 4);
  const Verdict v = judge_end_to_end(s, e);
  EXPECT_TRUE(v.failures.empty());
  ASSERT_EQ(v.undecided.size(), 1u);
  EXPECT_THAT(v.undecided[0], HasSubstr("too few positions to judge (4: even full agreement"));
  e.top1 = wilson_interval(0, 4);  // no position agrees: the upper bound is below 0.9
  EXPECT_THAT(judge_end_to_end(s, e).failures.at(0), HasSubstr("top-1 agreement lower bound"));
  e.positions = 200;  // enough positions: judged as before
  e.top1 = wilson_interval(200, 200);
  EXPECT_TRUE(judge_end_to_end(s, e).undecided.empty());
  EXPECT_TRUE(judge_end_to_end(s, e).pass);
}

// A duplicate key is refused by name: JSON readers keep the last value, so a gate written twice
// (1e-12, then 1e6) passed a 0.5 error on main.
TEST(GoldenPolicy, DuplicateKeysAreRefusedByName) {
  const std::string p = R"({"scheme": "bf16", "engine": {"default": {"derivation": "d",
      "points": [{"match": "*", "max_rel_l2": 1e-12, "max_rel_l2": 1e6, "why": "w"}]}}})";
  EXPECT_EQ(error_of([&] { parse_policy(p, "loose.json"); }),
            "loose.json: duplicate key 'max_rel_l2' in 'engine.default.points[]' (JSON readers "
            "disagree on which value wins; give each key once)");
  EXPECT_THAT(
      error_of([] { parse_policy(R"({"scheme": "bf16", "scheme": "fp8-block"})", "t.json"); }),
      HasSubstr("t.json: duplicate key 'scheme' at the top level"));
  // The same key in two different objects is not a duplicate.
  EXPECT_NO_THROW(
      parse_json_text(R"({"a": {"k": 1}, "b": {"k": 2}, "c": [{"k": 1}, {"k": 2}]})", "ok.json"));
  EXPECT_THAT(error_of([] { parse_json_text(R"({"a": [{"k": 1, "k": 2}]})", "config.json"); }),
              HasSubstr("config.json: duplicate key 'k' in 'a[]'"));
}

TEST(GoldenPolicy, BadPoliciesNameFileAndKey) {
  EXPECT_THAT(error_of([] { parse_policy("{", "a.json"); }), HasSubstr("a.json: invalid JSON"));
  EXPECT_THAT(error_of([] { parse_policy(R"({"scheme":"bf16","engine":{}})", "b.json"); }),
              HasSubstr("'default' section"));
  EXPECT_THAT(error_of([] {
                parse_policy(R"({"scheme":"bf16","engine":{"default":{"points":[]}}})", "c.json");
              }),
              HasSubstr("'derivation'"));
  EXPECT_THAT(
      error_of([] {
        parse_policy(
            R"({"scheme":"bf16","engine":{"default":{"derivation":"d","points":[{"match":"*","max_rel":1}]}}})",
            "d.json");
      }),
      HasSubstr("d.json: engine.default.points[0]: unknown key 'max_rel'"));
  EXPECT_THAT(
      error_of([] {
        parse_policy(
            R"({"scheme":"bf16","engine":{"default":{"derivation":"d","points":[{"match":"*","max_rel_l2":-1}]}}})",
            "e.json");
      }),
      HasSubstr("'max_rel_l2' = -1 is outside [0, inf)"));
}

// Each way a policy could gate nothing, or gate with a number that means nothing, is an error
// naming the file and the key (issue: "Policies that gate nothing pass everything",
// "max_mismatches 1e300 is cast to INT64_MIN").
TEST(GoldenPolicy, APolicyThatCannotGateIsRefusedByName) {
  const auto section = [](const std::string& body) {
    return R"({"scheme":"bf16","engine":{"default":{"derivation":"d",)" + body + "}}}";
  };
  const auto err = [&](const std::string& body) {
    return error_of([&] { parse_policy(section(body), "p.json"); });
  };
  // A glob that names no capture point of any model: a typo gates nothing.
  EXPECT_THAT(err(R"("points":[{"match":"layer.0.attn.qkv","max_rel_l2":0.1}])"),
              HasSubstr("p.json: engine.default.points[0].match: 'layer.0.attn.qkv' names no "
                        "capture point"));
  EXPECT_THAT(err(R"("points":[{"match":"*.attn.qvk","max_rel_l2":0.1}])"),
              HasSubstr("names no capture point"));
  // Globs that do name points, including deep layers and MoE-only points, are fine.
  for (const char* g : {"layers.57.attn.qkv", "layers.1?.mlp.*", "*.moe.topk_ids", "logits", "*"})
    EXPECT_NO_THROW(parse_policy(
        section(std::string(R"("points":[{"match":")") + g + R"(","max_rel_l2":0.1}])"), "p.json"))
        << g;
  // An entry without a threshold, a section without any gate.
  EXPECT_THAT(err(R"("points":[{"match":"*","why":"looks fine"}])"),
              HasSubstr("engine.default.points[0]: gates nothing"));
  EXPECT_THAT(err(R"("points":[])"), HasSubstr("engine.default: gates nothing"));
  EXPECT_THAT(err(R"("end_to_end":{"why":"w"})"),
              HasSubstr("engine.default.end_to_end: gates nothing"));
  // Numbers outside their meaning.
  EXPECT_THAT(err(R"("points":[{"match":"*","max_mismatches":1e300}])"),
              HasSubstr("'max_mismatches' = 1e+300 is outside [0, 2^53]"));
  EXPECT_THAT(err(R"("points":[{"match":"*","max_mismatches":2.5}])"),
              HasSubstr("'max_mismatches' = 2.5 is not an integer"));
  EXPECT_THAT(err(R"("points":[{"match":"*","min_cosine":1.5}])"),
              HasSubstr("'min_cosine' = 1.5 is outside [-1, 1]"));
  EXPECT_THAT(err(R"("end_to_end":{"min_top1_lower":2})"), HasSubstr("outside [0, 1]"));
  // Types: a non-string "why" is named, not a library type_error.
  EXPECT_THAT(err(R"("points":[{"match":"*","max_rel_l2":0.1,"why":3}])"),
              HasSubstr("engine.default.points[0]: 'why' must be a string"));
  EXPECT_THAT(err(R"("points":[{"match":7,"max_rel_l2":0.1}])"),
              HasSubstr("points[0].match: must be a non-empty glob string"));
  // Unknown scheme ids and device keys.
  EXPECT_THAT(
      error_of([] {
        parse_policy(
            R"({"scheme":"fp9","engine":{"default":{"derivation":"d","end_to_end":{"max_kld_upper":1}}}})",
            "q.json");
      }),
      HasSubstr("q.json: scheme"));
  EXPECT_THAT(
      error_of([] {
        parse_policy(
            R"({"scheme":"bf16","engine":{"default":{"derivation":"d","end_to_end":{"max_kld_upper":1}},"sm_90":{"derivation":"d","end_to_end":{"max_kld_upper":1}}}})",
            "q.json");
      }),
      HasSubstr("q.json: engine.sm_90: unknown device key"));
  // A budget gates end to end only.
  EXPECT_THAT(
      error_of([] {
        parse_policy(
            R"({"scheme":"bf16","engine":{"default":{"derivation":"d","end_to_end":{"max_kld_upper":1}}},"budget":{"derivation":"d","points":[{"match":"*","max_rel_l2":1}]}})",
            "q.json");
      }),
      HasSubstr("q.json: budget: a budget is end-to-end gates only"));
  // An identical candidate passes a sane mismatch gate (the 1e300 cast made it fail).
  const Policy ok = parse_policy(
      section(R"("points":[{"match":"*","max_mismatches":9007199254740992}])"), "p.json");
  PointStats ids;
  ids.integer_codes = true;
  EXPECT_TRUE(judge_point(ok.engine.at("default"), "layers.0.moe.topk_ids", ids).pass);
}

// NaN/Inf fail wherever they appear, with or without a gate for the point.
TEST(GoldenPolicy, NonFiniteValuesFailWithoutAGate) {
  const Policy p = parse_policy(kPolicy, "p.json");
  PointStats st;
  st.nan_candidate = 3;
  st.first_nonfinite = 7;
  const Verdict v = judge_point(p.format.value(), "final_norm", st);  // no gate matches it
  EXPECT_FALSE(v.gated);
  EXPECT_FALSE(v.pass);
  EXPECT_THAT(v.failures.at(0), HasSubstr("3 NaN / 0 Inf in the candidate"));
  PointStats golden_inf;
  golden_inf.inf_golden = 1;
  EXPECT_FALSE(judge_point(p.format.value(), "final_norm", golden_inf).pass)
      << "a broken golden is no basis for a pass either";
  EndToEnd e;
  e.nonfinite_candidate_rows = 2;
  e.first_nonfinite_row = 5;
  EXPECT_THAT(judge_end_to_end(p.format.value(), e).failures.at(0),
              HasSubstr("2 position(s) with NaN/Inf logits in the candidate (first at row 5)"));
}

TEST(GoldenPolicy, CommittedPoliciesParseWithDerivations) {
  int n = 0;
  for (const auto& e : std::filesystem::directory_iterator(
           std::filesystem::path(QPARITY_SOURCE_DIR) / "policies")) {
    const Policy p = load_policy(e.path());
    EXPECT_EQ(p.scheme + ".json", e.path().filename().string());
    EXPECT_FALSE(p.engine.at("default").derivation.empty());
    EXPECT_TRUE(p.engine.count("cpu-reference"));
    EXPECT_TRUE(p.format.has_value());
    EXPECT_TRUE(p.budget.has_value()) << "every format role states a default budget";
    EXPECT_FALSE(p.engine.at("default").points_judge_free_runs)
        << "engine.default gates are layer-local bounds: free runs are judged end to end";
    ++n;
  }
  EXPECT_GE(n, 17);
}

TEST(GoldenPolicy, MedianTokenGateFailsAnErrorSpreadOverEveryToken) {
  const Policy p = parse_policy(
      R"({"scheme": "bf16", "engine": {"default": {"derivation": "d", "points": [{"match": "*",
          "max_rel_l2": 0.01, "max_median_row_rel_l2": 0.002}]}}})",
      "p.json");
  PointStats st;
  st.rel_l2 = 0.005;
  st.median_row_rel_l2 = 0.001;  // a few tokens carry it: passes
  EXPECT_TRUE(judge_point(p.engine.at("default"), "layers.0.mlp.out", st).pass);
  st.median_row_rel_l2 = 0.004;  // every token: fails
  const Verdict v = judge_point(p.engine.at("default"), "layers.0.mlp.out", st);
  ASSERT_FALSE(v.pass);
  EXPECT_THAT(v.failures.at(0), HasSubstr("median token rel_l2 0.004 > 0.002"));
}

// The committed bf16 engine policy on the two shapes its derivation separates, built as bf16
// tensors: one flipped intermediate feeding a dominant token (that token's row moves by one ULP,
// and it dominates the tensor's norm) passes; the same one-ULP move on every token fails.
TEST(GoldenPolicy, Bf16EnginePolicyToleratesOneDominantFlipNotAShiftedTensor) {
  const Policy p = load_policy(std::filesystem::path(QPARITY_SOURCE_DIR) / "policies/bf16.json");
  const PolicySection& s = p.engine.at("default");
  const int64_t rows = 36, cols = 512;
  std::vector<double> g(static_cast<size_t>(rows * cols));
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t j = 0; j < cols; ++j)  // bf16 values in [256, 512): one ULP is 2 = 2^-7..2^-8
      g[static_cast<size_t>(r * cols + j)] =
          (r == 32 ? 64.0 : 1.0) * (256.0 + 2.0 * static_cast<double>((r * 7 + j * 13) % 128));
  std::vector<double> one = g, every = g;
  for (int64_t j = 0; j < cols; ++j) {
    one[static_cast<size_t>(32 * cols + j)] += 128.0;  // one ULP at 64 x [256, 512)
    for (int64_t r = 0; r < rows; ++r)
      every[static_cast<size_t>(r * cols + j)] += r == 32 ? 128.0 : 2.0;
  }
  const PointStats a = compare_point(g, one, rows, cols), b = compare_point(g, every, rows, cols);
  EXPECT_GT(a.rel_l2, 0.00195) << "the dominant token's ULP dominates the tensor";
  EXPECT_TRUE(judge_point(s, "layers.2.moe.expert_out", a).pass)
      << judge_point(s, "layers.2.moe.expert_out", a).failures.front();
  const Verdict v = judge_point(s, "layers.2.moe.expert_out", b);
  EXPECT_FALSE(v.pass);
  EXPECT_THAT(v.failures, ::testing::Contains(HasSubstr("median token")));
}

}  // namespace
}  // namespace qparity::golden
