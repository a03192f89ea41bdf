// bisect's diagnosis (golden/bisect.h): every row of the decision table, decided by the evidence
// it names, and nothing else (issue: bisect said INHERITED for a layer whose inputs were clean,
// because it re-ran the reference, which of course matches the golden).
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "golden/bisect.h"

namespace qparity::golden {
namespace {

using ::testing::HasSubstr;

RerunResult ran(bool agrees, double rel) {
  RerunResult r;
  r.ran = true;
  r.agrees = agrees;
  r.runner = "runner";
  r.stats.rel_l2 = rel;
  return r;
}

RerunResult not_run(const std::string& why) {
  RerunResult r;
  r.why_not = why;
  return r;
}

struct Case {
  RunMode run;
  InputEvidence inputs;
  RerunResult own, spec;
  int64_t layer;
  bool embed;
  Diagnosis want;
  int row;
  const char* says;
};

TEST(BisectDecision, EveryRowOfTheTable) {
  const auto W = InputEvidence::kWithinPolicy, N = InputEvidence::kNotJudged;
  const auto F = RunMode::kFree, L = RunMode::kLayerLocal;
  const RerunResult none = not_run("no --model");
  const Case cases[] = {
      {F, W, none, none, -1, true, Diagnosis::kLocal, 0, "token ids"},
      {L, W, none, none, 3, false, Diagnosis::kLocal, 1, "layer-local"},
      {L, W, ran(true, 0), ran(true, 0), 3, false, Diagnosis::kLocal, 1, "layer-local"},
      {F, W, ran(false, 0.2), ran(true, 0), 3, false, Diagnosis::kLocal, 2,
       "layer itself is wrong"},
      {F, N, ran(false, 0.2), none, 3, false, Diagnosis::kLocal, 2, "layer itself is wrong"},
      // The repro: inputs exact, the reference re-run is clean on golden inputs, but it
      // does not reproduce what the candidate dumped from those same inputs.
      {F, W, ran(true, 0), ran(false, 0.0099), 0, false, Diagnosis::kLocal, 3,
       "computed this layer differently"},
      {F, N, none, ran(false, 0.3), 3, false, Diagnosis::kLocal, 3, "differently"},
      {F, W, ran(true, 0), ran(true, 1e-4), 3, false, Diagnosis::kInherited, 4, "amplified"},
      {F, N, none, ran(true, 1e-4), 3, false, Diagnosis::kInherited, 4, "came in with its inputs"},
      {F, W, ran(true, 1e-4), not_run("the dump lacks it"), 3, false, Diagnosis::kInherited, 5,
       "right on clean inputs"},
      {F, W, none, none, 3, false, Diagnosis::kUndecided, 6, "give --model"},
      {F, N, not_run("no GPU"), not_run("no --model"), 3, false, Diagnosis::kUndecided, 6,
       "no re-run"},
      {F, W, none, none, -1, false, Diagnosis::kUndecided, 6, "not inside a layer"},
  };
  for (const Case& c : cases) {
    int row = -1;
    std::string reason;
    const Diagnosis d = decide(c.run, c.inputs, c.own, c.spec, c.layer, c.embed, &row, &reason);
    SCOPED_TRACE(reason);
    EXPECT_EQ(d, c.want);
    EXPECT_EQ(row, c.row);
    EXPECT_THAT(reason, HasSubstr(c.says));
  }
}

TEST(BisectDecision, ReproductionAllowsOnlyFloat32StorageRounding) {
  PolicySection s;
  s.points.push_back({"*", 1e-12, {}, {}, {}, {}, {}, {}, ""});
  PointStats st;
  st.rel_l2 = 3e-7;  // fp32 inputs rounded by 2^-24, through one layer
  EXPECT_FALSE(reproduces(s, "layers.0.attn.out", st, PointPrecision::kF64));
  EXPECT_TRUE(reproduces(s, "layers.0.attn.out", st, PointPrecision::kF32));
  st.rel_l2 = 1e-3;  // a real difference is never excused by the storage
  EXPECT_FALSE(reproduces(s, "layers.0.attn.out", st, PointPrecision::kF32));
  st.rel_l2 = 0;
  st.nan_candidate = 1;
  EXPECT_FALSE(reproduces(s, "layers.0.attn.out", st, PointPrecision::kF32));
}

}  // namespace
}  // namespace qparity::golden
