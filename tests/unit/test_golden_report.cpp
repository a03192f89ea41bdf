// Report files: names from file content stay inside the report root, and the index lists what
// this tool wrote there and nothing else.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <sys/wait.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <set>
#include <sstream>
#include <vector>

#include "core/json_util.h"
#include "error_of.h"
#include "golden/report.h"
#include "minimal_report.h"
#include "test_seed.h"

namespace qparity::golden {
namespace {

namespace fs = std::filesystem;
using test::error_of;
using test::minimal_report;
using ::testing::HasSubstr;

TEST(GoldenReport, PathComponentsFromFileContentCannotEscape) {
  for (const char* bad : {"..", ".", "../..", "../config", "/etc/passwd", "a/../../b", "...", ""}) {
    const std::string c = path_safe(bad);
    SCOPED_TRACE(bad);
    EXPECT_FALSE(c.empty());
    EXPECT_NE(c, ".");
    EXPECT_NE(c, "..");
    EXPECT_NE(c[0], '.');
    EXPECT_EQ(c.find('/'), std::string::npos);
    EXPECT_EQ(fs::path(c).filename().string(), c);
  }
  EXPECT_EQ(path_safe("NVIDIA H100 sm90"), "NVIDIA-H100-sm90");
  EXPECT_EQ(path_safe("w8a8-static+kv-int8"), "w8a8-static+kv-int8");
  const std::string a = path_safe(std::string(300, 'x') + "a"),
                    b = path_safe(std::string(300, 'x') + "b");
  EXPECT_EQ(a.size(), 80u);
  EXPECT_NE(a, b) << "cut names keep a hash of the whole";
}

TEST(GoldenReport, IndexListsWhatWasWrittenAndSurvivesStrayFiles) {
  const fs::path root =
      fs::temp_directory_path() / ("qparity_report_" + std::to_string(test::test_seed()));
  fs::remove_all(root);
  const ReportFiles f = write_report(minimal_report("../..", "..", "../config"), root);
  for (const fs::path& p : {f.json, f.md, f.html}) {
    EXPECT_TRUE(fs::exists(p));
    const auto rel = fs::relative(fs::weakly_canonical(p), fs::weakly_canonical(root));
    EXPECT_FALSE(rel.empty());
    for (const auto& c : rel)
      EXPECT_TRUE(c != ".." && c != ".") << p;
  }
  // Stray JSON under the root (a user's notes, another tool's output) does not break the index.
  fs::create_directories(root / "x" / "y");
  std::ofstream(root / "x" / "y" / "notes.json") << "{ not json";
  std::ofstream(root / "stray.json") << "[1, 2]";
  record_skipped(root, {"m", "w8a16-g64", "model.layers.0.mlp.down_proj: K = 172 % 64 != 0"});
  write_index(root);
  std::ifstream in(root / "index.md");
  std::stringstream md;
  md << in.rdbuf();
  EXPECT_THAT(md.str(), HasSubstr("config"));
  EXPECT_THAT(md.str(), HasSubstr("## Not run"));
  EXPECT_THAT(md.str(), HasSubstr("K = 172 % 64 != 0"));
  EXPECT_THAT(md.str(), HasSubstr("## Legend"));
  EXPECT_EQ(md.str().find("x/y"), std::string::npos) << "only the reports it wrote are listed";
  EXPECT_EQ(md.str().find("stray"), std::string::npos);
  // A report for the skipped scheme supersedes the skip.
  write_report(minimal_report("cpu-reference", "m", "w8a16-g64"), root);
  write_index(root);
  std::ifstream in2(root / "index.md");
  std::stringstream md2;
  md2 << in2.rdbuf();
  EXPECT_EQ(md2.str().find("## Not run"), std::string::npos);
  // An index.json that is not ours is refused by name, not overwritten.
  std::ofstream(root / "index.json") << "[]";
  EXPECT_THAT(error_of([&] { write_index(root); }), HasSubstr("is not a qparity report index"));
  fs::remove_all(root);
}

// Rows of different sources never overwrite each other: an H100 and an H200 (both key sm90),
// two engine versions, and a PASS of another dump over a FAIL each get their own row; a rerun
// of the same source replaces its row (main kept only the last of these, and lost rows when
// four `report`s wrote one root at once).
TEST(GoldenReport, RowsOfDifferentSourcesNeverOverwriteEachOther) {
  const fs::path root =
      fs::temp_directory_path() / ("qparity_rows_" + std::to_string(test::test_seed()));
  fs::remove_all(root);
  const auto row = [](const std::string& name, const std::string& version,
                      const std::string& verdict, const std::string& dump) {
    Json r = minimal_report("sm90", "m", "fp8-block");
    r["summary"]["device_name"] = name;
    r["summary"]["engine"] = "vllm";
    r["summary"]["engine_version"] = version;
    r["summary"]["verdict"] = verdict;
    r["summary"]["pass"] = verdict == "PASS";
    r["summary"]["candidate_sha256"] = dump;
    return r;
  };
  const auto files = [&] {
    std::set<std::string> out;
    for (const auto& e : fs::directory_iterator(root / "sm90" / "m"))
      if (e.path().extension() == ".json") out.insert(e.path().filename().string());
    return out;
  };
  write_report(row("NVIDIA H100 80GB HBM3 sm90", "0.9", "PASS", "a"), root);
  write_report(row("NVIDIA H200 sm90", "0.9", "PASS", "b"), root);
  EXPECT_EQ(files().size(), 2u);
  write_report(row("NVIDIA H200 sm90", "0.10", "PASS", "c"), root);
  EXPECT_EQ(files().size(), 3u);
  // The same source with a new dump: replaced, unless a PASS would replace a FAIL.
  write_report(row("NVIDIA H100 80GB HBM3 sm90", "0.9", "FAIL", "d"), root);
  EXPECT_EQ(files().size(), 3u);
  write_report(row("NVIDIA H100 80GB HBM3 sm90", "0.9", "PASS", "e"), root);
  EXPECT_EQ(files().size(), 4u);
  int fails = 0;
  for (const auto& f : files())
    fails += read_json_file(root / "sm90" / "m" / f)["summary"]["verdict"] == "FAIL";
  EXPECT_EQ(fails, 1);
  write_index(root);
  EXPECT_EQ(read_json_file(root / "index.json")["reports"].size(), 4u);

  // Four processes writing one root at once: every row is listed.
  const fs::path par = root / "parallel";
  std::vector<pid_t> kids;
  for (int i = 0; i < 4; ++i) {
    const pid_t pid = ::fork();
    if (pid == 0) {
      for (int j = 0; j < 5; ++j) {
        write_report(minimal_report("cpu", "m" + std::to_string(i), "s" + std::to_string(j)), par);
        write_index(par);
      }
      std::_Exit(0);
    }
    kids.push_back(pid);
  }
  for (pid_t k : kids) {
    int st = 0;
    ::waitpid(k, &st, 0);
    EXPECT_TRUE(WIFEXITED(st) && WEXITSTATUS(st) == 0);
  }
  EXPECT_EQ(read_json_file(par / "index.json")["reports"].size(), 20u);
  fs::remove_all(root);
}

}  // namespace
}  // namespace qparity::golden

