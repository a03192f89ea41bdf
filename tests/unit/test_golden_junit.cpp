// JUnit from a report root (golden/junit.h): a PASS row is a plain test case, a FAIL a
// <failure> with the policy's reasons, NOT JUDGED and skipped schemes <skipped> (never a pass);
// text is escaped; only a file qparity wrote is replaced.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <sstream>

#include "error_of.h"
#include "golden/junit.h"
#include "golden/report.h"
#include "minimal_report.h"
#include "scratch_dir.h"

namespace qparity::golden {
namespace {

namespace fs = std::filesystem;
using test::error_of;
using ::testing::HasSubstr;
using ::testing::Not;

std::string read(const fs::path& p) {
  std::ifstream in(p);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

int count(const std::string& s, const std::string& what) {
  int n = 0;
  for (size_t i = s.find(what); i != std::string::npos; i = s.find(what, i + 1))
    ++n;
  return n;
}

TEST(Junit, RowsBecomeCasesAndOnlyPassesPass) {
  const fs::path root = test::scratch_dir("qparity_junit") / "reports";
  write_report(test::minimal_report("sm90", "llama", "bf16"), root);
  Json fail = test::minimal_report("sm90", "llama", "fp8-block");
  fail["summary"]["verdict"] = "FAIL";
  fail["summary"]["pass"] = false;
  fail["summary"]["failures"] = {"layers.1.mlp.out rel_l2 0.5 > 0.01 <&\"'>"};
  write_report(fail, root);
  Json unjudged = test::minimal_report("sm90", "llama", "w8a16-ch");
  unjudged["summary"]["verdict"] = "NOT JUDGED";
  unjudged["summary"]["judged_by"] = "no policy gate applies";
  write_report(unjudged, root);
  record_skipped(root, {"llama", "mxint4", "mxint4 quantizes MoE expert stacks only"});

  const std::string xml = junit_xml(root, "my CI");
  EXPECT_THAT(xml, HasSubstr("<testsuite name=\"my CI\" tests=\"4\" failures=\"1\" skipped=\"2\""));
  EXPECT_EQ(count(xml, "<testcase "), 4);
  EXPECT_EQ(count(xml, "<failure "), 1);
  EXPECT_EQ(count(xml, "<skipped "), 2);
  EXPECT_THAT(
      xml,
      HasSubstr("message=\"layers.1.mlp.out rel_l2 0.5 &gt; 0.01 &lt;&amp;&quot;&apos;&gt;\""));
  EXPECT_THAT(xml, HasSubstr("NOT JUDGED: no policy gate applies"));
  EXPECT_THAT(xml, HasSubstr("mxint4 quantizes MoE expert stacks only"));
  EXPECT_THAT(xml, HasSubstr("<property name=\"report\" value=\"" +
                             (root / "sm90/llama/fp8-block.json").string()));
  EXPECT_THAT(xml, Not(HasSubstr("<\"'")));

  const fs::path out = root.parent_path() / "junit.xml";
  write_junit(out, root, "my CI");
  EXPECT_EQ(read(out), xml);
  write_junit(out, root, "again");  // its own file: replaced
  EXPECT_THAT(read(out), HasSubstr("name=\"again\""));
  // Anything else is left as it is.
  const fs::path theirs = root.parent_path() / "theirs.xml";
  std::ofstream(theirs) << "<results/>";
  EXPECT_THAT(error_of([&] { write_junit(theirs, root, "x"); }),
              HasSubstr("is not a JUnit file qparity wrote"));
  EXPECT_THAT(error_of([&] { check_junit_target(theirs); }), HasSubstr("is not a JUnit file"));
  EXPECT_EQ(read(theirs), "<results/>");
  EXPECT_THAT(error_of([&] { check_junit_target(root / "no" / "such" / "j.xml"); }),
              HasSubstr("does not exist"));
  EXPECT_NO_THROW(check_junit_target(root.parent_path() / "new.xml"));
}

}  // namespace
}  // namespace qparity::golden
