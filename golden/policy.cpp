#include "golden/policy.h"

#include <fnmatch.h>

#include <cmath>
#include <fstream>
#include <regex>
#include <sstream>

#include "core/capture/capture_points.h"
#include "core/error.h"
#include "core/input_file.h"
#include "core/json_util.h"
#include "schemes/description/scheme_registry.h"

namespace qparity::golden {

namespace {

void only_keys(const Json& j, std::initializer_list<const char*> known, const std::string& where) {
  for (const auto& [k, v] : j.items()) {
    bool ok = false;
    for (const char* n : known)
      ok = ok || k == n;
    if (!ok) throw Error(where, "unknown key '" + k + "'");
  }
}

std::string opt_string(const Json& j, const char* key, const std::string& where) {
  if (!j.contains(key)) return "";
  if (!j[key].is_string()) throw Error(where, std::string("'") + key + "' must be a string");
  return j[key].get<std::string>();
}

// A number within [lo, hi] (both finite unless given as infinities).
std::optional<double> opt_number(const Json& j, const char* key, const std::string& where,
                                 double lo, double hi, const char* range) {
  if (!j.contains(key)) return std::nullopt;
  if (!j[key].is_number()) throw Error(where, std::string("'") + key + "' must be a number");
  const double v = j[key].get<double>();
  if (!std::isfinite(v) || v < lo || v > hi)
    throw Error(where, std::string("'") + key + "' = " + short_number(v) + " is outside " + range);
  return v;
}

std::optional<double> opt_bound(const Json& j, const char* key, const std::string& where) {
  return opt_number(j, key, where, 0, INFINITY, "[0, inf) (a finite bound >= 0)");
}

std::string glob_of(const Json& v, const std::string& where) {
  if (!v.is_string() || v.get<std::string>().empty())
    throw Error(where, "must be a non-empty glob string");
  const std::string g = v.get<std::string>();
  if (!glob_names_a_capture_point(g))
    throw Error(where, "'" + g +
                           "' names no capture point of any model (see golden/SCHEMA.md: embed, "
                           "layers.<i>.attn.qkv, ..., final_norm, logits): it would gate nothing");
  return g;
}

PointGate parse_gate(const Json& p, const std::string& w) {
  if (!p.is_object() || !p.contains("match")) throw Error(w, "needs a 'match' glob");
  only_keys(p,
            {"match", "max_rel_l2", "max_col_rel_l2", "max_median_row_rel_l2", "max_abs",
             "min_cosine", "max_deepgemm_diff", "max_mismatches", "why"},
            w);
  PointGate g;
  g.match = glob_of(p["match"], w + ".match");
  g.max_rel_l2 = opt_bound(p, "max_rel_l2", w);
  g.max_col_rel_l2 = opt_bound(p, "max_col_rel_l2", w);
  g.max_median_row_rel_l2 = opt_bound(p, "max_median_row_rel_l2", w);
  g.max_abs = opt_bound(p, "max_abs", w);
  g.min_cosine = opt_number(p, "min_cosine", w, -1, 1, "[-1, 1]");
  g.max_deepgemm_diff = opt_bound(p, "max_deepgemm_diff", w);
  // Counts are exact integers up to 2^53 in a double; beyond that, or fractional, is a typo.
  if (const auto m = opt_number(p, "max_mismatches", w, 0, 0x1p53, "[0, 2^53]")) {
    if (std::trunc(*m) != *m)
      throw Error(w, "'max_mismatches' = " + short_number(*m) + " is not an integer");
    g.max_mismatches = static_cast<int64_t>(*m);
  }
  g.why = opt_string(p, "why", w);
  if (!g.max_rel_l2 && !g.max_col_rel_l2 && !g.max_median_row_rel_l2 && !g.max_abs &&
      !g.min_cosine && !g.max_deepgemm_diff && !g.max_mismatches)
    throw Error(w,
                "gates nothing: give at least one threshold (max_rel_l2, max_col_rel_l2, "
                "max_median_row_rel_l2, max_abs, min_cosine, max_deepgemm_diff, "
                "max_mismatches)");
  return g;
}

PolicySection parse_section(const Json& j, const std::string& where) {
  if (!j.is_object()) throw Error(where, "must be an object");
  only_keys(j,
            {"derivation", "provenance", "points", "end_to_end", "point_gates_apply_to",
             "optional_points"},
            where);
  PolicySection s;
  s.derivation = opt_string(j, "derivation", where);
  if (s.derivation.empty())
    throw Error(where, "needs a non-empty 'derivation' (where its numbers come from)");
  s.provenance = opt_string(j, "provenance", where);
  if (j.contains("points")) {
    if (!j["points"].is_array()) throw Error(where + ".points", "must be an array");
    for (size_t i = 0; i < j["points"].size(); ++i)
      s.points.push_back(parse_gate(j["points"][i], where + ".points[" + std::to_string(i) + "]"));
  }
  if (j.contains("end_to_end")) {
    const Json& e = j["end_to_end"];
    const std::string w = where + ".end_to_end";
    if (!e.is_object()) throw Error(w, "must be an object");
    only_keys(e, {"max_kld_upper", "min_top1_lower", "max_dln_ppl_upper", "why"}, w);
    s.end_to_end.max_kld_upper = opt_bound(e, "max_kld_upper", w);
    s.end_to_end.min_top1_lower = opt_number(e, "min_top1_lower", w, 0, 1, "[0, 1]");
    // >= 0 as every other bound (docs/JUDGE.md): a negative one would demand the quantized model beat
    // the unquantized one's perplexity.
    s.end_to_end.max_dln_ppl_upper = opt_bound(e, "max_dln_ppl_upper", w);
    s.end_to_end.why = opt_string(e, "why", w);
    if (!s.has_end_to_end_gate())
      throw Error(w, "gates nothing: give max_kld_upper, min_top1_lower or max_dln_ppl_upper");
  }
  if (s.points.empty() && !s.has_end_to_end_gate())
    throw Error(where, "gates nothing: it needs 'points' gates or an 'end_to_end' gate");
  if (j.contains("point_gates_apply_to")) {
    const Json& a = j["point_gates_apply_to"];
    const std::string w = where + ".point_gates_apply_to";
    if (!a.is_array() || a.empty())
      throw Error(w, "must be a non-empty array of \"layer-local\" / \"free-run\"");
    s.points_judge_free_runs = s.points_judge_layer_local = false;
    for (const auto& v : a) {
      const std::string m = v.is_string() ? v.get<std::string>() : "";
      if (m == "layer-local")
        s.points_judge_layer_local = true;
      else if (m == "free-run")
        s.points_judge_free_runs = true;
      else
        throw Error(w, "'" + v.dump() + "' (\"layer-local\" or \"free-run\")");
    }
  }
  if (j.contains("optional_points")) {
    const Json& a = j["optional_points"];
    const std::string w = where + ".optional_points";
    if (!a.is_array()) throw Error(w, "must be an array of globs");
    for (size_t i = 0; i < a.size(); ++i)
      s.optional_points.push_back(glob_of(a[i], w + "[" + std::to_string(i) + "]"));
  }
  return s;
}

bool valid_device_key(const std::string& k) {
  static const std::regex sm(R"(sm\d{2,3})");
  return k == "default" || k == "cpu-reference" || std::regex_match(k, sm);
}

}  // namespace

bool PolicySection::may_lack(const std::string& point) const {
  for (const auto& g : optional_points)
    if (fnmatch(g.c_str(), point.c_str(), 0) == 0) return true;
  return false;
}

bool PolicySection::has_end_to_end_gate() const {
  return end_to_end.max_kld_upper || end_to_end.min_top1_lower || end_to_end.max_dln_ppl_upper;
}

std::string short_number(double v) {
  std::ostringstream s;
  s.precision(3);
  s << v;
  return s.str();
}

Policy parse_policy(const std::string& text, const std::string& file) {
  const Json j = parse_json_text(text, file);  // duplicate keys refused by name
  if (!j.is_object()) throw Error(file, "a policy is a JSON object");
  only_keys(j, {"scheme", "engine", "format", "budget", "comment"}, file);
  Policy p;
  p.file = file;
  p.scheme = opt_string(j, "scheme", file);
  if (p.scheme.empty()) throw Error(file, "needs 'scheme' (a scheme id: qparity schemes)");
  try {
    parse_scheme_id(p.scheme);
  } catch (const Error& e) {
    throw Error(file + ": scheme", e.what());
  }
  opt_string(j, "comment", file);
  if (!j.contains("engine") || !j["engine"].is_object() || !j["engine"].contains("default"))
    throw Error(file, "needs 'engine' with a 'default' section");
  for (const auto& [k, v] : j["engine"].items()) {
    if (!valid_device_key(k))
      throw Error(file + ": engine." + k,
                  "unknown device key (default, cpu-reference, or smNN as in sm90)");
    p.engine[k] = parse_section(v, file + ": engine." + k);
  }
  if (j.contains("format")) p.format = parse_section(j["format"], file + ": format");
  if (j.contains("budget")) {
    p.budget = parse_section(j["budget"], file + ": budget");
    if (!p.budget->points.empty() || !p.budget->has_end_to_end_gate())
      throw Error(file + ": budget",
                  "a budget is end-to-end gates only ('end_to_end'), no 'points'");
  }
  return p;
}

Policy load_policy(const std::filesystem::path& file) {
  return parse_policy(read_input_file(file, "policy file"), file.string());
}

std::string device_key(const std::string& device) {
  if (device == "cpu-reference") return device;
  std::smatch m;
  static const std::regex sm(R"(\bsm_?(\d{2,3})\b)");
  if (std::regex_search(device, m, sm)) return "sm" + m[1].str();
  return "default";
}

const PolicySection& policy_section(const Policy& p, PolicyRole role, const std::string& key,
                                    std::string* chosen) {
  if (role == PolicyRole::kFormat) {
    if (!p.format) throw Error(p.file, "has no 'format' section");
    if (chosen) *chosen = "format";
    return *p.format;
  }
  auto it = p.engine.find(key);
  if (it == p.engine.end()) it = p.engine.find("default");
  if (it == p.engine.end()) throw Error(p.file, "has no 'engine.default' section");
  if (chosen) *chosen = it->first;
  return it->second;
}

std::vector<std::string> nonfinite_failures(const PointStats& st) {
  std::vector<std::string> out;
  const auto line = [&](int64_t nan, int64_t inf, const char* side) {
    if (nan + inf == 0) return;
    out.push_back(std::to_string(nan) + " NaN / " + std::to_string(inf) + " Inf in the " + side +
                  " (first non-finite element at flat index " + std::to_string(st.first_nonfinite) +
                  ")");
  };
  line(st.nan_candidate, st.inf_candidate, "candidate");
  line(st.nan_golden, st.inf_golden, "golden");
  return out;
}

std::vector<std::string> nonfinite_failures(const EndToEnd& e) {
  std::vector<std::string> out;
  const auto line = [&](int64_t rows, const char* side) {
    if (rows == 0) return;
    out.push_back(std::to_string(rows) + " position(s) with NaN/Inf logits in the " + side +
                  " (first at row " + std::to_string(e.first_nonfinite_row) + ")");
  };
  line(e.nonfinite_candidate_rows, "candidate");
  line(e.nonfinite_golden_rows, "golden");
  return out;
}

Verdict judge_point(const PolicySection& s, const std::string& point, const PointStats& st) {
  Verdict v;
  v.failures = nonfinite_failures(st);
  for (const auto& g : s.points) {
    if (fnmatch(g.match.c_str(), point.c_str(), 0) != 0) continue;
    v.gated = true;
    v.gate = g.match;
    v.limit_rel_l2 = g.max_rel_l2;
    if (g.max_rel_l2 && !(st.rel_l2 <= *g.max_rel_l2))
      v.failures.push_back("rel_l2 " + short_number(st.rel_l2) + " > " +
                           short_number(*g.max_rel_l2));
    if (g.max_col_rel_l2 && !(st.max_col_rel_l2 <= *g.max_col_rel_l2))
      v.failures.push_back("channel " + std::to_string(st.worst_col) + " rel_l2 " +
                           short_number(st.max_col_rel_l2) + " > " +
                           short_number(*g.max_col_rel_l2));
    if (g.max_median_row_rel_l2 && !(st.median_row_rel_l2 <= *g.max_median_row_rel_l2))
      v.failures.push_back("median token rel_l2 " + short_number(st.median_row_rel_l2) + " > " +
                           short_number(*g.max_median_row_rel_l2));
    if (g.max_abs && !(st.max_abs <= *g.max_abs))
      v.failures.push_back("max_abs " + short_number(st.max_abs) + " > " +
                           short_number(*g.max_abs));
    if (g.min_cosine && !(st.cosine >= *g.min_cosine))
      v.failures.push_back("cosine " + short_number(st.cosine) + " < " +
                           short_number(*g.min_cosine));
    if (g.max_deepgemm_diff && !(st.deepgemm_diff <= *g.max_deepgemm_diff))
      v.failures.push_back("deepgemm_diff " + short_number(st.deepgemm_diff) + " > " +
                           short_number(*g.max_deepgemm_diff));
    if (g.max_mismatches && st.integer_codes && st.mismatches > *g.max_mismatches)
      v.failures.push_back("mismatches " + std::to_string(st.mismatches) + " > " +
                           std::to_string(*g.max_mismatches));
    break;
  }
  v.pass = v.failures.empty();
  return v;
}

std::string budget_check_text(const Verdict& v) {
  if (!v.failures.empty()) return "EXCEEDED";
  return v.undecided.empty() ? "within" : "undecided";
}

Verdict judge_end_to_end(const PolicySection& s, const EndToEnd& e) {
  Verdict v;
  v.gate = "end_to_end";
  const EndToEndGate& g = s.end_to_end;
  v.gated = s.has_end_to_end_gate();
  v.failures = nonfinite_failures(e);
  if (g.max_kld_upper && !(e.kld_mean.hi <= *g.max_kld_upper))
    v.failures.push_back("mean KLD upper bound " + short_number(e.kld_mean.hi) + " > " +
                         short_number(*g.max_kld_upper));
  // With n positions even n/n agreement has a Wilson lower bound below 1: under the threshold
  // the gate cannot pass whatever the data, so it decides only a clear failure (the upper bound
  // below the threshold) and otherwise says it cannot judge.
  const double best_lower = e.positions > 0 ? wilson_interval(e.positions, e.positions).lo : 0.0;
  if (g.min_top1_lower && e.positions > 0 && best_lower < *g.min_top1_lower &&
      e.top1.hi >= *g.min_top1_lower)
    v.undecided.push_back("top-1 agreement: too few positions to judge (" +
                          std::to_string(e.positions) + ": even full agreement has a lower bound " +
                          short_number(best_lower) + " < " + short_number(*g.min_top1_lower) + ")");
  else if (g.min_top1_lower && !(e.top1.lo >= *g.min_top1_lower))
    v.failures.push_back("top-1 agreement lower bound " + short_number(e.top1.lo) + " < " +
                         short_number(*g.min_top1_lower));
  if (g.max_dln_ppl_upper && e.scored == 0)
    v.failures.push_back("ln(PPL ratio) is gated but no position has a target to score");
  else if (g.max_dln_ppl_upper && !(e.dln_ppl.hi <= *g.max_dln_ppl_upper))
    v.failures.push_back("ln(PPL ratio) upper bound " + short_number(e.dln_ppl.hi) + " > " +
                         short_number(*g.max_dln_ppl_upper));
  v.pass = v.failures.empty();
  return v;
}

}  // namespace qparity::golden
