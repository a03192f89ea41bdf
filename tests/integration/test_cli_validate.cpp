// `qparity validate` (the main job) on a subset of schemes and `qparity report`: the report set
// exists, the JSON is the source of the md/html, the index lists every scheme, the HTML carries
// its plots inline.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <filesystem>
#include <sstream>

#include "../unit/test_seed.h"
#include "cli_runner.h"
#include "core/json_util.h"

namespace qparity::test {
namespace {

namespace fs = std::filesystem;
using ::testing::HasSubstr;

TEST(CliValidate, WritesTheReportSetForEachScheme) {
  const fs::path dir =
      fs::temp_directory_path() / ("qparity_validate_" + std::to_string(test_seed()));
  fs::create_directories(dir);
  const fs::path fx = dir / "moe";
  ASSERT_EQ(run_cli(dir, "make-fixture --arch qwen3-moe --seed 2 --out " + fx.string()).status, 0);
  const fs::path out = dir / "reports";
  const CliRun r = run_cli(dir, "validate --model " + fx.string() +
                                    " --schemes fp8-block,mxint4,kv-int8 --sequences 2 "
                                    "--seq-len 8 --out " +
                                    out.string());
  ASSERT_EQ(r.status, 0) << r.err;
  for (const char* s : {"fp8-block", "mxint4", "kv-int8"}) {
    const fs::path base = out / "cpu-reference" / "moe" / s;
    for (const char* ext : {".json", ".md", ".html"})
      EXPECT_TRUE(fs::exists(base.string() + ext)) << base << ext;
    const Json j = read_json_file(base.string() + ".json");
    EXPECT_EQ(j["summary"]["scheme"], s);
    EXPECT_EQ(j["summary"]["role"], "format");
    EXPECT_EQ(j["compare"]["end_to_end"]["positions"], 16);
    EXPECT_GT(j["compare"]["points"].size(), 20u);
    // Activation quantization statistics exist exactly for the schemes that quantize
    // activations (fp8-block: every linear incl. the expert stacks; mxint4 and kv-int8: none).
    const Json& act = j["compare"]["activation_stats"];
    if (std::string(s) == "fp8-block") {
      ASSERT_FALSE(act.empty());
      EXPECT_EQ(act[0]["name"], "layers.0.attn.qkv_proj");
      EXPECT_GT(act[0]["candidate"]["codes"].get<int64_t>(), 0);
      EXPECT_TRUE(act[0]["golden"].is_null());  // the unquantized baseline has none
      bool experts = false;
      for (const auto& a : act)
        experts = experts || a["name"] == "layers.0.moe.experts.w13";
      EXPECT_TRUE(experts);
    } else {
      EXPECT_TRUE(act.empty()) << s;
    }
    const std::string html = slurp(base.string() + ".html");
    EXPECT_THAT(html, HasSubstr("<svg"));
    EXPECT_THAT(html, HasSubstr("top-k flip rate per MoE layer"));
    EXPECT_THAT(slurp(base.string() + ".md"), HasSubstr("| mean KLD (95% upper) |"));
  }
  const std::string index = slurp(out / "index.md");
  for (const char* s : {"[fp8-block]", "[mxint4]", "[kv-int8]"})
    EXPECT_THAT(index, HasSubstr(s));
  EXPECT_TRUE(fs::exists(out / "index.html"));
  {  // Every index row has the header's number of cells.
    std::istringstream lines(index);
    std::string line;
    long header = -1;
    while (std::getline(lines, line)) {
      if (line.empty() || line[0] != '|') continue;
      const long cells = std::count(line.begin(), line.end(), '|');
      if (header < 0) header = cells;
      EXPECT_EQ(cells, header) << line;
    }
    EXPECT_GT(header, 10);
  }
  EXPECT_FALSE(fs::exists(out / ".work")) << "the work directory is removed";
  const CliRun bad =
      run_cli(dir, "validate --model " + fx.string() + " --schemes nope --out " + out.string());
  EXPECT_EQ(bad.status, 1);
  EXPECT_THAT(bad.err, HasSubstr("nope"));
  fs::remove_all(dir);
}

}  // namespace
}  // namespace qparity::test
