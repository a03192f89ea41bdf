// The TP-numerics report (golden/tp_report.h) on hand-made goldens: changed elements are counted
// bit for bit (one ulp counts, -0 against +0 counts, equal values do not), the first changed
// point is found in execution order, a point the TP = N dump declares absent is listed with its
// reason, the logits' end-to-end metrics are zero for identical logits and move when one row's
// argmax moves, and goldens of other tokens are refused.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cmath>

#include "../unit/error_of.h"
#include "golden/tp_report.h"

namespace qparity::golden {
namespace {

using test::error_of;
using ::testing::HasSubstr;

Golden base() {
  Golden g;
  g.sequences = 1;
  g.seq_len = 3;
  g.tokens = {1, 2, 3};
  g.targets = {2, 3, -1};
  g.logits = {3, 4, {0.1, 2.0, 0.3, -1, 1.0, 0.5, 0.2, 0.1, -0.5, 0.0, 3.0, 0.25}};
  g.points.push_back({"embed", {3, 2, {1, 2, 3, 4, 5, 6}}});
  g.points.push_back({"layers.0.attn.o_proj.x_values", {3, 2, {1, -1, 2, 0, 5, 7}}});
  g.points.push_back({"layers.0.attn.out", {3, 2, {0.5, 0.25, 0.0, 1, 2, 3}}});
  g.points.push_back({"layers.0.residual", {3, 2, {1, 1, 1, 1, 1, 1}}});
  return g;
}

TEST(GoldenTpReport, CountsChangedBitsAndListsAbsentPoints) {
  const Golden tp1 = base();
  Golden tp2 = base();
  tp2.points.erase(tp2.points.begin() + 1);  // o_proj codes absent at tp 2
  tp2.meta.absent_points.push_back({"layers.0.attn.o_proj.x_values", "tp 2: per-rank scales"});
  tp2.points[1].values.data[0] = std::nextafter(0.5, 1.0);  // attn.out: one ulp
  tp2.points[1].values.data[2] = -0.0;                      // and a signed zero
  const TpReport r = tp_numerics_report(tp1, tp2, &tp1, 2);
  ASSERT_EQ(r.points.size(), 4u);
  EXPECT_EQ(r.points[0].changed, 0);
  EXPECT_EQ(r.points[1].absent, "tp 2: per-rank scales");
  EXPECT_EQ(r.points[2].changed, 2);
  EXPECT_GT(r.points[2].max_abs, 0);
  EXPECT_GT(r.points[2].rel_l2, 0);
  EXPECT_EQ(r.points[2].tp1_vs_ref, 0);
  EXPECT_GT(r.points[2].tpn_vs_ref, 0);
  EXPECT_EQ(r.changed_points, 1);
  EXPECT_EQ(r.first_changed, "layers.0.attn.out");
  EXPECT_EQ(r.tpn_vs_tp1.kld_mean.value, 0);
  EXPECT_EQ(r.tpn_vs_tp1.top1.value, 1);
  const std::string text = to_text(r);
  EXPECT_THAT(text, HasSubstr("1 of 4 points change bits; the first is layers.0.attn.out"));
  EXPECT_THAT(text, HasSubstr("absent at TP = 2: tp 2: per-rank scales"));
  EXPECT_EQ(to_json(r)["points"][2]["changed"], 2);
}

TEST(GoldenTpReport, EndToEndMovesWithTheLogits) {
  const Golden tp1 = base();
  Golden tp4 = base();
  tp4.logits.data[4 + 3] = 5.0;  // row 1's argmax moves to column 3
  const TpReport r = tp_numerics_report(tp1, tp4, nullptr, 4);
  EXPECT_FALSE(r.has_reference);
  EXPECT_GT(r.tpn_vs_tp1.kld_mean.value, 0);
  EXPECT_NEAR(r.tpn_vs_tp1.top1.value, 2.0 / 3.0, 1e-12);
  EXPECT_EQ(r.tpn_vs_tp1.first_greedy_divergence, 1);
  EXPECT_EQ(r.changed_points, 0);
}

TEST(GoldenTpReport, RefusesGoldensOfOtherTokens) {
  const Golden tp1 = base();
  Golden other = base();
  other.tokens[2] = 9;
  EXPECT_THAT(error_of([&] { tp_numerics_report(tp1, other, nullptr, 2); }),
              HasSubstr("ran other tokens"));
  EXPECT_THAT(error_of([&] { tp_numerics_report(tp1, tp1, &other, 2); }),
              HasSubstr("the reference golden ran other tokens"));
}

}  // namespace
}  // namespace qparity::golden
