#pragma once
// Where it broke, and why: the first capture point outside the policy, and whether the layer it
// belongs to is wrong (LOCAL) or only carried an error in (INHERITED).
//
// Two kinds of evidence decide it:
//   the dump:  the failing point's inputs as the candidate dumped them (the layer's input,
//              `embed` / `layers.<i-1>.residual`): within policy, or not judged (not in the
//              dump, or no gate for it). Never outside: the failing point is the FIRST one
//              outside policy in execution order, so what feeds it is within policy or unjudged;
//   re-runs:   (own)  the candidate's own implementation of the layer, re-run on the GOLDEN's
//                     inputs: does the point come out within policy on clean inputs? (the GPU
//                     engine for its dumps; the qparity reference, with the candidate's scheme
//                     and dialect, for the reference's own dumps, e.g. a format candidate);
//              (spec) the layer as the reference (the spec) computes it, re-run on the
//                     CANDIDATE's own dumped inputs: does it reproduce the candidate's dumped
//                     point? If it does, the candidate's layer did its job on what it was given.
// The decision table (docs/JUDGE.md, "bisect"), first matching row wins:
//   0. the point is `embed` (its only input is the token ids both runs share) -> LOCAL
//   1. the dump is layer-local (every layer ran on the golden's inputs)   -> LOCAL
//   2. own re-run on golden inputs fails                                  -> LOCAL
//   3. spec re-run on the candidate's inputs does not reproduce its point -> LOCAL
//   4. spec re-run reproduces it                                          -> INHERITED
//   5. own re-run passes (no spec re-run: the dump lacks the layer input) -> INHERITED
//   6. no re-run (no --model, the candidate's engine not runnable here, or a point outside the
//      decoder layers: final_norm, logits)                                -> UNDECIDED
// INHERITED with inputs within policy means the upstream error, within tolerance where it
// arose, was amplified past this point's bound: a free run's points carry amplified upstream
// error, which is why free runs are judged end to end.
#include <functional>
#include <optional>
#include <string>

#include "golden/compare.h"

namespace qparity::golden {

enum class Diagnosis { kLocal, kInherited, kUndecided };
const char* to_string(Diagnosis d);  // "LOCAL", "INHERITED", "UNDECIDED"

enum class InputEvidence { kWithinPolicy, kNotJudged };
const char* to_string(InputEvidence e);

// One re-run of a layer: run, and its point within policy (own) / reproducing the dump (spec).
struct RerunResult {
  bool ran = false;
  std::string why_not;  // when it did not run
  std::string runner;   // what ran it ("the GPU engine", "the qparity reference (w8a16-ch, ...)")
  PointStats stats;     // the re-run point against the point it is compared with
  bool agrees = false;  // own: within policy on clean inputs; spec: reproduces the dump
};

struct LayerDiagnosis {
  std::string point;   // the first failing point
  int64_t layer = -1;  // its layer, -1 outside the decoder layers
  RunMode candidate_run = RunMode::kFree;
  InputEvidence inputs = InputEvidence::kNotJudged;
  std::string input_detail;  // which input point, and its error
  RerunResult own, spec;
  Diagnosis diagnosis = Diagnosis::kUndecided;
  int row = 0;         // the decision table's row that decided
  std::string reason;  // one sentence a person reads
};

// The pure decision table above.
Diagnosis decide(RunMode candidate_run, InputEvidence inputs, const RerunResult& own,
                 const RerunResult& spec, int64_t layer_or_minus_one, bool is_embed, int* row,
                 std::string* reason);

// Re-runs `point`'s layer on the inputs `source` holds for it (its `embed` / previous residual)
// and compares the point with `source`'s own value of it; nullopt (with why) when it cannot.
using LayerRunner = std::function<std::optional<PointStats>(
    const GoldenReader& source, const std::string& point, std::string* why_not)>;

struct Runner {
  std::string name;
  LayerRunner run;
};

// Gathers the evidence for report.points[failing] and decides. `own` and `spec` may be null (not
// available: the reason goes into the diagnosis).
LayerDiagnosis diagnose_layer(const CompareReport& report, size_t failing,
                              const GoldenReader& golden, const GoldenReader& candidate,
                              const PolicySection& section, const Runner* own,
                              const std::string& own_missing, const Runner* spec,
                              const std::string& spec_missing);

// The spec re-run reproduces the candidate's point when it is within the section's gate for that
// point, or, for a float32 dump (whose stored inputs are rounded by 2^-24), within 1e-5 rel L2.
bool reproduces(const PolicySection& section, const std::string& point, const PointStats& st,
                PointPrecision candidate_points);

}  // namespace qparity::golden
