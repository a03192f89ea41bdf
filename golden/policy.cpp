#include "golden/policy.h"

#include <fnmatch.h>

#include <cmath>
#include <fstream>
#include <regex>
#include <sstream>

#include "core/error.h"
#include "core/json_util.h"

namespace qparity::golden {

namespace {

std::string num(double v) {
  std::ostringstream s;
  s.precision(3);
  s << v;
  return s.str();
}

std::optional<double> opt_number(const Json& j, const char* key, const std::string& where) {
  if (!j.contains(key)) return std::nullopt;
  if (!j[key].is_number()) throw Error(where, std::string("'") + key + "' must be a number");
  const double v = j[key].get<double>();
  if (!std::isfinite(v) || v < 0) throw Error(where, std::string("'") + key + "' must be >= 0");
  return v;
}

PolicySection parse_section(const Json& j, const std::string& where) {
  if (!j.is_object()) throw Error(where, "must be an object");
  static const char* const known[] = {"derivation", "provenance", "points", "end_to_end"};
  for (const auto& [k, v] : j.items()) {
    bool ok = false;
    for (const char* n : known)
      ok = ok || k == n;
    if (!ok) throw Error(where, "unknown key '" + k + "'");
  }
  PolicySection s;
  if (!j.contains("derivation") || !j["derivation"].is_string() ||
      j["derivation"].get<std::string>().empty())
    throw Error(where, "needs a non-empty 'derivation' (where its numbers come from)");
  s.derivation = j["derivation"].get<std::string>();
  if (j.contains("provenance")) s.provenance = j["provenance"].get<std::string>();
  if (j.contains("points")) {
    if (!j["points"].is_array()) throw Error(where + ".points", "must be an array");
    for (size_t i = 0; i < j["points"].size(); ++i) {
      const Json& p = j["points"][i];
      const std::string w = where + ".points[" + std::to_string(i) + "]";
      if (!p.is_object() || !p.contains("match") || !p["match"].is_string())
        throw Error(w, "needs a 'match' glob");
      PointGate g;
      g.match = p["match"].get<std::string>();
      g.max_rel_l2 = opt_number(p, "max_rel_l2", w);
      g.max_col_rel_l2 = opt_number(p, "max_col_rel_l2", w);
      g.max_median_row_rel_l2 = opt_number(p, "max_median_row_rel_l2", w);
      g.max_abs = opt_number(p, "max_abs", w);
      g.min_cosine = opt_number(p, "min_cosine", w);
      g.max_deepgemm_diff = opt_number(p, "max_deepgemm_diff", w);
      if (const auto m = opt_number(p, "max_mismatches", w))
        g.max_mismatches = static_cast<int64_t>(*m);
      if (p.contains("why")) g.why = p["why"].get<std::string>();
      for (const auto& [k, v] : p.items())
        if (k != "match" && k != "max_rel_l2" && k != "max_col_rel_l2" &&
            k != "max_median_row_rel_l2" && k != "max_abs" && k != "min_cosine" &&
            k != "max_deepgemm_diff" && k != "max_mismatches" && k != "why")
          throw Error(w, "unknown key '" + k + "'");
      s.points.push_back(std::move(g));
    }
  }
  if (j.contains("end_to_end")) {
    const Json& e = j["end_to_end"];
    const std::string w = where + ".end_to_end";
    s.end_to_end.max_kld_upper = opt_number(e, "max_kld_upper", w);
    s.end_to_end.min_top1_lower = opt_number(e, "min_top1_lower", w);
    s.end_to_end.max_dln_ppl_upper = opt_number(e, "max_dln_ppl_upper", w);
    if (e.contains("why")) s.end_to_end.why = e["why"].get<std::string>();
    for (const auto& [k, v] : e.items())
      if (k != "max_kld_upper" && k != "min_top1_lower" && k != "max_dln_ppl_upper" && k != "why")
        throw Error(w, "unknown key '" + k + "'");
  }
  return s;
}

}  // namespace

Policy parse_policy(const std::string& text, const std::string& file) {
  Json j;
  try {
    j = Json::parse(text);
  } catch (const std::exception& e) {
    throw Error(file, std::string("not valid JSON: ") + e.what());
  }
  if (!j.is_object()) throw Error(file, "a policy is a JSON object");
  Policy p;
  p.file = file;
  if (!j.contains("scheme") || !j["scheme"].is_string()) throw Error(file, "needs 'scheme'");
  p.scheme = j["scheme"].get<std::string>();
  for (const auto& [k, v] : j.items())
    if (k != "scheme" && k != "engine" && k != "format" && k != "comment")
      throw Error(file, "unknown key '" + k + "'");
  if (!j.contains("engine") || !j["engine"].is_object() || !j["engine"].contains("default"))
    throw Error(file, "needs 'engine' with a 'default' section");
  for (const auto& [k, v] : j["engine"].items())
    p.engine[k] = parse_section(v, file + ": engine." + k);
  if (j.contains("format")) p.format = parse_section(j["format"], file + ": format");
  return p;
}

Policy load_policy(const std::filesystem::path& file) {
  std::ifstream f(file);
  if (!f) throw Error(file.string(), "cannot read the policy file");
  std::stringstream ss;
  ss << f.rdbuf();
  return parse_policy(ss.str(), file.string());
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
  if (chosen) *chosen = it->first;
  return it->second;
}

Verdict judge_point(const PolicySection& s, const std::string& point, const PointStats& st) {
  Verdict v;
  if (st.nan_candidate + st.inf_candidate > st.nan_golden + st.inf_golden) {
    v.pass = false;
    v.failures.push_back(std::to_string(st.nan_candidate) + " NaN / " +
                         std::to_string(st.inf_candidate) + " Inf in the candidate (first at " +
                         std::to_string(st.first_nonfinite) + ")");
  }
  for (const auto& g : s.points) {
    if (fnmatch(g.match.c_str(), point.c_str(), 0) != 0) continue;
    v.gated = true;
    v.gate = g.match;
    if (g.max_rel_l2 && !(st.rel_l2 <= *g.max_rel_l2))
      v.failures.push_back("rel_l2 " + num(st.rel_l2) + " > " + num(*g.max_rel_l2));
    if (g.max_col_rel_l2 && !(st.max_col_rel_l2 <= *g.max_col_rel_l2))
      v.failures.push_back("channel " + std::to_string(st.worst_col) + " rel_l2 " +
                           num(st.max_col_rel_l2) + " > " + num(*g.max_col_rel_l2));
    if (g.max_median_row_rel_l2 && !(st.median_row_rel_l2 <= *g.max_median_row_rel_l2))
      v.failures.push_back("median token rel_l2 " + num(st.median_row_rel_l2) + " > " +
                           num(*g.max_median_row_rel_l2));
    if (g.max_abs && !(st.max_abs <= *g.max_abs))
      v.failures.push_back("max_abs " + num(st.max_abs) + " > " + num(*g.max_abs));
    if (g.min_cosine && !(st.cosine >= *g.min_cosine))
      v.failures.push_back("cosine " + num(st.cosine) + " < " + num(*g.min_cosine));
    if (g.max_deepgemm_diff && !(st.deepgemm_diff <= *g.max_deepgemm_diff))
      v.failures.push_back("deepgemm_diff " + num(st.deepgemm_diff) + " > " +
                           num(*g.max_deepgemm_diff));
    if (g.max_mismatches && st.integer_codes && st.mismatches > *g.max_mismatches)
      v.failures.push_back("mismatches " + std::to_string(st.mismatches) + " > " +
                           std::to_string(*g.max_mismatches));
    break;
  }
  v.pass = v.failures.empty();
  return v;
}

Verdict judge_end_to_end(const PolicySection& s, const EndToEnd& e) {
  Verdict v;
  v.gate = "end_to_end";
  const EndToEndGate& g = s.end_to_end;
  v.gated = g.max_kld_upper || g.min_top1_lower || g.max_dln_ppl_upper;
  if (g.max_kld_upper && !(e.kld_mean.hi <= *g.max_kld_upper))
    v.failures.push_back("mean KLD upper bound " + num(e.kld_mean.hi) + " > " +
                         num(*g.max_kld_upper));
  if (g.min_top1_lower && !(e.top1.lo >= *g.min_top1_lower))
    v.failures.push_back("top-1 agreement lower bound " + num(e.top1.lo) + " < " +
                         num(*g.min_top1_lower));
  if (g.max_dln_ppl_upper && e.scored > 0 && !(e.dln_ppl.hi <= *g.max_dln_ppl_upper))
    v.failures.push_back("ln(PPL ratio) upper bound " + num(e.dln_ppl.hi) + " > " +
                         num(*g.max_dln_ppl_upper));
  v.pass = v.failures.empty();
  return v;
}

}  // namespace qparity::golden
