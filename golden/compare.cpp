#include "golden/compare.h"

#include <cmath>
#include <cstdio>
#include <sstream>

#include "core/error.h"

namespace qparity::golden {

namespace {

bool ends_with(const std::string& s, const std::string& suffix) {
  return s.size() >= suffix.size() &&
         s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}

Json number(double v) {
  return json_number(v);
}

Json interval(const Interval& i) {
  return {{"value", number(i.value)}, {"lo", number(i.lo)}, {"hi", number(i.hi)}};
}

Json meta_json(const GoldenMeta& m) {
  Json j = Json::object();
  for (const auto& [name, field] : meta_string_fields())
    j[name] = m.*field;
  return j;
}

}  // namespace

Json json_number(double v) {
  if (std::isnan(v)) return "nan";
  if (std::isinf(v)) return v > 0 ? "inf" : "-inf";
  return v;
}

double json_double(const Json& j) {
  if (j.is_number()) return j.get<double>();
  if (j.is_string()) {
    const auto s = j.get<std::string>();
    if (s == "inf") return INFINITY;
    if (s == "-inf") return -INFINITY;
  }
  return NAN;
}

CompareReport compare_goldens(const GoldenReader& g, const GoldenReader& c,
                              const CompareOptions& o) {
  CompareReport r;
  r.golden_file = g.path().string();
  r.candidate_file = c.path().string();
  r.golden = g.meta();
  r.candidate = c.meta();
  r.seq_len = g.seq_len();
  if (g.sequences() != c.sequences() || g.seq_len() != c.seq_len() || g.tokens() != c.tokens())
    throw Error(r.candidate_file, "ran different inputs than " + r.golden_file + " (" +
                                      std::to_string(c.sequences()) + "x" +
                                      std::to_string(c.seq_len()) + " vs " +
                                      std::to_string(g.sequences()) + "x" +
                                      std::to_string(g.seq_len()) + " tokens, or other ids)");
  const PolicySection* section = nullptr;
  if (o.policy) {
    std::string key;
    const std::string dev = o.device ? *o.device : device_key(c.meta().device);
    section = &policy_section(*o.policy, o.role, dev, &key);
    r.policy_file = o.policy->file;
    r.policy_section = o.role == PolicyRole::kFormat ? "format" : "engine." + key;
  }
  std::vector<double> kv_sum(static_cast<size_t>(g.seq_len()), 0.0);
  int64_t kv_layers = 0;
  for (const auto& name : g.point_names()) {
    if (!c.has_point(name)) {
      r.missing_in_candidate.push_back(name);
      continue;
    }
    const Array2D a = g.point(name), b = c.point(name);
    if (a.cols != b.cols)
      throw Error(r.candidate_file, "points/" + name + " has width " + std::to_string(b.cols) +
                                        ", the golden " + std::to_string(a.cols));
    PointReport p;
    p.name = name;
    p.cols = a.cols;
    const bool ids = ends_with(name, ".topk_ids");
    const bool expert_out = ends_with(name, ".moe.expert_out");
    if (expert_out || ends_with(name, ".moe.topk_weights")) {
      // Per-slot values are compared per (token, expert) on the experts both sides chose, slots
      // aligned by id: engines may list a token's experts in another order.
      const std::string ids_name = name.substr(0, name.rfind('.') + 1) + "topk_ids";
      for (const GoldenReader* f : {&g, &c})
        if (!f->has_point(ids_name))
          throw Error(f->path().string(), "points/" + name + " needs points/" + ids_name +
                                              " to align expert slots; it is missing");
      const Array2D gi = g.point(ids_name), ci = c.point(ids_name);
      if (gi.cols <= 0 || a.cols % gi.cols != 0 || gi.cols != ci.cols)
        throw Error(r.candidate_file, "points/" + name + " width " + std::to_string(a.cols) +
                                          " is not a multiple of top_k " + std::to_string(gi.cols) +
                                          " (candidate top_k " + std::to_string(ci.cols) + ")");
      ExpertAlignment al =
          align_expert_outputs(a.data, b.data, gi.data, ci.data, a.rows, gi.cols, a.cols / gi.cols);
      p.stats = compare_point(al.golden, al.candidate, a.rows, a.cols, false);
      if (expert_out) r.experts.push_back({name, al.matched, al.unmatched, std::move(al.experts)});
    } else {
      p.stats = compare_point(a.data, b.data, a.rows, a.cols, ids);
    }
    if (ids) {
      const RouterFlips f = compare_router(a.data, b.data, a.rows, a.cols);
      p.stats.mismatches = f.changed_ids;  // as sets: an engine may order a token's experts freely
      r.router.push_back({name, f});
    }
    if (section) p.verdict = judge_point(*section, name, p.stats);
    if (ends_with(name, ".attn.rope_k")) {
      ++kv_layers;
      for (int64_t row = 0; row < a.rows; ++row)
        kv_sum[static_cast<size_t>(row % g.seq_len())] +=
            p.stats.row_rel_l2[static_cast<size_t>(row)];
    }
    if (!p.verdict.pass && r.first_failing < 0)
      r.first_failing = static_cast<int64_t>(r.points.size());
    r.points.push_back(std::move(p));
  }
  if (kv_layers > 0)
    for (double& v : kv_sum)
      r.kv_error_by_position.push_back(v / static_cast<double>(kv_layers * g.sequences()));
  {
    const auto gs = g.activation_stats(), cs = c.activation_stats();
    for (const auto& a : cs) {
      ActivationStatsRow row{a.name, std::nullopt, a};
      for (const auto& b : gs)
        if (b.name == a.name) row.golden = b;
      r.activation_stats.push_back(row);
    }
    for (const auto& b : gs) {
      bool seen = false;
      for (const auto& a : cs)
        seen = seen || a.name == b.name;
      if (!seen) r.activation_stats.push_back({b.name, b, std::nullopt});
    }
  }
  const Array2D gl = g.logits(), cl = c.logits();
  if (gl.cols != cl.cols)
    throw Error(r.candidate_file, "logits have vocab " + std::to_string(cl.cols) + ", the golden " +
                                      std::to_string(gl.cols));
  r.e2e = compare_logits(gl.data, cl.data, gl.rows, gl.cols, g.targets());
  if (section) r.e2e_verdict = judge_end_to_end(*section, r.e2e);
  r.pass = r.first_failing < 0 && r.e2e_verdict.pass;
  return r;
}

Json to_json(const CompareReport& r) {
  Json points = Json::array();
  for (const auto& p : r.points) {
    const PointStats& s = p.stats;
    Json j = {{"name", p.name},
              {"width", p.cols},
              {"max_abs", number(s.max_abs)},
              {"max_rel", number(s.max_rel)},
              {"rel_l2", number(s.rel_l2)},
              {"max_col_rel_l2", number(s.max_col_rel_l2)},
              {"median_row_rel_l2", number(s.median_row_rel_l2)},
              {"worst_col", s.worst_col},
              {"nmse", number(s.nmse)},
              {"cosine", number(s.cosine)},
              {"deepgemm_diff", number(s.deepgemm_diff)},
              {"sqnr_db", number(s.sqnr_db)},
              {"nan_candidate", s.nan_candidate},
              {"inf_candidate", s.inf_candidate},
              {"first_nonfinite", s.first_nonfinite},
              {"worst_index", s.worst_index},
              {"pass", p.verdict.pass},
              {"gated", p.verdict.gated},
              {"gate", p.verdict.gate},
              {"failures", p.verdict.failures}};
    if (s.integer_codes) j["mismatches"] = s.mismatches;
    Json rows = Json::array();
    for (double v : s.row_rel_l2)
      rows.push_back(number(v));
    j["row_rel_l2"] = rows;
    points.push_back(j);
  }
  const EndToEnd& e = r.e2e;
  Json kld = Json::array();
  for (double v : e.kld)
    kld.push_back(number(v));
  Json router = Json::array();
  for (const auto& l : r.router)
    router.push_back({{"point", l.point},
                      {"tokens", l.flips.tokens},
                      {"flipped", l.flips.flipped},
                      {"flip_rate", number(l.flips.flip_rate)},
                      {"first_flip", l.flips.first_flip}});
  Json experts = Json::array();
  for (const auto& l : r.experts) {
    Json per = Json::array();
    for (const auto& e : l.experts)
      per.push_back({{"expert", e.expert},
                     {"pairs", e.pairs},
                     {"rel_l2", number(e.rel_l2)},
                     {"max_abs", number(e.max_abs)}});
    experts.push_back(
        {{"point", l.point}, {"matched", l.matched}, {"unmatched", l.unmatched}, {"experts", per}});
  }
  Json kv = Json::array();
  for (double v : r.kv_error_by_position)
    kv.push_back(number(v));
  const auto stats_json = [](const std::optional<ActivationCodeStats>& a) -> Json {
    if (!a) return nullptr;
    return {{"codes", a->codes},
            {"saturated", a->saturated},
            {"saturation_rate", a->codes > 0 ? number(static_cast<double>(a->saturated) /
                                                      static_cast<double>(a->codes))
                                             : Json(nullptr)},
            {"scales", a->scales},
            {"zero_scales", a->zero_scales}};
  };
  Json act = Json::array();
  for (const auto& a : r.activation_stats)
    act.push_back({{"name", a.name},
                   {"golden", stats_json(a.golden)},
                   {"candidate", stats_json(a.candidate)}});
  return {{"golden", {{"file", r.golden_file}, {"meta", meta_json(r.golden)}}},
          {"candidate", {{"file", r.candidate_file}, {"meta", meta_json(r.candidate)}}},
          {"policy", {{"file", r.policy_file}, {"section", r.policy_section}}},
          {"pass", r.pass},
          {"first_failing_point", r.first_failing >= 0
                                      ? Json(r.points[static_cast<size_t>(r.first_failing)].name)
                                      : Json(nullptr)},
          {"missing_in_candidate", r.missing_in_candidate},
          {"points", points},
          {"end_to_end",
           {{"positions", e.positions},
            {"scored", e.scored},
            {"kld_mean", interval(e.kld_mean)},
            {"kld_median", number(e.kld_median)},
            {"kld_p90", number(e.kld_p90)},
            {"kld_p99", number(e.kld_p99)},
            {"kld_p999", number(e.kld_p999)},
            {"kld_max", number(e.kld_max)},
            {"top1", interval(e.top1)},
            {"dp_rms", number(e.dp_rms)},
            {"dln_ppl", interval(e.dln_ppl)},
            {"ppl_ratio", interval(e.ppl_ratio)},
            {"ppl_golden", number(e.ppl_golden)},
            {"ppl_candidate", number(e.ppl_candidate)},
            {"first_greedy_divergence", e.first_greedy_divergence},
            {"kld", kld},
            {"pass", r.e2e_verdict.pass},
            {"failures", r.e2e_verdict.failures}}},
          {"router", router},
          {"experts", experts},
          {"kv_error_by_position", kv},
          {"activation_stats", act}};
}

std::string to_text(const CompareReport& r) {
  std::ostringstream o;
  char line[512];
  o << "golden    " << r.golden_file << " (" << r.golden.scheme << ", " << r.golden.device
    << ")\ncandidate " << r.candidate_file << " (" << r.candidate.scheme << ", "
    << r.candidate.device << ")\n";
  if (!r.policy_file.empty())
    o << "policy    " << r.policy_file << " [" << r.policy_section << "]\n";
  std::snprintf(line, sizeof line, "%-32s %11s %11s %11s %9s %s\n", "capture point", "rel_l2",
                "max_abs", "1-cosine", "SQNR dB", "verdict");
  o << line;
  for (size_t i = 0; i < r.points.size(); ++i) {
    const auto& p = r.points[i];
    std::string verdict =
        !p.verdict.gated ? (p.verdict.pass ? "-" : "FAIL") : (p.verdict.pass ? "ok" : "FAIL");
    for (const auto& f : p.verdict.failures)
      verdict += "  " + f;
    if (static_cast<int64_t>(i) == r.first_failing) verdict += "   <- first failure";
    std::snprintf(line, sizeof line, "%-32s %11.3e %11.3e %11.3e %9.1f %s\n", p.name.c_str(),
                  p.stats.rel_l2, p.stats.max_abs, 1.0 - p.stats.cosine, p.stats.sqnr_db,
                  verdict.c_str());
    o << line;
  }
  for (const auto& m : r.missing_in_candidate)
    o << "  (not in the candidate: " << m << ")\n";
  const EndToEnd& e = r.e2e;
  std::snprintf(line, sizeof line,
                "end to end over %lld positions: mean KLD %.4g [%.4g, %.4g], p99 %.4g, max %.4g\n"
                "  top-1 agreement %.4f [%.4f, %.4f], RMS dp %.4g, ln(PPL ratio) %.4g [%.4g, "
                "%.4g], first greedy divergence %lld\n",
                static_cast<long long>(e.positions), e.kld_mean.value, e.kld_mean.lo, e.kld_mean.hi,
                e.kld_p99, e.kld_max, e.top1.value, e.top1.lo, e.top1.hi, e.dp_rms, e.dln_ppl.value,
                e.dln_ppl.lo, e.dln_ppl.hi, static_cast<long long>(e.first_greedy_divergence));
  o << line;
  for (const auto& f : r.e2e_verdict.failures)
    o << "  FAIL " << f << "\n";
  for (const auto& l : r.router)
    o << "  router " << l.point << ": " << l.flips.flipped << "/" << l.flips.tokens
      << " tokens flipped\n";
  for (const auto& l : r.experts) {
    const ExpertError* worst = nullptr;
    for (const auto& e : l.experts)
      if (!worst || !(e.rel_l2 <= worst->rel_l2)) worst = &e;
    if (worst)
      o << "  experts " << l.point << ": worst expert " << worst->expert << " rel_l2 "
        << worst->rel_l2 << " over " << worst->pairs << " tokens (" << l.matched
        << " token-expert pairs compared, " << l.unmatched << " routed differently)\n";
  }
  o << (r.pass ? "PASS" : "FAIL") << "\n";
  return o.str();
}

}  // namespace qparity::golden
