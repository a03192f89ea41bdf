#pragma once
// A candidate dump against a golden, capture point by capture point in execution order, then end
// to end from the logits, judged by a tolerance policy (policy.h). What `qparity compare` prints
// and `qparity bisect` walks.
#include <optional>
#include <string>
#include <vector>

#include "core/json_util.h"
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

struct CompareReport {
  std::string golden_file, candidate_file;
  GoldenMeta golden, candidate;
  int64_t seq_len = 0;
  std::string policy_file, policy_section;  // "engine.sm90", "format"
  std::vector<PointReport> points;          // common points, golden execution order
  std::vector<std::string> missing_in_candidate;
  EndToEnd e2e;
  Verdict e2e_verdict;
  std::vector<LayerRouter> router;
  std::vector<LayerExperts> experts;
  std::vector<ActivationStatsRow> activation_stats;  // candidate's order, then golden-only rows
  // Mean over layers of the rope_k rows' relative L2, per position in the sequence: how the
  // keys that go into the KV cache drift with position.
  std::vector<double> kv_error_by_position;
  bool pass = true;
  int64_t first_failing = -1;  // index into points, -1 none
};

struct CompareOptions {
  const Policy* policy = nullptr;  // none: metrics only, everything passes
  PolicyRole role = PolicyRole::kEngine;
  std::optional<std::string> device;  // override the candidate's device key
};

// The inputs must be identical (same tokens, same sequence split): an Error otherwise.
CompareReport compare_goldens(const GoldenReader& golden, const GoldenReader& candidate,
                              const CompareOptions& options);

Json to_json(const CompareReport& r);
// JSON has no Inf/NaN: reports store them as "inf", "-inf", "nan"; json_double reads either form.
Json json_number(double v);
double json_double(const Json& j);
// A terminal summary: one line per point (worst first failing marked), then end to end.
std::string to_text(const CompareReport& r);

}  // namespace qparity::golden
