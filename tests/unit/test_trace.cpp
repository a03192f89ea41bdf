// Capture-point selection and accumulation (core/capture/trace.h).
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "core/capture/trace.h"
#include "error_of.h"

namespace qparity::reference {
namespace {

using ::testing::HasSubstr;

TEST(Trace, GlobMatching) {
  EXPECT_TRUE(glob_match("*", "layers.3.attn.core"));
  EXPECT_TRUE(glob_match("layers.*.residual", "layers.12.residual"));
  EXPECT_FALSE(glob_match("layers.*.residual", "layers.1.attn.out"));
  EXPECT_TRUE(glob_match("layers.?.mlp.*", "layers.7.mlp.act"));
  EXPECT_FALSE(glob_match("layers.?.mlp.*", "layers.17.mlp.act"));
  EXPECT_TRUE(glob_match("*.moe.*", "layers.0.moe.topk_ids"));
  EXPECT_TRUE(glob_match("logits", "logits"));
  EXPECT_FALSE(glob_match("logits", "logits2"));
  EXPECT_TRUE(glob_match("a*b*c", "aXbYbZc"));
  EXPECT_FALSE(glob_match("a*b*c", "aXbYbZ"));
  EXPECT_TRUE(glob_match("", ""));
  EXPECT_FALSE(glob_match("", "x"));
}

TEST(Trace, SelectsByPatternListAndAppendsRows) {
  Trace t("logits, layers.*.residual ");  // spaces around globs are ignored
  EXPECT_TRUE(t.wants("layers.2.residual"));
  EXPECT_FALSE(t.wants("embed"));
  Trace u("logits,layers.*.residual");
  EXPECT_TRUE(u.wants("layers.0.residual"));
  EXPECT_FALSE(u.wants("embed"));
  Matrix a(2, 3, 1.0), b(1, 3, 2.0);
  u.record("logits", a);
  u.record("logits", b);
  u.record("embed", a);  // not selected: dropped
  ASSERT_EQ(u.points().size(), 1u);
  EXPECT_EQ(u.at("logits").rows, 3);
  EXPECT_EQ(u.at("logits")(2, 0), 2.0);
  EXPECT_THAT(test::error_of([&] { u.record("logits", Matrix(1, 4)); }),
              HasSubstr("trace point logits: has 3 columns, now 4"));
  EXPECT_THAT(test::error_of([&] { u.at("embed"); }), HasSubstr("'embed'"));
  EXPECT_FALSE(Trace("").wants("logits"));
}

}  // namespace
}  // namespace qparity::reference
