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
  // Random-weight fixtures exceed the default budgets (flat next-token distributions, 16
  // positions): the run writes every report and exits by the verdicts.
  ASSERT_EQ(r.status, 3) << r.err;
  EXPECT_THAT(r.err, HasSubstr("[3/3, "));  // a k/N counter, one plain line per step
  EXPECT_EQ(r.err.find('\r'), std::string::npos);
  for (const char* s : {"fp8-block", "mxint4", "kv-int8"}) {
    const fs::path base = out / "cpu-reference" / "moe" / s;
    for (const char* ext : {".json", ".md", ".html"})
      EXPECT_TRUE(fs::exists(base.string() + ext)) << base << ext;
    const Json j = read_json_file(base.string() + ".json");
    EXPECT_EQ(j["summary"]["scheme"], s);
    EXPECT_EQ(j["summary"]["role"], "format");
    // Judged twice: the format's math (first op) and the acceptance budget, reported apart.
    EXPECT_EQ(j["summary"]["math_check"], "ok") << s;
    EXPECT_TRUE(j["summary"]["budget_check"].is_string()) << s;
    EXPECT_THAT(j["summary"]["budget_source"].get<std::string>(), HasSubstr("[budget]"));
    // 16 positions cannot bound top-1 agreement at 0.85 or 0.9 even when every one agrees: such
    // a budget is "undecided" and the row NOT JUDGED, never a FAIL of agreeing data.
    const std::string check = j["summary"]["budget_check"];
    EXPECT_EQ(j["summary"]["verdict"], check == "within"     ? "PASS"
                                       : check == "EXCEEDED" ? "FAIL"
                                                             : "NOT JUDGED")
        << s << " " << check;
    EXPECT_EQ(j["compare"]["end_to_end"]["positions"], 16);
    EXPECT_GT(j["compare"]["points"].size(), 20u);
    // Activation quantization statistics exist exactly for the schemes that quantize
    // activations or the KV cache (fp8-block: every linear incl. the expert stacks; kv-int8: the
    // cached keys and values; mxint4: none).
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
    } else if (std::string(s) == "kv-int8") {
      ASSERT_EQ(act.size(), 4u);  // k_cache and v_cache of two layers
      EXPECT_EQ(act[0]["name"], "layers.0.attn.k_cache");
      EXPECT_EQ(act[1]["name"], "layers.0.attn.v_cache");
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
  EXPECT_THAT(index, HasSubstr("## Legend"));
  EXPECT_THAT(index, HasSubstr("## At a glance"));
  {  // Every row of the report table ("Every row", after the matrix at a glance) has the
     // header's number of cells.
    std::istringstream lines(index.substr(index.find("## Every row")));
    std::string line;
    long header = -1;
    while (std::getline(lines, line)) {
      if (line.rfind("## ", 0) == 0 && header > 0) break;  // the next table
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

// Without --model: the trained fixtures, evaluated on their held-out text and calibrated on
// their calibration text; each report's perplexity is a trained model's (a uniform guess over
// the 1,024-token vocabulary would be 1,024). --fixtures chooses the default set only.
TEST(CliValidate, DefaultsToTheTrainedFixturesOnTheirHeldOutText) {
  const fs::path dir =
      fs::temp_directory_path() / ("qparity_validate_trained_" + std::to_string(test_seed()));
  fs::create_directories(dir);
  const fs::path out = dir / "reports";
  const CliRun r =
      run_cli(dir, "validate --schemes kv-int8 --sequences 2 --seq-len 64 --out " + out.string());
  ASSERT_TRUE(r.status == 0 || r.status == 3) << r.err;
  EXPECT_THAT(r.err, HasSubstr("calibrating on the first 2048 tokens of"));
  EXPECT_THAT(r.err, HasSubstr("calib.txt"));
  for (const char* model : {"llama-trained", "qwen3-trained", "qwen3-moe-trained"}) {
    const fs::path base = out / "cpu-reference" / model / "kv-int8";
    ASSERT_TRUE(fs::exists(base.string() + ".json")) << base;
    const Json j = read_json_file(base.string() + ".json");
    EXPECT_EQ(j["compare"]["end_to_end"]["positions"], 2 * 64) << model;
    const double ppl = j["compare"]["end_to_end"]["ppl_golden"].get<double>();
    EXPECT_GT(ppl, 1.0) << model;
    EXPECT_LT(ppl, 40.0) << model;
    EXPECT_EQ(j["summary"]["math_check"], "ok") << model;
  }
  const CliRun bad = run_cli(dir, "validate --fixtures nope --out " + out.string());
  EXPECT_EQ(bad.status, 2) << bad.err;
  EXPECT_THAT(bad.err, HasSubstr("--fixtures"));
  const CliRun both =
      run_cli(dir, "validate --model " + dir.string() + " --fixtures random --out " + out.string());
  EXPECT_EQ(both.status, 2) << both.err;
  EXPECT_THAT(both.err, HasSubstr("--model names the model"));
  fs::remove_all(dir);
}

// The real checkpoint, by shape: a Llama whose intermediate size (172) breaks the group
// schemes' K rules. validate runs every scheme that applies (the down projections left
// unquantized, said in the row), skips what cannot apply with the reason in the index, and exits
// by the verdicts; a second model whose hidden size (72) leaves a group scheme nothing to take is
// skipped with the constraint and tensor named.
TEST(CliValidate, ARealCheckpointsShapesSkipOnlyWhatCannotApply) {
  const fs::path dir =
      fs::temp_directory_path() / ("qparity_validate_odd_" + std::to_string(test_seed()));
  fs::create_directories(dir);
  const fs::path odd = dir / "odd", odder = dir / "odder";
  ASSERT_EQ(
      run_cli(dir, "make-fixture --arch llama --hidden 64 --intermediate 172 --seed 3 --out " +
                       odd.string())
          .status,
      0);
  ASSERT_EQ(
      run_cli(dir, "make-fixture --arch llama --hidden 72 --intermediate 172 --seed 3 --out " +
                       odder.string())
          .status,
      0);
  const fs::path out = dir / "reports";
  const std::string schemes =
      " --schemes w8a16-ch,w8a16-g64,mxint4,fp8-block --sequences 2 "
      "--seq-len 8 --calib-tokens 64 --out " +
      out.string();
  const CliRun r = run_cli(dir, "validate --model " + odd.string() + schemes);
  EXPECT_TRUE(r.status == 0 || r.status == 3) << r.err;
  const Json g64 = read_json_file(out / "cpu-reference" / "odd" / "w8a16-g64.json");
  // The row's notes say which linear stayed unquantized and why (among the comparison's own).
  const std::string notes = g64["summary"]["notes"].dump();
  EXPECT_THAT(notes, HasSubstr("model.layers.0.mlp.down_proj"));
  EXPECT_THAT(notes, HasSubstr("divisible by 64"));
  EXPECT_TRUE(fs::exists(out / "cpu-reference" / "odd" / "fp8-block.json"))
      << "ragged 128-blocks run (K = 64, 172)";
  const CliRun r2 = run_cli(dir, "validate --model " + odder.string() + schemes);
  EXPECT_TRUE(r2.status == 0 || r2.status == 3) << r2.err;
  EXPECT_FALSE(fs::exists(out / "cpu-reference" / "odder" / "w8a16-g64.json"));
  const std::string index = slurp(out / "index.md");
  EXPECT_THAT(index, HasSubstr("## Not run"));
  EXPECT_THAT(index, HasSubstr("| odd | mxint4 | mxint4 quantizes MoE expert stacks only"));
  EXPECT_THAT(index, HasSubstr("| odder | w8a16-g64 | model.layers.0."));
  EXPECT_THAT(index, HasSubstr("divisible by 64"));
  for (const char* row : {"[w8a16-ch](cpu-reference/odd/", "[w8a16-ch](cpu-reference/odder/"})
    EXPECT_THAT(index, HasSubstr(row));
  EXPECT_FALSE(fs::exists(out / ".work"));
  fs::remove_all(dir);
}

}  // namespace
}  // namespace qparity::test
