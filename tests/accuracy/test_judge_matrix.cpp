// The judge, measured (golden/judge_matrix.h): the reference with legitimate implementation
// choices and with planted faults, judged by the engine policies on the trained fixtures. What
// must hold: the reference itself is its own golden bit for bit; no planted fault passes; every
// fault is located at its planted point (bisect LOCAL there) and every legitimate choice passes,
// except the cells of kKnownWrong, the judge's measured limits (docs/JUDGE.md, "The judge,
// measured"). A known-wrong cell that comes out right fails the test too, so that list and the
// docs follow the judge.
#include <gtest/gtest.h>

#include <filesystem>
#include <map>
#include <set>

#include "../unit/test_seed.h"
#include "accuracy_util.h"
#include "core/capture/capture_points.h"
#include "core/error.h"
#include "golden/judge_matrix.h"
#include "golden/reference_candidate.h"
#include "golden/reference_run.h"
#include "reference_cpu/models/deviation.h"
#include "reference_cpu/models/model_loader.h"

namespace qparity::golden {
namespace {

namespace fs = std::filesystem;
using reference::DeviationExpectation;
using reference::DeviationKind;

fs::path trained(const std::string& name) {
  return fs::path(QPARITY_SOURCE_DIR) / "fixtures" / "trained" / name;
}

TEST(DeviationTable, EveryKindHasOneRowThatParsesBackAndNamesACapturePoint) {
  std::set<std::string> names;
  const auto& suffixes = all_layer_point_suffixes();
  for (const auto& info : reference::deviation_table()) {
    SCOPED_TRACE(std::string(info.name));
    EXPECT_TRUE(names.insert(std::string(info.name)).second);
    EXPECT_EQ(&reference::deviation_info(info.kind), &info);
    const reference::Deviation d =
        reference::parse_deviation(std::string(info.name) + (info.layer_scoped ? "@2" : ""));
    EXPECT_EQ(d.kind, info.kind);
    EXPECT_EQ(d.layer, info.layer_scoped ? 2 : 0);
    EXPECT_EQ(reference::to_string(d), std::string(info.name) + (info.layer_scoped ? "@2" : ""));
    EXPECT_EQ(info.first_point.empty(), info.expect == DeviationExpectation::kPass);
    if (!info.first_point.empty())
      EXPECT_NE(std::find(suffixes.begin(), suffixes.end(), std::string(info.first_point)),
                suffixes.end());
    if (!info.layer_scoped)
      EXPECT_THROW(reference::parse_deviation(std::string(info.name) + "@1"), Error);
  }
  try {
    reference::parse_deviation("no-such-fault");
    ADD_FAILURE() << "an unknown deviation was accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("gate-up-swapped"), std::string::npos) << e.what();
  }
  EXPECT_EQ(reference::parse_deviation("gate-up-swapped").layer,
            reference::Deviation::kChosenLayer);
  EXPECT_EQ(reference::to_string(reference::parse_deviation("gate-up-swapped")), "gate-up-swapped");
  EXPECT_THROW(reference::parse_deviation("gate-up-swapped@-1"), Error);
  EXPECT_THROW(reference::parse_deviation("gate-up-swapped@x"), Error);
}

TEST(ReferenceCandidate, WithoutADeviationItIsTheGoldenBitForBit) {
  const fs::path dir = trained("qwen3-moe");
  const TokenInputs in = synthetic_inputs(2, 12, load_model_config(dir / "config.json").vocab, 3);
  ReferenceRunOptions o;
  o.mode = reference::PrecisionMode::kEmulate;
  o.dialect = Dialect::kVllm;
  o.run_dtype = DType::kBF16;
  const Golden g = run_reference(dir, in, o, nullptr);
  reference::LoadOptions lo;
  lo.mode = o.mode;
  lo.dialect = o.dialect;
  lo.run_dtype = o.run_dtype;
  auto model = reference::load_model(dir, lo);
  const Golden free = reference_candidate_free(*model, in);
  EXPECT_EQ(free.meta.run_mode, RunMode::kFree);
  EXPECT_EQ(free.meta.producer, "qparity-reference");
  EXPECT_EQ(free.logits.data, g.logits.data);
  ASSERT_EQ(free.points.size(), g.points.size());
  for (size_t i = 0; i < g.points.size(); ++i) {
    EXPECT_EQ(free.points[i].name, g.points[i].name);
    EXPECT_EQ(free.points[i].values.data, g.points[i].values.data) << g.points[i].name;
  }
  const fs::path file =
      fs::temp_directory_path() / ("qparity_refcand_" + std::to_string(test::test_seed()) + ".h5");
  write_golden(file, g, OverwritePolicy::kReplace);
  const Golden local = reference_candidate_local(*model, GoldenReader::open(file));
  fs::remove(file);
  EXPECT_EQ(local.meta.run_mode, RunMode::kLayerLocal);
  EXPECT_EQ(local.logits.data, g.logits.data);
  for (size_t i = 0; i < g.points.size(); ++i)
    EXPECT_EQ(local.points[i].values.data, g.points[i].values.data) << g.points[i].name;
  // A deviation is named in the dump, and one that cannot apply is refused by name.
  model->set_deviation(reference::parse_deviation("gate-up-swapped@3"));
  EXPECT_EQ(reference_candidate_free(*model, in).meta.producer,
            "qparity-reference+gate-up-swapped@3");
  EXPECT_GT(model->deviation_hits(), 0);
  EXPECT_THROW(model->set_deviation(reference::parse_deviation("gate-up-swapped@99")), Error);
  EXPECT_THROW(model->set_deviation(reference::parse_deviation("exact-arithmetic")), Error);
  EXPECT_THROW(model->set_deviation(reference::parse_deviation("gate-up-swapped")), Error);
}

TEST(ReferenceCandidate, AnActivationQuantizedSchemeDumpsItsCodesAndPassesAsItself) {
  const fs::path root =
      fs::temp_directory_path() / ("qparity_refcand_codes_" + std::to_string(test::test_seed()));
  fs::create_directories(root);
  JudgeMatrixOptions o;
  o.policies = fs::path(QPARITY_SOURCE_DIR) / "policies";
  o.work = root / "work";
  o.sequences = 2;
  o.seq_len = 16;
  o.candidates = {reference::Deviation{}, reference::parse_deviation("gate-up-swapped")};
  const auto cells =
      run_judge_matrix({test::tiny_checkpoint(root, "llama", "w8a8-int8-dyn", 5)}, o);
  const GoldenReader local = GoldenReader::open(o.work / "llama.w8a8-int8-dyn.none.local.h5");
  EXPECT_TRUE(local.has_point("layers.0.attn.qkv_proj.x_values"));
  fs::remove_all(root);
  ASSERT_EQ(cells.size(), 2u);
  EXPECT_EQ(cells[0].local, Judgement::kPass) << cells[0].local_failure;
  EXPECT_EQ(cells[0].free, Judgement::kPass) << cells[0].free_failure;
  EXPECT_EQ(cells[1].outcome, "caught") << cells[1].local_failure;
}

// The cells that are not as the judge should have them, as measured (docs/JUDGE.md): under the
// bf16-family engine policies' median-token gate (2^-9, derived for an engine that rounds where
// the emulation rounds) a legitimate engine that rounds elsewhere fails layer-local, and MoE
// router flips take the free runs of four of them past the end-to-end KLD gate; a 1 % rope_theta
// error shows first past rope_q on the MoE fixture.
const std::map<std::string, std::string> kKnownWrong = {
    {"llama/exact-arithmetic", "false alarm"},
    {"llama/fp32-activations", "false alarm"},
    {"llama/norm-two-roundings", "false alarm"},
    {"llama/residual-fp32", "false alarm"},
    {"llama/rotary-bf16", "false alarm"},
    {"llama/silu-rounded", "false alarm"},
    {"llama/probabilities-bf16", "false alarm"},
    {"qwen3-moe/exact-arithmetic", "false alarm"},
    {"qwen3-moe/fp32-activations", "false alarm"},
    {"qwen3-moe/norm-two-roundings", "false alarm"},
    {"qwen3-moe/residual-fp32", "false alarm"},
    {"qwen3-moe/rotary-bf16", "false alarm"},
    {"qwen3-moe/silu-rounded", "false alarm"},
    {"qwen3-moe/probabilities-bf16", "false alarm"},
    {"qwen3-moe/rotary-base-off", "wrong location"},
};

TEST(JudgeMatrix, FaultsAreCaughtAtTheirPointAndLegitimateChoicesPassButForTheMeasuredLimits) {
  JudgeMatrixOptions o;
  o.policies = fs::path(QPARITY_SOURCE_DIR) / "policies";
  o.work =
      fs::temp_directory_path() / ("qparity_judge_matrix_" + std::to_string(test::test_seed()));
  const auto cells = run_judge_matrix({trained("llama"), trained("qwen3-moe")}, o);
  fs::remove_all(o.work);
  std::map<std::string, int> outcomes;  // outcome -> cells
  for (const MatrixCell& c : cells) {
    const std::string key = c.model + "/" + c.candidate.substr(0, c.candidate.find('@'));
    SCOPED_TRACE(key + ": " + c.outcome + ", layer-local " + to_string(c.local) + " at '" +
                 c.local_first_failing + "' (" + c.local_failure + "), free run " +
                 to_string(c.free));
    ++outcomes[c.outcome];
    EXPECT_NE(c.outcome, "miss");
    const auto known = kKnownWrong.find(key);
    if (known != kKnownWrong.end()) {
      EXPECT_EQ(c.outcome, known->second) << "a known-wrong cell changed: update kKnownWrong "
                                             "and docs/JUDGE.md";
      continue;
    }
    EXPECT_TRUE(c.as_expected);
    if (c.candidate == "none") {
      EXPECT_EQ(c.local, Judgement::kPass);
      EXPECT_EQ(c.kld_mean, 0.0);
    }
    if (c.expect == DeviationExpectation::kFail && c.applicable) {
      EXPECT_EQ(c.local_first_failing, c.expected_point);
      if (c.bisected) EXPECT_EQ(c.bisect, Diagnosis::kLocal);
    }
  }
  // Every kind ran on one of the two models (MoE kinds on qwen3-moe, qk-norm there too).
  std::set<std::string> applied;
  for (const MatrixCell& c : cells)
    if (c.applicable) applied.insert(c.candidate.substr(0, c.candidate.find('@')));
  for (const auto& info : reference::deviation_table())
    if (info.kind != DeviationKind::kAttentionScaleOff)  // both fixtures: head_dim = hidden / heads
      EXPECT_TRUE(applied.count(std::string(info.name))) << info.name;
  EXPECT_EQ(outcomes["miss"], 0);
}

}  // namespace
}  // namespace qparity::golden