namespace qparity::golden {
namespace {

// The index's first view: schemes by bits per weight against model x device x engine columns,
// and the chart of mean KLD against bits per weight from the format rows.
TEST(GoldenReport, IndexOpensWithTheSchemeMatrixAndTheKldChart) {
  const fs::path root =
      fs::temp_directory_path() / ("qparity_report_glance_" + std::to_string(test::test_seed()));
  fs::remove_all(root);
  const auto format_row = [&](const std::string& model, const std::string& scheme, double kld) {
    Json r = test::minimal_report("cpu-reference", model, scheme);
    r["summary"]["role"] = "format";
    r["summary"]["kld_mean"] = kld;
    r["summary"]["kld_mean_hi"] = 2 * kld;
    write_report(r, root);
  };
  format_row("m1", "ct-w4a16-g128", 0.05);
  format_row("m1", "w8a16-ch", 3e-4);
  format_row("m2", "nvfp4a16", 0.04);
  write_report(test::minimal_report("sm90", "m1", "w8a16-ch"), root);  // an engine row
  write_index(root);
  std::stringstream md, html;
  md << std::ifstream(root / "index.md").rdbuf();
  html << std::ifstream(root / "index.html").rdbuf();
  const std::string m = md.str(), h = html.str();
  ASSERT_THAT(m, HasSubstr("## At a glance"));
  // Widest first: w8a16-ch (8 bits), nvfp4a16 (4 + 8/16), ct-w4a16-g128 (4 + 16/128).
  const size_t w8 = m.find("| w8a16-ch | 8 |"), fp4 = m.find("| nvfp4a16 | 4.5 |"),
               w4 = m.find("| ct-w4a16-g128 | 4.12 |");
  ASSERT_NE(w8, std::string::npos) << m;
  ASSERT_NE(fp4, std::string::npos) << m;
  ASSERT_NE(w4, std::string::npos) << m;
  EXPECT_LT(w8, fp4);
  EXPECT_LT(fp4, w4);
  EXPECT_THAT(m, HasSubstr("m1 · sm90"));  // the engine row has its own column
  EXPECT_LT(m.find("## At a glance"), m.find("## Every row"));
  // The chart: one point per format row with a KLD, each with its bar to the upper bound.
  ASSERT_THAT(h, HasSubstr("<svg"));
  size_t points = 0;
  for (size_t at = h.find("<circle cx"); at != std::string::npos; at = h.find("<circle cx", at + 1))
    ++points;
  EXPECT_EQ(points, 3u + 2u);  // three rows and a legend entry per model
  EXPECT_THAT(h, HasSubstr("m2 nvfp4a16: mean KLD 0.04"));
  fs::remove_all(root);
}

}  // namespace
}  // namespace qparity::golden
