// `qparity golden make / info`, `compare` and `bisect` end to end: the file h5dump and h5py read
// (where installed), never overwritten without --force, compare's exit status and JSON, bisect
// naming the first failing capture point.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <filesystem>

#include "../unit/test_seed.h"
#include "cli_runner.h"
#include "core/json_util.h"
#include "golden/golden_file.h"

namespace qparity::test {
namespace {

namespace fs = std::filesystem;
using ::testing::HasSubstr;
using ::testing::Not;

class CliGolden : public testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() / ("qparity_cli_golden_" + std::to_string(test_seed()));
    fs::create_directories(dir_);
    ASSERT_EQ(
        run_cli(dir_, "make-fixture --arch qwen3 --seed 4 --out " + (dir_ / "fx").string()).status,
        0);
  }
  void TearDown() override { fs::remove_all(dir_); }
  std::string make(const std::string& extra, const std::string& out) {
    return "golden make --model " + (dir_ / "fx").string() + " --synthetic 2 --seq-len 8 --out " +
           (dir_ / out).string() + " " + extra;
  }
  fs::path dir_;
};

// A checkpoint past --memory-budget is streamed one decoder layer at a time, to the same golden
// bit for bit; a budget its capture points cannot fit fails after the first layer, naming the size
// and --capture; a malformed budget is refused before any work.
TEST_F(CliGolden, PastTheMemoryBudgetTheModelStreamsToTheSameGolden) {
  // The tiny Qwen3's tensors take ~700 KiB; 2 x 2 tokens' points ~150 KiB.
  const auto make2 = [&](const std::string& extra, const std::string& out) {
    return "golden make --model " + (dir_ / "fx").string() +
           " --synthetic 2 --seq-len 2 --capture '*' --out " + (dir_ / out).string() + " " + extra;
  };
  const CliRun whole = run_cli(dir_, make2("", "whole.h5"));
  ASSERT_EQ(whole.status, 0) << whole.err;
  EXPECT_THAT(whole.err, Not(HasSubstr("streamed")));
  const CliRun streamed = run_cli(dir_, make2("--memory-budget 384K", "streamed.h5"));
  ASSERT_EQ(streamed.status, 0) << streamed.err;
  EXPECT_THAT(streamed.err, HasSubstr("streaming the model one decoder layer at a time"));
  EXPECT_THAT(streamed.err, HasSubstr("memory budget 384.0 KiB"));
  EXPECT_THAT(streamed.err, HasSubstr("layer 2/2 (2 x 2 tokens, streamed)"));
  const auto a = golden::GoldenReader::open(dir_ / "whole.h5");
  const auto b = golden::GoldenReader::open(dir_ / "streamed.h5");
  ASSERT_EQ(a.point_names(), b.point_names());
  for (const std::string& p : a.point_names())
    EXPECT_EQ(a.point(p).data, b.point(p).data) << p;
  EXPECT_EQ(a.logits().data, b.logits().data);
  EXPECT_EQ(a.meta().checkpoint_hash, b.meta().checkpoint_hash);

  const CliRun tight = run_cli(dir_, make2("--memory-budget 8K", "tight.h5"));
  EXPECT_EQ(tight.status, 1);
  EXPECT_THAT(tight.err, HasSubstr("more than the budget of 8.0 KiB"));
  EXPECT_THAT(tight.err, HasSubstr("--capture"));
  EXPECT_FALSE(fs::exists(dir_ / "tight.h5"));
  const CliRun bad = run_cli(dir_, make2("--memory-budget 6X", "bad.h5"));
  EXPECT_NE(bad.status, 0);
  EXPECT_THAT(bad.err, HasSubstr("'6X' is not a memory size"));
}

