#include "golden/compare.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <optional>
#include <sstream>
#include <tuple>
#include <utility>

#include "core/capture/capture_points.h"
#include "core/error.h"

namespace qparity::golden {

namespace {

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
  j["run"] = to_string(m.run_mode);
  j["model_dtype"] = m.model_dtype;
  return j;
}

Json declared_absent_json(const CompareReport& r) {
  Json a = Json::array();
  for (const auto& d : r.declared_absent)
    a.push_back({{"point", d.point}, {"declared_as", d.glob}, {"reason", d.reason}});
  return a;
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

const char* to_string(Judgement j) {
  switch (j) {
    case Judgement::kPass:
      return "PASS";
    case Judgement::kFail:
      return "FAIL";
    case Judgement::kNotJudged:
      return "NOT JUDGED";
  }
  return "?";
}

namespace {

// An activation-code point "<linear>.x_values" whose scales "<linear>.x_scales" vary along K in
// both files (blocks of K / scale_cols codes): the codes times their block's scale, golden and
// candidate. nullopt for per-token or per-tensor scales (compared as codes) and anything else.
std::optional<std::pair<std::vector<double>, std::vector<double>>> dequantized_block_codes(
    const GoldenReader& g, const GoldenReader& c, const std::string& name, const Array2D& a,
    const Array2D& b) {
  static const std::string leaf = "." + std::string(point::kXValues);
  if (!name.ends_with(leaf)) return std::nullopt;
  const std::string scales =
      name.substr(0, name.size() - leaf.size() + 1) + std::string(point::kXScales);
  if (!g.has_point(scales) || !c.has_point(scales)) return std::nullopt;
  const Array2D gs = g.point(scales), cs = c.point(scales);
  if (gs.cols <= 1 || gs.cols != cs.cols || a.cols % gs.cols != 0 || gs.rows != a.rows ||
      cs.rows != b.rows || a.rows != b.rows)
    return std::nullopt;
  const int64_t block = a.cols / gs.cols;
  std::pair<std::vector<double>, std::vector<double>> out{a.data, b.data};
  for (int64_t r = 0; r < a.rows; ++r)
    for (int64_t k = 0; k < a.cols; ++k) {
      const size_t i = static_cast<size_t>(r * a.cols + k);
      const size_t s = static_cast<size_t>(r * gs.cols + k / block);
      out.first[i] *= gs.data[s];
      out.second[i] *= cs.data[s];
    }
  return out;
}

}  // namespace

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
  // A dump that records its images must have run the golden's (one that does not, an engine's
  // plain dump, ran what the golden gave it).
  if (c.has_images()) {
    const GoldenImages gi = g.images(), ci = c.images();
    if (gi.grid_thw != ci.grid_thw || gi.sequence != ci.sequence ||
        gi.pixels.data != ci.pixels.data)
      throw Error(r.candidate_file, "ran other images than " + r.golden_file +
                                        " (images/: grids, sequences or pixels differ)");
  }
  // Which checkpoint each ran. The engine role compares two runs of one checkpoint: a candidate
  // that records another is refused (unless allowed, and then said); the format role compares a
  // quantized checkpoint with the unquantized one, another checkpoint by construction.
  for (const auto& [what, gh, ch] :
       {std::tuple{"checkpoint_hash", g.meta().checkpoint_hash, c.meta().checkpoint_hash},
        std::tuple{"model_config_hash", g.meta().model_config_hash, c.meta().model_config_hash}}) {
    if (gh.empty() || ch.empty() || gh == ch) continue;
    const std::string said = std::string(what) + ": the candidate records " + ch.substr(0, 16) +
                             "..., the golden " + gh.substr(0, 16) + "...";
    if (o.role == PolicyRole::kEngine && !o.allow_other_checkpoint)
      throw Error(r.candidate_file,
                  said +
                      ": the candidate ran another checkpoint than the golden (compare a "
                      "golden of the checkpoint it ran; --allow-other-checkpoint to compare "
                      "anyway)");
    // The format role compares a quantized checkpoint with the unquantized one: another
    // checkpoint by construction, nothing to say.
    if (o.role == PolicyRole::kEngine) r.warnings.push_back(said + " (--allow-other-checkpoint)");
    break;
  }
  static const PolicySection kNoGates;  // judges NaN/Inf only
  const PolicySection* section = nullptr;
  if (o.policy) {
    // A policy derived for another scheme judges this pair: said, never silent (its gates were
    // derived from that scheme's step sizes).
    if (o.policy->scheme != c.meta().scheme)
      r.warnings.push_back("the policy " + o.policy->file + " is derived for scheme '" +
                           o.policy->scheme + "', the candidate ran '" + c.meta().scheme + "'");
    std::string key;
    const std::string dev = o.device ? *o.device : device_key(c.meta().device);
    section = &policy_section(*o.policy, o.role, dev, &key);
    r.policy_file = o.policy->file;
    r.policy_section = o.role == PolicyRole::kFormat ? "format" : "engine." + key;
    r.point_gates_judge = section->judges_points_of(c.meta().run_mode);
  }
  const PolicySection& gates = section ? *section : kNoGates;
  for (const auto& name : c.point_names())
    if (!g.has_point(name)) r.extra_in_candidate.push_back(name);
  if (!r.golden.model_dtype.empty() && !r.candidate.model_dtype.empty() &&
      r.golden.model_dtype != r.candidate.model_dtype)
    r.warnings.push_back("weight dtype: the golden ran the weights in " + r.golden.model_dtype +
                         ", the candidate in " + r.candidate.model_dtype +
                         ": rounding the weights is part of every difference below");
  // KV error by position: from what a quantized cache holds (attn.k_cache / attn.v_cache) when
  // the golden has those points, else from the keys entering the cache (attn.rope_k).
  std::vector<double> kv_sum(static_cast<size_t>(g.seq_len()), 0.0);
  int64_t kv_layers = 0;
  bool cache_points = false;
  for (const auto& name : g.point_names())
    cache_points = cache_points || point_suffix(name) == point::kAttnKCache;
  r.kv_error_source = cache_points ? "attn.k_cache+attn.v_cache" : "attn.rope_k";
  const auto kv_point = [&](const std::string& name) {
    const std::string sfx = point_suffix(name);
    return cache_points ? sfx == point::kAttnKCache || sfx == point::kAttnVCache
                        : sfx == point::kAttnRopeK;
  };
  // A declaration must not hide a point the candidate has: that file contradicts itself.
  for (const auto& name : c.point_names())
    if (const AbsentPoint* a = declared_absent(c.meta(), name))
      throw Error(r.candidate_file, "declares '" + a->glob +
                                        "' absent (absent_points) but holds points/" + name +
                                        ": a point is either dumped or declared absent");
  for (const auto& name : g.point_names()) {
    if (!c.has_point(name)) {
      // Declared by the candidate's producer as one its engine cannot expose: listed, not
      // failed. An undeclared gap still fails unless the policy allows it.
      if (const AbsentPoint* a = declared_absent(c.meta(), name)) {
        r.declared_absent.push_back({name, a->glob, a->reason});
        continue;
      }
      r.missing_in_candidate.push_back(name);
      if (section && !section->may_lack(name)) r.missing_failures.push_back(name);
      continue;
    }
    Array2D a = g.point(name), b = c.point(name);
    if (a.cols != b.cols)
      throw Error(r.candidate_file, "points/" + name + " has width " + std::to_string(b.cols) +
                                        ", the golden " + std::to_string(a.cols));
    PointReport p;
    p.name = name;
    p.cols = a.cols;
    const bool ids = point_suffix(name) == point::kMoeTopkIds;
    // Activation codes and their scales: the dialect fixes every bit, so they compare exactly
    // (mismatches counted) besides the float metrics.
    const bool exact = is_activation_code_point(name);
    // Activation scales compare at fp32, the precision every engine holds them in: where the
    // reference's scale is an fp64 value no engine can hold (NVFP4's s / gs_in, the ideal
    // dialect's quotients) its fp32 rounding is what an exact engine dumps; fp32 scales are
    // unchanged by this. Codes compare as stored.
    if (name.ends_with("." + std::string(point::kXScales)))
      for (Array2D* side : {&a, &b})
        for (double& v : side->data)
          v = static_cast<double>(static_cast<float>(v));
    const bool expert_out = point_suffix(name) == point::kMoeExpertOut;
    if (expert_out || point_suffix(name) == point::kMoeTopkWeights) {
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
      // Values left out of the alignment (unmatched slots) are still checked for NaN/Inf.
      const PointStats raw = compare_point(a.data, b.data, a.rows, a.cols, false);
      p.stats.nan_golden = raw.nan_golden, p.stats.inf_golden = raw.inf_golden;
      p.stats.nan_candidate = raw.nan_candidate, p.stats.inf_candidate = raw.inf_candidate;
      if (p.stats.first_nonfinite < 0) p.stats.first_nonfinite = raw.first_nonfinite;
      if (expert_out) r.experts.push_back({name, al.matched, al.unmatched, std::move(al.experts)});
    } else if (const auto deq = dequantized_block_codes(g, c, name, a, b)) {
      // Block-scaled codes (MX, fp8-block): the float metrics on code x block scale, so a block
      // whose scale moved by one power of two (its amax crossed a boundary by one inherited ULP,
      // every code of the block rescaled) weighs what it changes; mismatches still count codes.
      p.stats = compare_point(deq->first, deq->second, a.rows, a.cols, false);
      const PointStats raw = compare_point(a.data, b.data, a.rows, a.cols, true);
      p.stats.integer_codes = raw.integer_codes;
      p.stats.mismatches = raw.mismatches;
    } else {
      p.stats = compare_point(a.data, b.data, a.rows, a.cols, ids || exact);
    }
    if (ids) {
      const RouterFlips f = compare_router(a.data, b.data, a.rows, a.cols);
      p.stats.mismatches = f.changed_ids;  // as sets: an engine may order a token's experts freely
      r.router.push_back({name, f});
    }
    p.verdict = judge_point(gates, name, p.stats);
    // How large a one-slice error this point's gate would have caught (layer-local runs, whose
    // points are judged; plain float points only).
    if (section && r.point_gates_judge && !ids && !exact && shows_detection_limit(name)) {
      auto limits = detection_limits(gates, name, a.data, b.data, a.rows, a.cols, 0);
      r.detection_limits.insert(r.detection_limits.end(), limits.begin(), limits.end());
    }
    for (const auto& f : nonfinite_failures(p.stats))
      r.nonfinite.push_back("points/" + name + ": " + f);
    if (r.first_nonfinite < 0 && !nonfinite_failures(p.stats).empty())
      r.first_nonfinite = static_cast<int64_t>(r.points.size());
    if (kv_point(name)) {
      ++kv_layers;
      for (int64_t row = 0; row < a.rows; ++row)
        kv_sum[static_cast<size_t>(row % g.seq_len())] +=
            p.stats.row_rel_l2[static_cast<size_t>(row)];
    }
    if (!p.verdict.pass && r.first_failing < 0)
      r.first_failing = static_cast<int64_t>(r.points.size());
    r.points.push_back(std::move(p));
  }
  if (r.points.empty())
    throw Error(r.candidate_file,
                "shares no capture point with " + r.golden_file +
                    " (golden: " + std::to_string(g.point_names().size()) +
                    " points, candidate: " + std::to_string(c.point_names().size()) +
                    "): there is nothing to compare point by point");
  if (section)
    for (const auto& gate : section->points) {
      bool used = false;
      for (const auto& p : r.points)
        used = used || p.verdict.gate == gate.match;
      if (!used) r.unused_gates.push_back(gate.match);
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
  r.e2e_verdict = judge_end_to_end(gates, r.e2e);
  if (o.role == PolicyRole::kFormat && (o.budget || (o.policy && o.policy->budget))) {
    PolicySection budget;
    if (o.budget) {
      budget.end_to_end = *o.budget;
      r.budget_source = o.budget_source.empty() ? "--budget" : o.budget_source;
    } else {
      budget = *o.policy->budget;
      r.budget_source = o.policy->file + " [budget]";
    }
    r.has_budget = true;
    r.budget_verdict = judge_end_to_end(budget, r.e2e);
  }
  for (const auto& f : nonfinite_failures(r.e2e))
    r.nonfinite.push_back("outputs/logits: " + f);

  // The verdict: NaN/Inf always fails; the rest only when a gate of the policy judges it.
  r.failures = r.nonfinite;
  const auto add_e2e = [&](const Verdict& v, const std::string& what) {
    for (const auto& f : v.failures)  // the NaN/Inf lines are in already
      if (std::find(r.nonfinite.begin(), r.nonfinite.end(), "outputs/logits: " + f) ==
          r.nonfinite.end())
        r.failures.push_back(what + f);
  };
  bool judged = false;
  if (section) {
    if (!r.missing_failures.empty())
      r.failures.push_back(std::to_string(r.missing_failures.size()) +
                           " capture point(s) of the golden missing in the candidate (first: " +
                           r.missing_failures.front() + ")");
    if (r.point_gates_judge)
      for (const auto& p : r.points) {
        judged = judged || p.verdict.gated;
        if (p.verdict.gated && !p.verdict.pass && nonfinite_failures(p.stats).empty())
          r.failures.push_back("points/" + p.name + ": " + p.verdict.failures.front());
      }
    judged = judged || r.e2e_verdict.gated;
    if (r.e2e_verdict.gated) add_e2e(r.e2e_verdict, "end to end: ");
  }
  if (r.has_budget) {
    judged = judged || r.budget_verdict.gated;
    add_e2e(r.budget_verdict, "budget: ");
  }
  // A gate the data cannot decide makes an otherwise clean comparison NOT JUDGED (said why).
  std::vector<std::string> undecided;
  for (const Verdict* v :
       {section ? &r.e2e_verdict : nullptr, r.has_budget ? &r.budget_verdict : nullptr})
    if (v) undecided.insert(undecided.end(), v->undecided.begin(), v->undecided.end());
  for (const auto& u : undecided)
    r.warnings.push_back("not judged: " + u);
  r.verdict = !r.failures.empty()           ? Judgement::kFail
              : judged && undecided.empty() ? Judgement::kPass
                                            : Judgement::kNotJudged;
  r.pass = r.verdict == Judgement::kPass;
  return r;
}

Json to_json(const CompareReport& r) {
  Json points = Json::array();
  for (const auto& p : r.points) {
    const PointStats& s = p.stats;
    Json j = {
        {"name", p.name},
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
        {"nan_golden", s.nan_golden},
        {"inf_golden", s.inf_golden},
        {"nonfinite_mismatches", s.nonfinite_mismatches},
        {"first_nonfinite", s.first_nonfinite},
        {"worst_index", s.worst_index},
        {"pass", p.verdict.pass},
        {"gated", p.verdict.gated},
        {"judged", p.verdict.gated && r.point_gates_judge},
        {"limit_rel_l2", p.verdict.limit_rel_l2 ? number(*p.verdict.limit_rel_l2) : Json(nullptr)},
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
                      {"invalid_ids", l.flips.invalid_ids},
                      {"tokens", l.flips.tokens},
                      {"flipped", l.flips.flipped},
                      {"flip_rate", number(l.flips.flip_rate)},
                      {"first_flip", l.flips.first_flip}});
  Json experts = Json::array();
  for (const auto& l : r.experts) {
    Json per = Json::array();
    for (const auto& x : l.experts)
      per.push_back({{"expert", x.expert},
                     {"pairs", x.pairs},
                     {"rel_l2", number(x.rel_l2)},
                     {"max_abs", number(x.max_abs)}});
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
  const auto point_name = [&](int64_t i) {
    return i >= 0 ? Json(r.points[static_cast<size_t>(i)].name) : Json(nullptr);
  };
  Json limits = Json::array();
  for (const DetectionLimit& d : r.detection_limits)
    limits.push_back({{"point", d.point},
                      {"slice", to_string(d.shape)},
                      {"index", d.index},
                      {"smallest_caught", d.smallest ? json_number(*d.smallest) : Json(nullptr)}});
  return {{"golden", {{"file", r.golden_file}, {"meta", meta_json(r.golden)}}},
          {"candidate", {{"file", r.candidate_file}, {"meta", meta_json(r.candidate)}}},
          {"policy",
           {{"file", r.policy_file},
            {"section", r.policy_section},
            {"source", r.policy_source},
            {"point_gates_judge", r.point_gates_judge},
            {"unused_gates", r.unused_gates}}},
          {"verdict", to_string(r.verdict)},
          {"pass", r.pass},
          {"failures", r.failures},
          {"nonfinite", r.nonfinite},
          {"first_failing_point", point_name(r.first_failing)},
          {"first_nonfinite_point", point_name(r.first_nonfinite)},
          {"detection_limits", limits},
          {"missing_in_candidate", r.missing_in_candidate},
          {"missing_failures", r.missing_failures},
          {"declared_absent", declared_absent_json(r)},
          {"extra_in_candidate", r.extra_in_candidate},
          {"warnings", r.warnings},
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
            {"nonfinite_golden_rows", e.nonfinite_golden_rows},
            {"nonfinite_candidate_rows", e.nonfinite_candidate_rows},
            {"first_nonfinite_row", e.first_nonfinite_row},
            {"kld", kld},
            {"pass", r.e2e_verdict.pass},
            {"gated", r.e2e_verdict.gated},
            {"failures", r.e2e_verdict.failures}}},
          {"budget", r.has_budget ? Json{{"source", r.budget_source},
                                         {"pass", r.budget_verdict.pass},
                                         {"failures", r.budget_verdict.failures}}
                                  : Json(nullptr)},
          {"router", router},
          {"experts", experts},
          {"kv_error_by_position", kv},
          {"kv_error_source", r.kv_error_source},
          {"activation_stats", act}};
}

std::string judged_by_text(const CompareReport& r) {
  if (r.policy_file.empty())
    return "no policy" + (r.policy_source.empty() ? std::string() : " (" + r.policy_source + ")") +
           ": the numbers below are not judged (NaN/Inf still fail)";
  std::string s = r.policy_file + " [" + r.policy_section + "]";
  if (!r.policy_source.empty()) s += " (" + r.policy_source + ")";
  s += "; the candidate is a " + std::string(to_string(r.candidate.run_mode)) + " dump: ";
  s += r.point_gates_judge ? "judged per point and end to end"
                           : "judged end to end (this section's per-point gates judge "
                             "layer-local dumps; points outside them are shown, not judged)";
  return s;
}

std::string to_text(const CompareReport& r) {
  std::ostringstream o;
  char line[512];
  o << "golden    " << r.golden_file << " (" << r.golden.scheme << ", " << r.golden.device
    << ")\ncandidate " << r.candidate_file << " (" << r.candidate.scheme << ", "
    << r.candidate.device << ", " << to_string(r.candidate.run_mode) << ")\n";
  o << "judged by " << judged_by_text(r) << "\n";
  std::snprintf(line, sizeof line, "%-32s %11s %11s %11s %9s %10s %s\n", "capture point", "rel_l2",
                "max_abs", "1-cosine", "SQNR dB", "NaN/Inf", "verdict");
  o << line;
  for (size_t i = 0; i < r.points.size(); ++i) {
    const auto& p = r.points[i];
    const bool judged =
        (p.verdict.gated && r.point_gates_judge) || !nonfinite_failures(p.stats).empty();
    std::string verdict = p.verdict.pass ? (p.verdict.gated ? "ok" : "-")
                          : judged       ? "FAIL"
                                         : "outside (not judged)";
    for (const auto& f : p.verdict.failures)
      verdict += "  " + f;
    // In a free run the point gates do not judge: the point is the largest deviation shown,
    // not a failure (the run is judged end to end).
    if (static_cast<int64_t>(i) == r.first_failing)
      verdict += r.point_gates_judge ? "   <- first failure"
                                     : "   <- first outside the point gates (not judged in a "
                                       "free run)";
    const int64_t bad =
        p.stats.nan_candidate + p.stats.inf_candidate + p.stats.nan_golden + p.stats.inf_golden;
    const std::string nonfinite = bad == 0 ? "-" : std::to_string(bad);
    std::snprintf(line, sizeof line, "%-32s %11.3e %11.3e %11.3e %9.1f %10s %s\n", p.name.c_str(),
                  p.stats.rel_l2, p.stats.max_abs, 1.0 - p.stats.cosine, p.stats.sqnr_db,
                  nonfinite.c_str(), verdict.c_str());
    o << line;
  }
  for (const auto& m : r.missing_in_candidate) {
    const bool fails = std::find(r.missing_failures.begin(), r.missing_failures.end(), m) !=
                       r.missing_failures.end();
    o << "  missing in the candidate: " << m << (fails ? "  FAIL" : "  (allowed by the policy)")
      << "\n";
  }
  // Declared absent: one line per declaration, with how many golden points it covered.
  std::vector<std::pair<const CompareReport::DeclaredAbsent*, size_t>> declared;
  for (const auto& d : r.declared_absent) {
    auto it = std::find_if(declared.begin(), declared.end(),
                           [&](const auto& x) { return x.first->glob == d.glob; });
    if (it == declared.end())
      declared.emplace_back(&d, 1);
    else
      ++it->second;
  }
  for (const auto& [d, n] : declared)
    o << "  declared absent by the candidate (not compared): " << d->glob << " (" << n << " point"
      << (n == 1 ? "" : "s, first " + d->point) << ")"
      << (d->reason.empty() ? "" : ": " + d->reason) << "\n";
  for (const auto& m : r.extra_in_candidate)
    o << "  only in the candidate (not compared): " << m << "\n";
  for (const auto& g : r.unused_gates)
    o << "  gate '" << g << "' matches no compared point\n";
  for (const auto& w : r.warnings)
    o << "  warning: " << w << "\n";
  for (const auto& n : r.nonfinite)
    o << "  NaN/Inf: " << n << "\n";
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
  if (r.has_budget) {
    o << "budget (" << r.budget_source << "): " << budget_check_text(r.budget_verdict) << "\n";
    for (const auto& f : r.budget_verdict.failures)
      o << "  FAIL " << f << "\n";
  }
  for (const auto& l : r.router)
    o << "  router " << l.point << ": " << l.flips.flipped << "/" << l.flips.tokens
      << " tokens flipped"
      << (l.flips.invalid_ids > 0
              ? " (" + std::to_string(l.flips.invalid_ids) + " ids are not integers)"
              : std::string())
      << "\n";
  for (const auto& l : r.experts) {
    const ExpertError* worst = nullptr;
    for (const auto& x : l.experts)
      if (!worst || !(x.rel_l2 <= worst->rel_l2)) worst = &x;
    if (worst)
      o << "  experts " << l.point << ": worst expert " << worst->expert << " rel_l2 "
        << worst->rel_l2 << " over " << worst->pairs << " tokens (" << l.matched
        << " token-expert pairs compared, " << l.unmatched << " routed differently)\n";
  }
  o << to_string(r.verdict);
  if (r.verdict == Judgement::kNotJudged)
    o << (r.policy_file.empty()
              ? " (no policy: give --policy FILE, or install policies/<scheme>.json)"
              : " (no gate of the policy applies to this candidate)");
  if (r.verdict == Judgement::kFail)
    o << " (" << r.failures.size() << " reason(s); first: " << r.failures.front() << ")";
  o << "\n";
  return o.str();
}

}  // namespace qparity::golden
