#pragma once
// Tolerance policies are data (policies/<scheme>.json, installed beside the binary): per capture
// point thresholds and a statistical gate on end-to-end metrics, each with the derivation that
// gives its number. Two roles:
//   "engine": a candidate engine against the reference golden of the SAME scheme (is the format
//             implemented right?), keyed by device ("cpu-reference", "sm90", ...; "default"
//             otherwise), so a GPU can carry its own override with its provenance;
//   "format": the quantized reference against the unquantized reference (what the format does
//             to the model; `qparity validate`).
// File layout:
//   {"scheme": "fp8-block",
//    "engine": {"default": SECTION, "sm90": SECTION, ...},
//    "format": SECTION,
//    "budget": {"derivation": "...", "end_to_end": {...}}}
// The format role answers two questions, reported apart: does the quantized reference do the
// format's math ("format": gates at the first op that carries the format's error alone), and is
// the format acceptable for this model ("budget": end-to-end gates only, a default per format
// family that the user may replace with `--budget`).
//   SECTION = {"derivation": "...", "provenance": "...",
//              "points": [{"match": "<glob>", "max_rel_l2": x, "max_col_rel_l2": x (per
//                          channel), "max_median_row_rel_l2": x (the median token), "max_abs": x,
//                          "min_cosine": x,
//                          "max_deepgemm_diff": x, "max_mismatches": n, "why": "..."}, ...],
//              "end_to_end": {"max_kld_upper": x, "min_top1_lower": x,
//                             "max_dln_ppl_upper": x, "why": "..."},
//              "point_gates_apply_to": ["layer-local", "free-run"] (default both),
//              "optional_points": ["<glob>", ...] (points a candidate may lack; default none)}
// A point is judged by the first entry whose glob matches its name; a point no entry matches is
// reported and not gated. Non-finite values (NaN/Inf) in either file always fail, with or
// without a gate.
//
// A policy that cannot gate is refused when parsed, naming the file and the key: an unknown key,
// a glob that names no capture point of any model (core/capture/capture_points.h), a gate entry
// without a threshold, a section with no gate at all, a number out of its range (negative or
// non-finite bounds, cosine outside [-1, 1], a top-1 bound outside [0, 1], a mismatch count that
// is not an integer in [0, 2^53]), a non-string "why", an unknown scheme id or device key.
#include <filesystem>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "golden/golden_file.h"  // RunMode
#include "golden/metrics.h"

namespace qparity::golden {

struct PointGate {
  std::string match;
  std::optional<double> max_rel_l2, max_col_rel_l2, max_median_row_rel_l2, max_abs, min_cosine,
      max_deepgemm_diff;
  std::optional<int64_t> max_mismatches;
  std::string why;
};

struct EndToEndGate {
  std::optional<double> max_kld_upper;      // upper 95% bound of mean KLD
  std::optional<double> min_top1_lower;     // lower 95% bound of top-1 agreement
  std::optional<double> max_dln_ppl_upper;  // upper 95% bound of ln(PPL_c / PPL_g)
  std::string why;
};

struct PolicySection {
  std::string derivation;
  std::string provenance;
  std::vector<PointGate> points;
  EndToEndGate end_to_end;
  // Which runs the per-point gates judge; the end-to-end gates judge every run.
  bool points_judge_free_runs = true;
  bool points_judge_layer_local = true;
  std::vector<std::string> optional_points;  // globs: points a candidate may lack

  bool judges_points_of(RunMode m) const {
    return m == RunMode::kFree ? points_judge_free_runs : points_judge_layer_local;
  }
  bool may_lack(const std::string& point) const;
  bool has_end_to_end_gate() const;
};

struct Policy {
  std::string scheme;
  std::string file;
  std::map<std::string, PolicySection> engine;  // by device key; "default" required
  std::optional<PolicySection> format;          // the format role's math check (the first op)
  std::optional<PolicySection> budget;  // the format role's acceptance budget (end to end only)
};

Policy load_policy(const std::filesystem::path& file);
Policy parse_policy(const std::string& json_text, const std::string& file);

// "cpu-reference" stays; a GPU device string containing "smNN" gives "smNN"; else "default".
std::string device_key(const std::string& device);

enum class PolicyRole { kEngine, kFormat };
// The section for a role and device key (engine: the device's entry, else "default").
const PolicySection& policy_section(const Policy& p, PolicyRole role, const std::string& device_key,
                                    std::string* chosen_key = nullptr);

struct Verdict {
  bool pass = true;
  bool gated = false;                  // a gate applied
  std::string gate;                    // the matching glob, or "end_to_end"
  std::optional<double> limit_rel_l2;  // the matching gate's max_rel_l2 (reports draw it)
  std::vector<std::string> failures;   // "rel_l2 3.1e-3 > 5e-4"
  // Gates the data cannot decide (too few positions for the bound to reach the threshold even
  // at full agreement): the comparison is then NOT JUDGED, never FAIL for identical data.
  std::vector<std::string> undecided;
};

// "EXCEEDED" (a gate failed), "undecided" (too few positions for a gate), or "within".
std::string budget_check_text(const Verdict& v);

Verdict judge_point(const PolicySection& s, const std::string& point, const PointStats& st);
Verdict judge_end_to_end(const PolicySection& s, const EndToEnd& e);

// A number in a verdict line: three significant digits ("3.1e-03" style as iostream prints it).
std::string short_number(double v);

// NaN/Inf in a point or the logits, in either file: a failure line, whatever the policy says
// (empty when there are none).
std::vector<std::string> nonfinite_failures(const PointStats& st);
std::vector<std::string> nonfinite_failures(const EndToEnd& e);

}  // namespace qparity::golden
