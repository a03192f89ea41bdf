// A candidate written by the Python package (python/qparity_dump) read by the C++ side unchanged:
// for each fixture architecture the package copies a golden's own numbers into a candidate, and
// compare must find every shared point bit for bit equal, list the points the candidate declares
// absent without failing them, fail a point left out undeclared, and refuse a file that declares
// absent a point it holds. The package's checkpoint hashes must equal the golden's. Skipped, with
// the reason, where no Python 3 with numpy and h5py was found at configure time.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <filesystem>

#include "../unit/test_seed.h"
#include "cli_runner.h"
#include "core/json_util.h"
#include "golden/compare.h"
#include "golden/policy.h"

namespace qparity::test {
namespace {

namespace fs = std::filesystem;
using ::testing::HasSubstr;

class CliPythonCandidate : public testing::TestWithParam<const char*> {
 protected:
  void SetUp() override {
    if (std::string(QPARITY_PYTHON).empty())
      GTEST_SKIP() << "no Python 3 with numpy and h5py at configure time (Debian: python3-h5py)";
    dir_ = fs::temp_directory_path() /
           ("qparity_py_cand_" + std::string(GetParam()) + std::to_string(test_seed()));
    fs::create_directories(dir_);
    ASSERT_EQ(run_cli(dir_, "make-fixture --arch " + std::string(GetParam()) +
                                " --size tiny --seed 5 --out " + (dir_ / "fx").string())
                  .status,
              0);
    const CliRun g = run_cli(dir_, "golden make --model " + (dir_ / "fx").string() +
                                       " --synthetic 2 --seq-len 6 --mode emulate "
                                       "--run-dtype bf16 --out " +
                                       (dir_ / "g.h5").string());
    ASSERT_EQ(g.status, 0) << g.err;
  }
  void TearDown() override {
    if (!dir_.empty()) fs::remove_all(dir_);
  }
  // Runs the package's round-trip writer; its exit status.
  int write(const std::string& mode, const std::string& out) {
    const std::string cmd = "PYTHONPATH=" + std::string(QPARITY_SOURCE_DIR) + "/python " +
                            std::string(QPARITY_PYTHON) + " " + QPARITY_SOURCE_DIR +
                            "/python/tests/roundtrip_candidate.py --golden " +
                            (dir_ / "g.h5").string() + " --model " + (dir_ / "fx").string() +
                            " --out " + (dir_ / out).string() + " --mode " + mode;
    const int rc = std::system(cmd.c_str());
    return WIFEXITED(rc) ? WEXITSTATUS(rc) : -1;
  }
  fs::path dir_;
};

TEST_P(CliPythonCandidate, SameNumbersCompareBitForBit) {
  ASSERT_EQ(write("declared", "c.h5"), 0) << "the package's hashes differ from the golden's, or "
                                             "the writer failed";
  const auto g = golden::GoldenReader::open(dir_ / "g.h5");
  const auto c = golden::GoldenReader::open(dir_ / "c.h5");
  EXPECT_EQ(c.meta().producer, "python-roundtrip");
  EXPECT_EQ(c.meta().checkpoint_hash, g.meta().checkpoint_hash);
  EXPECT_EQ(c.meta().model_config_hash, g.meta().model_config_hash);
  ASSERT_EQ(c.meta().absent_points.size(), 1u);
  EXPECT_EQ(c.meta().absent_points[0].glob, "layers.*.attn.core");
  const golden::Policy policy =
      golden::load_policy(fs::path(QPARITY_SOURCE_DIR) / "policies" / "bf16.json");
  golden::CompareOptions o;
  o.policy = &policy;
  const golden::CompareReport r = golden::compare_goldens(g, c, o);
  EXPECT_EQ(r.points.size() + r.declared_absent.size(), g.point_names().size());
  EXPECT_TRUE(r.missing_in_candidate.empty());
  for (const auto& d : r.declared_absent) {
    EXPECT_THAT(d.point, HasSubstr(".attn.core"));
    EXPECT_EQ(d.reason, "written by the round-trip test");
  }
  for (const auto& p : r.points) {
    EXPECT_EQ(p.stats.max_abs, 0.0) << p.name;
    EXPECT_EQ(p.stats.rel_l2, 0.0) << p.name;
  }
  EXPECT_EQ(r.e2e.kld_mean.value, 0.0);
  EXPECT_EQ(r.e2e.top1.value, 1.0);
  EXPECT_EQ(r.verdict, golden::Judgement::kPass) << (r.failures.empty() ? "" : r.failures[0]);

  const CliRun cli =
      run_cli(dir_, "compare " + (dir_ / "g.h5").string() + " " + (dir_ / "c.h5").string());
  EXPECT_EQ(cli.status, 0) << cli.err;
  EXPECT_THAT(cli.out, HasSubstr("declared absent by the candidate (not compared): "
                                 "layers.*.attn.core"));

  // The README's example (python/examples/candidate_from_arrays.py) writes a candidate that
  // compares the same way.
  const std::string example = "PYTHONPATH=" + std::string(QPARITY_SOURCE_DIR) + "/python " +
                              std::string(QPARITY_PYTHON) + " " + QPARITY_SOURCE_DIR +
                              "/python/examples/candidate_from_arrays.py " +
                              (dir_ / "fx").string() + " " + (dir_ / "g.h5").string() + " " +
                              (dir_ / "example.h5").string();
  ASSERT_EQ(std::system(example.c_str()), 0);
  const CliRun ex =
      run_cli(dir_, "compare " + (dir_ / "g.h5").string() + " " + (dir_ / "example.h5").string());
  EXPECT_EQ(ex.status, 0) << ex.out << ex.err;
  EXPECT_THAT(ex.out, HasSubstr("fused attention kernel"));
}

TEST_P(CliPythonCandidate, UndeclaredGapsFailAndContradictionsAreRefused) {
  ASSERT_EQ(write("undeclared", "u.h5"), 0);
  const CliRun u =
      run_cli(dir_, "compare " + (dir_ / "g.h5").string() + " " + (dir_ / "u.h5").string());
  EXPECT_EQ(u.status, 3) << u.out << u.err;
  EXPECT_THAT(u.out, HasSubstr("missing in the candidate: layers.0.attn.core  FAIL"));

  ASSERT_EQ(write("contradict", "x.h5"), 0);
  const CliRun x =
      run_cli(dir_, "compare " + (dir_ / "g.h5").string() + " " + (dir_ / "x.h5").string());
  EXPECT_EQ(x.status, 1);
  EXPECT_THAT(x.err, HasSubstr("declares 'layers.*.attn.core' absent"));
}

// validate --candidate: the dump becomes an engine row of the report set, engine and device
// named; a candidate of another checkpoint is refused. The golden (SetUp) is the emulate-mode
// bf16 run validate makes for a BF16 candidate, so the row's numbers are exactly zero.
TEST_P(CliPythonCandidate, ValidateAddsAnEngineRow) {
  ASSERT_EQ(write("declared", "c.h5"), 0);
  const std::string fx = (dir_ / "fx").string(), rep = (dir_ / "rep").string();
  const CliRun v = run_cli(dir_, "validate --model " + fx + " --candidate " +
                                     (dir_ / "c.h5").string() + " --out " + rep);
  ASSERT_EQ(v.status, 0) << v.err;
  const fs::path json = dir_ / "rep" / "sm90" / "fx" / "bf16.python-roundtrip.json";
  ASSERT_TRUE(fs::exists(json)) << v.err;
  const Json s = Json::parse(slurp(json))["summary"];
  EXPECT_EQ(s["engine"], "python-roundtrip");
  EXPECT_EQ(s["device_name"], "NVIDIA Test GPU sm90");
  EXPECT_EQ(s["role"], "engine");
  EXPECT_EQ(s["verdict"], "PASS");
  // validate made the same golden (emulate, the candidate's BF16 run dtype and dialect): zero.
  EXPECT_EQ(s["kld_mean"].get<double>(), 0.0);
  EXPECT_EQ(s["worst_point_rel_l2"].get<double>(), 0.0);
  EXPECT_GT(s["declared_absent_points"].get<int64_t>(), 0);
  EXPECT_THAT(slurp(dir_ / "rep" / "index.md"), HasSubstr("| python-roundtrip |"));
  EXPECT_THAT(s["notes"].dump(), testing::Not(HasSubstr("first capture point outside")));

  // A point off by 5 %: the row (judged end to end, the logits being the golden's) says where
  // the engine's numbers first leave the point gates.
  ASSERT_EQ(write("perturbed", "p.h5"), 0);
  const CliRun pv = run_cli(dir_, "validate --model " + fx + " --candidate " +
                                      (dir_ / "p.h5").string() + " --out " + rep);
  ASSERT_EQ(pv.status, 0) << pv.err;
  EXPECT_THAT(Json::parse(slurp(json))["summary"]["notes"].dump(),
              HasSubstr("first capture point outside the policy's point gates (shown, not judged, "
                        "in a free run): layers.0.attn.out"));

  ASSERT_EQ(run_cli(dir_, "make-fixture --arch " + std::string(GetParam()) +
                              " --size tiny --seed 6 --out " + (dir_ / "other").string())
                .status,
            0);
  const CliRun w = run_cli(dir_, "validate --model " + (dir_ / "other").string() + " --candidate " +
                                     (dir_ / "c.h5").string() + " --out " + rep);
  EXPECT_EQ(w.status, 1);
  EXPECT_THAT(w.err, HasSubstr("the candidate ran another checkpoint"));

  // The scheme is the checkpoint's, not the label's: a bf16 dump labelled fp8-block is refused
  // naming both (main ran the bf16 reference and wrote an fp8-block PASS row).
  ASSERT_EQ(write("relabelled", "l.h5"), 0);
  const CliRun l = run_cli(dir_, "validate --model " + fx + " --candidate " +
                                     (dir_ / "l.h5").string() + " --out " + rep);
  EXPECT_EQ(l.status, 1) << l.out;
  EXPECT_THAT(l.err, HasSubstr("scheme 'fp8-block' differs from the checkpoint's 'bf16'"));
  EXPECT_FALSE(fs::exists(dir_ / "rep" / "sm90" / "fx" / "fp8-block.python-roundtrip.json"));
}

INSTANTIATE_TEST_SUITE_P(Architectures, CliPythonCandidate,
                         testing::Values("llama", "qwen3", "qwen3-moe"),
                         [](const auto& param_info) {
                           std::string s = param_info.param;
                           for (char& ch : s)
                             if (ch == '-') ch = '_';
                           return s;
                         });

}  // namespace
}  // namespace qparity::test
