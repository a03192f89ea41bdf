#include "golden/bisect.h"

#include "core/capture/capture_points.h"

namespace qparity::golden {

namespace {

const PointReport* find_point(const CompareReport& r, const std::string& name) {
  for (const auto& p : r.points)
    if (p.name == name) return &p;
  return nullptr;
}

// The point that feeds a layer (or the head): the previous residual, or embed.
std::string input_of(const CompareReport& r, size_t failing, int64_t layer) {
  if (layer >= 0) return layer_input_point(layer);
  std::string last;  // final_norm / logits: the last layer's residual
  for (size_t i = 0; i < failing; ++i)
    if (point_suffix(r.points[i].name) == point::kResidual) last = r.points[i].name;
  return last;
}

}  // namespace

const char* to_string(Diagnosis d) {
  switch (d) {
    case Diagnosis::kLocal:
      return "LOCAL";
    case Diagnosis::kInherited:
      return "INHERITED";
    case Diagnosis::kUndecided:
      return "UNDECIDED";
  }
  return "?";
}

const char* to_string(InputEvidence e) {
  switch (e) {
    case InputEvidence::kWithinPolicy:
      return "within policy";
    case InputEvidence::kNotJudged:
      return "not judged (not in both dumps, or no gate for it)";
  }
  return "?";
}

Diagnosis decide(RunMode run, InputEvidence inputs, const RerunResult& own, const RerunResult& spec,
                 int64_t layer, bool is_embed, int* row, std::string* reason) {
  const auto out = [&](int r, Diagnosis d, std::string why) {
    *row = r;
    *reason = std::move(why);
    return d;
  };
  if (is_embed)
    return out(0, Diagnosis::kLocal,
               "the embedding's only input is the token ids, which both runs share");
  if (run == RunMode::kLayerLocal)
    return out(1, Diagnosis::kLocal,
               "the dump is layer-local: the candidate ran this layer on the golden's own inputs");
  if (own.ran && !own.agrees)
    return out(2, Diagnosis::kLocal,
               own.runner +
                   ", re-run on the golden's inputs, still gives this point outside "
                   "policy (rel_l2 " +
                   short_number(own.stats.rel_l2) + "): the layer itself is wrong");
  if (spec.ran && !spec.agrees)
    return out(3, Diagnosis::kLocal,
               spec.runner +
                   ", re-run on the candidate's own dumped inputs, does not reproduce "
                   "the candidate's point (rel_l2 " +
                   short_number(spec.stats.rel_l2) +
                   " between them): the candidate computed this layer differently from its "
                   "checkpoint's math");
  const std::string came_in =
      inputs == InputEvidence::kWithinPolicy
          ? "its inputs are within policy, so the upstream error, within tolerance where it "
            "arose, was amplified past this point's bound (a free run's points carry amplified "
            "upstream error: judge free runs end to end)"
          : "the error came in with its inputs";
  if (spec.ran)
    return out(4, Diagnosis::kInherited,
               spec.runner +
                   ", re-run on the candidate's own inputs, reproduces its point (rel_l2 " +
                   short_number(spec.stats.rel_l2) +
                   "): the layer did its job on what it was given; " + came_in);
  if (own.ran)
    return out(5, Diagnosis::kInherited,
               own.runner + ", re-run on the golden's inputs, is within policy (rel_l2 " +
                   short_number(own.stats.rel_l2) + "): the layer is right on clean inputs; " +
                   came_in);
  return out(6, Diagnosis::kUndecided,
             std::string("no re-run (") + (layer >= 0 ? spec.why_not : "not inside a layer") +
                 "); the dump's inputs to it are " + to_string(inputs) +
                 ": the error arose in this layer or was amplified by it" +
                 (layer >= 0 ? "; give --model DIR (the checkpoint the candidate ran) to tell which"
                             : ""));
}

bool reproduces(const PolicySection& section, const std::string& point, const PointStats& st,
                PointPrecision candidate_points) {
  if (judge_point(section, point, st).pass) return true;
  // float32 storage rounds the re-run's inputs by 2^-24 (6e-8); through one layer that stays
  // well under 1e-5, far below any error worth a bisect.
  return candidate_points == PointPrecision::kF32 && nonfinite_failures(st).empty() &&
         st.rel_l2 <= 1e-5;
}

LayerDiagnosis diagnose_layer(const CompareReport& r, size_t failing, const GoldenReader& golden,
                              const GoldenReader& candidate, const PolicySection& section,
                              const Runner* own, const std::string& own_missing, const Runner* spec,
                              const std::string& spec_missing) {
  LayerDiagnosis d;
  const PointReport& bad = r.points.at(failing);
  d.point = bad.name;
  d.layer = point_layer(bad.name);
  d.candidate_run = r.candidate.run_mode;

  // The dump's evidence: the input point, and the layer's earlier points.
  const std::string input = input_of(r, failing, d.layer);
  const PointReport* in = input.empty() ? nullptr : find_point(r, input);
  if (!in) {
    d.inputs = InputEvidence::kNotJudged;
    d.input_detail = input.empty() ? "no input point" : input + " is not in both dumps";
  } else {
    d.inputs = in->verdict.gated ? InputEvidence::kWithinPolicy : InputEvidence::kNotJudged;
    d.input_detail = input + " rel_l2 " + short_number(in->stats.rel_l2) +
                     (in->verdict.gated ? "" : " (no gate for it)");
  }

  const bool rerun_needed = d.layer >= 0 && d.candidate_run == RunMode::kFree;
  if (!rerun_needed) {
    d.own.why_not = d.spec.why_not =
        d.layer < 0 ? "not inside a decoder layer" : "the dump is layer-local";
  } else {
    if (!own) {
      d.own.why_not = own_missing;
    } else {
      d.own.runner = own->name;
      if (const auto st = own->run(golden, bad.name, &d.own.why_not)) {
        d.own.ran = true;
        d.own.stats = *st;
        d.own.agrees = judge_point(section, bad.name, *st).pass;
      }
    }
    if (!spec) {
      d.spec.why_not = spec_missing;
    } else if (!candidate.has_point(input)) {
      d.spec.why_not = "the candidate dump lacks " + input + ", the layer's input";
    } else {
      d.spec.runner = spec->name;
      if (const auto st = spec->run(candidate, bad.name, &d.spec.why_not)) {
        d.spec.ran = true;
        d.spec.stats = *st;
        d.spec.agrees = reproduces(section, bad.name, *st, candidate.meta().point_precision);
      }
    }
  }
  d.diagnosis = decide(d.candidate_run, d.inputs, d.own, d.spec, d.layer, bad.name == point::kEmbed,
                       &d.row, &d.reason);
  return d;
}

}  // namespace qparity::golden