TEST_F(CliGolden, MakeWritesAFileOtherToolsRead) {
  const CliRun r = run_cli(dir_, make("--mode emulate", "g.h5"));
  ASSERT_EQ(r.status, 0) << r.err;
  EXPECT_THAT(r.err, HasSubstr("layer 2/2 (2 x 8 tokens)"));  // progress on stderr
  const CliRun again = run_cli(dir_, make("--mode emulate", "g.h5"));
  EXPECT_EQ(again.status, 1);
  EXPECT_THAT(again.err, HasSubstr("pass --force"));
  EXPECT_EQ(run_cli(dir_, make("--mode emulate --force", "g.h5")).status, 0);

  const CliRun info = run_cli(dir_, "golden info --json " + (dir_ / "g.h5").string());
  ASSERT_EQ(info.status, 0) << info.err;
  const Json j = Json::parse(info.out);
  EXPECT_EQ(j["schema_version"], 1);
  EXPECT_EQ(j["precision_mode"], "emulate");
  EXPECT_EQ(j["sequences"], 2);
  EXPECT_EQ(j["points"][0], "embed");
  EXPECT_EQ(j["points"].back(), "logits");

  if (std::system("command -v h5dump >/dev/null 2>&1") == 0) {
    const std::string cmd =
        "h5dump -H " + (dir_ / "g.h5").string() + " > " + (dir_ / "h5dump.txt").string() + " 2>&1";
    ASSERT_EQ(std::system(cmd.c_str()), 0);
    const std::string h = slurp(dir_ / "h5dump.txt");
    EXPECT_THAT(h, HasSubstr("ATTRIBUTE \"schema_version\""));
    EXPECT_THAT(h, HasSubstr("DATASET \"layers.0.attn.q_norm\""));
    EXPECT_THAT(h, HasSubstr("DATASET \"logits\""));
    EXPECT_THAT(h, HasSubstr("H5T_IEEE_F64LE"));
  } else {
    std::cout << "h5dump not installed: that check did not run\n";
  }
  std::string python;  // the first interpreter with h5py (Debian's python3-h5py is /usr/bin's)
  for (const char* p : {"python3", "/usr/bin/python3"})
    if (python.empty() &&
        std::system((std::string(p) + " -c 'import h5py' >/dev/null 2>&1").c_str()) == 0)
      python = p;
  if (!python.empty()) {
    const std::string py = python +
                           " -c \"import h5py,sys; f=h5py.File(sys.argv[1],'r'); "
                           "assert f.attrs['schema_version']==1; "
                           "o=sorted(f['points'], key=lambda n: f['points'][n].attrs['order']); "
                           "assert o[0]=='embed' and o[-1]=='logits', o; "
                           "assert f['outputs/logits'].shape==(16, f['outputs/logits'].shape[1]); "
                           "print('h5py ok', len(o))\" " +
                           (dir_ / "g.h5").string() + " > " + (dir_ / "py.txt").string() + " 2>&1";
    EXPECT_EQ(std::system(py.c_str()), 0) << slurp(dir_ / "py.txt");
  } else {
    std::cout << "h5py not installed: that check did not run\n";
  }
}

// --run-dtype: the golden for a bf16 engine running a wider checkpoint records the dtype its
// weights ran in, and compare warns by name against a golden that ran them in another.
TEST_F(CliGolden, RunDtypeIsRecordedAndComparedByName) {
  ASSERT_EQ(run_cli(dir_, make("--mode emulate --run-dtype bf16", "run-bf16.h5")).status, 0);
  ASSERT_EQ(run_cli(dir_, make("--mode emulate --run-dtype f32", "run-f32.h5")).status, 0);
  const CliRun info = run_cli(dir_, "golden info --json " + (dir_ / "run-f32.h5").string());
  ASSERT_EQ(info.status, 0) << info.err;
  EXPECT_EQ(Json::parse(info.out)["model_dtype"], "F32");
  const CliRun cmp = run_cli(dir_, "compare " + (dir_ / "run-f32.h5").string() + " " +
                                       (dir_ / "run-bf16.h5").string());
  EXPECT_THAT(cmp.out + cmp.err, HasSubstr("weight dtype: the golden ran the weights in F32"));
  const CliRun bad = run_cli(dir_, make("--run-dtype f8", "bad.h5"));
  EXPECT_EQ(bad.status, 2) << "a value outside the choices is a usage error";
}

