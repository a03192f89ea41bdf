#pragma once
// The judge, measured: a confusion matrix of correct candidates and planted faults. For each
// checkpoint (judged in its own scheme, under that scheme's engine policy) and each deviation
// of reference_cpu/models/deviation.h, the reference with that deviation is dumped layer-local
// and as a free run and compared with the engine-row golden (emulate, dialect vllm, run dtype
// bf16: what `validate` judges an engine against); a free run that leaves the point gates is
// bisected (golden/bisect.h) with the candidate's own layer and the spec's. A cell is right when
//   a legitimate choice:  both runs PASS (a FAIL is a false alarm);
//   a fault:              the layer-local run FAILs first at the planted point (a PASS is a
//                         miss, another point a wrong location), and where the free run's
//                         points leave the gates, bisect names the planted point LOCAL;
//   a measured fault:     whatever the judge says is recorded (the policy claims nothing).
// A deviation that changes nothing in a model (no MoE layer, no q/k norm) is "n/a" there.
#include <cstdint>
#include <filesystem>
#include <iosfwd>
#include <string>
#include <vector>

#include "core/config/model_config.h"
#include "core/json_util.h"
#include "golden/bisect.h"
#include "golden/compare.h"
#include "reference_cpu/models/deviation.h"

namespace qparity::golden {

struct JudgeMatrixOptions {
  // Empty: every kind, each at its chosen layer (deviation_layer), as is a layer-scoped kind
  // given without a layer (Deviation::kChosenLayer).
  std::vector<reference::Deviation> candidates;
  int64_t sequences = 4, seq_len = 32;
  uint64_t seed = 7;
  std::filesystem::path policies;  // <scheme>.json per checkpoint scheme
  std::filesystem::path work;      // goldens and dumps (kept for inspection)
  std::ostream* progress = nullptr;
};

struct MatrixCell {
  std::string model, scheme, candidate;  // candidate: "none" (the reference itself) or a deviation
  reference::DeviationExpectation expect = reference::DeviationExpectation::kPass;
  bool applicable = true;      // the deviation changed at least one op
  std::string expected_point;  // faults: where it first shows
  Judgement local = Judgement::kNotJudged, free = Judgement::kNotJudged;
  std::string local_first_failing, free_first_failing;  // "" when none
  std::string local_failure, free_failure;              // the first reason given
  double kld_mean = 0, kld_upper = 0, top1 = 0;         // the free run, end to end
  bool bisected = false;
  std::string bisect_point;
  Diagnosis bisect = Diagnosis::kUndecided;
  bool as_expected = false;
  std::string outcome;  // "PASS", "false alarm", "caught", "miss", "wrong location", "measured"
};

// The layer a layer-scoped deviation changes in a model of cfg: the middle layer if the kind
// applies there (MoE kinds need a MoE layer, gate-up a dense MLP, qk-norm a q/k norm, attention
// kinds full attention), else the nearest one that fits; -1 when none does.
int64_t deviation_layer(const ModelConfig& cfg, reference::DeviationKind kind);

std::vector<MatrixCell> run_judge_matrix(const std::vector<std::filesystem::path>& models,
                                         const JudgeMatrixOptions& options);

Json matrix_json(const std::vector<MatrixCell>& cells);
std::string matrix_markdown(const std::vector<MatrixCell>& cells);
std::string matrix_html(const std::vector<MatrixCell>& cells);
// judge-matrix.{json,md,html} under dir (each written atomically, replaced if there).
void write_judge_matrix(const std::filesystem::path& dir, const std::vector<MatrixCell>& cells);

}  // namespace qparity::golden
