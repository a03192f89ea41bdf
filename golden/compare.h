#pragma once
// A candidate dump against a golden, capture point by capture point in execution order, then end
// to end from the logits, judged by a tolerance policy (policy.h). What `qparity compare` prints
// and `qparity bisect` walks.
#include <optional>
#include <string>
#include <vector>

#include "core/json_util.h"
#include "golden/detection_limit.h"
#include "golden/golden_file.h"
#include "golden/metrics.h"
#include "golden/policy.h"

namespace qparity::golden {

struct PointReport {
  std::string name;
  int64_t cols = 0;
  PointStats stats;
  Verdict verdict;
};

struct LayerRouter {
  std::string point;  // "layers.3.moe.topk_ids"
  RouterFlips flips;
};

// A MoE layer's experts, from `layers.i.moe.expert_out` aligned on the routing (metrics.h).
struct LayerExperts {
  std::string point;  // "layers.3.moe.expert_out"
  int64_t matched = 0, unmatched = 0;
  std::vector<ExpertError> experts;
};

// Activation quantization statistics of one engine layer in both files (either may lack them).
struct ActivationStatsRow {
  std::string name;
  std::optional<ActivationCodeStats> golden, candidate;
};

// What a comparison concludes. Only a policy's gates can earn PASS; without a policy (or when
// none of its gates applies to this run) the numbers are "not judged". NaN/Inf anywhere is FAIL,
// policy or not.
enum class Judgement { kPass, kFail, kNotJudged };
const char* to_string(Judgement j);  // "PASS", "FAIL", "NOT JUDGED"

struct CompareReport {
  std::string golden_file, candidate_file;
  GoldenMeta golden, candidate;
  int64_t seq_len = 0;
  std::string policy_file, policy_section;        // "engine.sm90", "format"
  std::string policy_source;                      // how the policy was chosen (set by the caller)
  std::vector<PointReport> points;                // common points, golden execution order
  std::vector<std::string> missing_in_candidate;  // golden points the candidate lacks
  std::vector<std::string> missing_failures;      // of those, the ones the policy does not allow
  std::vector<std::string> extra_in_candidate;    // candidate points the golden lacks
  // Golden points the candidate's producer declared it cannot expose (absent_points): listed
  // with the declaration's reason, neither compared nor failed.
  struct DeclaredAbsent {
    std::string point, glob, reason;
  };
  std::vector<DeclaredAbsent> declared_absent;
  std::vector<std::string> unused_gates;  // the section's globs matching no common point
  // Differences of what the two files ran that the numbers alone do not show (the weight dtype:
  // an fp32 checkpoint's golden against an engine that ran its weights in bf16), one line each.
  std::vector<std::string> warnings;
  // Whether the section's per-point gates judge this candidate's run (policy.h: a free run of an
  // engine is judged end to end; its points are still measured against the gates and shown).
  bool point_gates_judge = false;
  EndToEnd e2e;
  Verdict e2e_verdict;
  // Format role: is the format acceptable for this model (the budget's end-to-end gates), apart
  // from whether its math is done right (the points and e2e_verdict above).
  bool has_budget = false;
  Verdict budget_verdict;
  std::string budget_source;
  std::vector<LayerRouter> router;
  std::vector<LayerExperts> experts;
  std::vector<ActivationStatsRow> activation_stats;  // candidate's order, then golden-only rows
  // Mean over layers (and over K and V) of the rows' relative L2, per position in the sequence,
  // from what a quantized KV cache holds (attn.k_cache, attn.v_cache) when the golden has those
  // points, else from the keys entering the cache (attn.rope_k): how the cache drifts with
  // position. kv_error_source names which ("attn.k_cache+attn.v_cache" or "attn.rope_k").
  std::vector<double> kv_error_by_position;
  std::string kv_error_source;
  // Every NaN/Inf finding, one line each ("points/layers.3.mlp.out: 4 NaN / 0 Inf in the
  // candidate ..."); any of them fails the comparison.
  std::vector<std::string> nonfinite;
  // The point gates' detection limits, measured on this candidate (detection_limit.h): the
  // first layer's main points, layer-local runs only.
  std::vector<DetectionLimit> detection_limits;
  Judgement verdict = Judgement::kNotJudged;
  bool pass = false;                  // verdict == kPass
  std::vector<std::string> failures;  // why the verdict is FAIL, one line each
  int64_t first_failing = -1;    // first point outside its gate or non-finite (index into points)
  int64_t first_nonfinite = -1;  // first point holding a NaN/Inf (index into points), -1 none
};

struct CompareOptions {
  const Policy* policy = nullptr;  // none: metrics only, "not judged" (NaN/Inf still fail)
  PolicyRole role = PolicyRole::kEngine;
  std::optional<std::string> device;  // override the candidate's device key
  // Format role: the acceptance budget (end-to-end gates) replacing the policy's "budget".
  std::optional<EndToEndGate> budget;
  std::string budget_source;  // what stated it ("--budget kld=0.05")
  // Engine role: golden and candidate must have run one checkpoint (their recorded hashes, where
  // both record one); true lets another through, said in the report's warnings.
  bool allow_other_checkpoint = false;
};

// The inputs must be identical (same tokens, same sequence split) and the files must share at
// least one capture point: an Error otherwise.
CompareReport compare_goldens(const GoldenReader& golden, const GoldenReader& candidate,
                              const CompareOptions& options);

Json to_json(const CompareReport& r);
// JSON has no Inf/NaN: reports store them as "inf", "-inf", "nan"; json_double reads either form.
Json json_number(double v);
double json_double(const Json& j);
// A terminal summary: how it was judged, one line per point (the first failure marked), missing
// and extra points, NaN/Inf findings, end to end, then the verdict.
std::string to_text(const CompareReport& r);
// One line: the policy, its section and source, and which gates judge this run.
std::string judged_by_text(const CompareReport& r);

}  // namespace qparity::golden
