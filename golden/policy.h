#pragma once
// Tolerance policies are data (tests/accuracy/policies/<scheme>.json): per capture point
// thresholds and a statistical gate on end-to-end metrics, each with the derivation that gives
// its number. Two roles:
//   "engine": a candidate engine against the reference golden of the SAME scheme (is the format
//             implemented right?), keyed by device ("cpu-reference", "sm90", ...; "default"
//             otherwise), so a GPU can carry its own override with its provenance;
//   "format": the quantized reference against the unquantized reference (what the format does
//             to the model; `qparity validate`).
// File layout:
//   {"scheme": "fp8-block",
//    "engine": {"default": SECTION, "sm90": SECTION, ...},
//    "format": SECTION}
//   SECTION = {"derivation": "...", "provenance": "...",
//              "points": [{"match": "<glob>", "max_rel_l2": x, "max_col_rel_l2": x (per
//                          channel), "max_median_row_rel_l2": x (the median token), "max_abs": x,
//                          "min_cosine": x,
//                          "max_deepgemm_diff": x, "max_mismatches": n, "why": "..."}, ...],
//              "end_to_end": {"max_kld_upper": x, "min_top1_lower": x,
//                             "max_dln_ppl_upper": x, "why": "..."}}
// A point is judged by the first entry whose glob matches its name; a point no entry matches is
// reported and not gated. Non-finite candidate values where the golden is finite always fail.
#include <filesystem>
#include <map>
#include <optional>
#include <string>
#include <vector>

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
};

struct Policy {
  std::string scheme;
  std::string file;
  std::map<std::string, PolicySection> engine;  // by device key; "default" required
  std::optional<PolicySection> format;
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
  bool gated = false;                 // a gate applied
  std::string gate;                   // the matching glob, or "end_to_end"
  std::vector<std::string> failures;  // "rel_l2 3.1e-3 > 5e-4"
};

Verdict judge_point(const PolicySection& s, const std::string& point, const PointStats& st);
Verdict judge_end_to_end(const PolicySection& s, const EndToEnd& e);

}  // namespace qparity::golden