TEST_F(CliGolden, CompareAndBisectJudgeByPolicy) {
  ASSERT_EQ(run_cli(dir_, make("--mode emulate", "emulate.h5")).status, 0);
  ASSERT_EQ(run_cli(dir_, make("--mode exact", "exact.h5")).status, 0);
  const std::string policy = (fs::path(QPARITY_SOURCE_DIR) / "policies/bf16.json").string();
  // Identical runs pass (as a reference rerun: cpu-reference section).
  const CliRun same = run_cli(dir_, "compare " + (dir_ / "emulate.h5").string() + " " +
                                        (dir_ / "emulate.h5").string() + " --policy " + policy);
  EXPECT_EQ(same.status, 0) << same.out << same.err;
  EXPECT_THAT(same.out, HasSubstr("[engine.cpu-reference]"));
  // exact (fp64 activations) against the emulate golden, judged as an sm90 engine. The bf16
  // rounding of every stored activation is far outside half a ULP, but a free run is judged end
  // to end (engine.default's point gates are layer-local bounds): the points are shown outside,
  // not judged, and the verdict is the end-to-end one.
  const std::string args = (dir_ / "emulate.h5").string() + " " + (dir_ / "exact.h5").string() +
                           " --policy " + policy + " --device sm90";
  const CliRun cmp = run_cli(dir_, "compare --json " + args);
  const Json j = Json::parse(cmp.out);
  EXPECT_EQ(j["policy"]["section"], "engine.default");
  EXPECT_EQ(j["policy"]["point_gates_judge"], false);
  ASSERT_TRUE(j["first_failing_point"].is_string());
  EXPECT_EQ(cmp.status, j["end_to_end"]["pass"].get<bool>() ? 0 : 3) << cmp.err;
  const CliRun text = run_cli(dir_, "compare " + args);
  EXPECT_THAT(text.out, HasSubstr("free-run dump: judged end to end"));
  EXPECT_THAT(text.out, HasSubstr("outside (not judged)"));
  // The reference's own section (cpu-reference, the candidate's device) judges a rerun of the
  // reference point by point at 1e-12: exit 3, the first point named.
  const std::string ref_args =
      (dir_ / "emulate.h5").string() + " " + (dir_ / "exact.h5").string() + " --policy " + policy;
  const CliRun strict = run_cli(dir_, "compare --json " + ref_args);
  EXPECT_EQ(strict.status, 3) << strict.err;
  const Json js = Json::parse(strict.out);
  EXPECT_EQ(js["verdict"], "FAIL");
  EXPECT_EQ(js["policy"]["section"], "engine.cpu-reference");
  const CliRun bis = run_cli(dir_, "bisect " + ref_args);
  EXPECT_EQ(bis.status, 3);
  EXPECT_THAT(bis.out, HasSubstr("first capture point outside policy (execution order): " +
                                 js["first_failing_point"].get<std::string>()));
  EXPECT_THAT(bis.out, HasSubstr("worst positions"));
  EXPECT_THAT(bis.out, HasSubstr("UNDECIDED (decision table row 6)"));
  EXPECT_THAT(bis.out, HasSubstr("give --model DIR"));
  // With the candidate's checkpoint, the candidate's own implementation (the reference in exact
  // mode) re-run on the golden's inputs still differs from the bf16-stored golden: LOCAL.
  const CliRun local = run_cli(dir_, "bisect " + ref_args + " --model " + (dir_ / "fx").string());
  EXPECT_EQ(local.status, 3);
  EXPECT_THAT(local.out, HasSubstr("LOCAL (decision table row 2)"));
  // Bad input: exit 1 naming the file.
  const CliRun bad =
      run_cli(dir_, "compare " + (dir_ / "none.h5").string() + " " + (dir_ / "exact.h5").string());
  EXPECT_EQ(bad.status, 1);
  EXPECT_THAT(bad.err, HasSubstr("none.h5: no such file"));
}

// `bisect --git GOOD BAD -- CMD`: git bisect run with compare as the oracle. A repository of six
// commits whose "build" writes a candidate dump: commits 1-3 the golden itself, 4-6 an exact-mode
// run outside the bf16 policy's reference section (1e-12 per point); git must name commit 4.
TEST_F(CliGolden, GitBisectFindsTheFirstBadCommit) {
  if (std::system("command -v git >/dev/null 2>&1") != 0) GTEST_SKIP() << "git is not installed";
  ASSERT_EQ(run_cli(dir_, make("--mode emulate", "good.h5")).status, 0);
  ASSERT_EQ(run_cli(dir_, make("--mode exact", "bad.h5")).status, 0);
  const fs::path repo = dir_ / "repo";
  fs::create_directories(repo);
  const std::string setup =
      "cd " + repo.string() +
      " && git init -q && git config user.email t@t && git config user.name t && echo 'cp " +
      dir_.string() + "/$(cat state).h5 " + dir_.string() +
      "/candidate.h5' > build.sh && for i in 1 2 3 4 5 6; do if [ $i -lt 4 ]; then echo good > "
      "state; else echo bad > state; fi; echo $i > n; git add -A; git commit -qm c$i; done";
  ASSERT_EQ(std::system(setup.c_str()), 0);
  const std::string policy = (fs::path(QPARITY_SOURCE_DIR) / "policies/bf16.json").string();
  const std::string cmd = "cd " + repo.string() + " && " + QPARITY_CLI +
                          " bisect --git HEAD~5 HEAD --policy " + policy + " " +
                          (dir_ / "good.h5").string() + " " + (dir_ / "candidate.h5").string() +
                          " -- sh build.sh > " + (dir_ / "bisect.txt").string() + " 2>&1";
  ASSERT_EQ(std::system(cmd.c_str()), 0) << slurp(dir_ / "bisect.txt");
  const std::string out = slurp(dir_ / "bisect.txt");
  EXPECT_THAT(out, HasSubstr("is the first bad commit"));
  EXPECT_THAT(out, HasSubstr("    c4"));
  EXPECT_THAT(out, HasSubstr("qparity bisect oracle: bad (first failing point"));
  // The repository is left as it was (bisect reset).
  const std::string head =
      "cd " + repo.string() + " && git log -1 --format=%s > " + (dir_ / "head.txt").string();
  ASSERT_EQ(std::system(head.c_str()), 0);
  EXPECT_EQ(slurp(dir_ / "head.txt"), "c6\n");
}

}  // namespace
}  // namespace qparity::test
