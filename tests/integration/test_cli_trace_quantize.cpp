// `qparity quantize` and `qparity trace` end to end: a fixture is quantized with statistics from
// calibration tokens, traced as one prefill and as token-by-token decode (equal to 1e-12), with
// capture-point selection, and bad input ends in one error line naming the problem.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>

#include "../unit/quant_test_util.h"
#include "../unit/test_seed.h"
#include "cli_runner.h"
#include "core/safetensors/safetensors_file.h"
#include "reference_cpu/tensor_decode.h"

namespace qparity {
namespace {

namespace fs = std::filesystem;
using reference::Matrix;
using ::testing::HasSubstr;

class CliTraceQuantize : public testing::Test {
 protected:
  void SetUp() override {
    seed_ = test::test_seed();
    dir_ = fs::temp_directory_path() / ("qparity_tq_" + std::to_string(seed_));
    fs::create_directories(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }
  test::CliRun run(const std::string& args) { return test::run_cli(dir_, args); }
  std::string p(const std::string& leaf) const { return (dir_ / leaf).string(); }

  uint64_t seed_ = 0;
  fs::path dir_;
};

TEST_F(CliTraceQuantize, QuantizeThenTracePrefillEqualsDecode) {
  const std::string s = std::to_string(seed_ % 1000);
  ASSERT_EQ(run("make-fixture --arch llama --seed " + s + " --out " + p("fp")).status, 0);
  std::ofstream(dir_ / "calib.txt") << "1, 2, 3, 4\n5 6 7 8 9 10 11 12\n";
  auto r = run("quantize --in " + p("fp") + " --scheme w8a8-static --calib " + p("calib.txt") +
               " --out " + p("q"));
  ASSERT_EQ(r.status, 0) << r.err;
  EXPECT_THAT(r.err, HasSubstr("calibrating on 12 tokens"));
  EXPECT_TRUE(fs::exists(dir_ / "q" / "quant_model_description.json"));
  ASSERT_EQ(run("trace --model " + p("q") + " --tokens 5,17,3,99,42,7 --out " + p("a.st")).status,
            0);
  r = run("trace --model " + p("q") +
          " --tokens 5,17,3,99,42,7 --decode --capture "
          "'logits,layers.*.residual' --out " +
          p("b.st"));
  ASSERT_EQ(r.status, 0) << r.err;
  const auto b = SafetensorsFile::open(dir_ / "b.st");
  EXPECT_TRUE(b.find("layers.1.residual"));
  EXPECT_FALSE(b.find("layers.0.attn.core")) << "--capture selects points";
  EXPECT_EQ(b.metadata().at("steps"), "decode");
  for (const char* point : {"logits", "layers.0.residual", "layers.1.residual"})
    EXPECT_LE(test::relative_l2(test::read_matrix(dir_ / "b.st", point),
                                test::read_matrix(dir_ / "a.st", point)),
              1e-12)
        << point;
}

TEST_F(CliTraceQuantize, BadInputEndsInOneLine) {
  ASSERT_EQ(run("make-fixture --arch qwen3 --seed 1 --out " + p("fp")).status, 0);
  auto r = run("trace --model " + p("fp") + " --tokens 1,100000 --out " + p("x.st"));
  EXPECT_EQ(r.status, 1);
  EXPECT_THAT(r.err, HasSubstr("token 100000 at position 1 is outside the vocabulary"));
  r = run("trace --model " + p("fp") + " --tokens 1,x --out " + p("x.st"));
  EXPECT_EQ(r.status, 1);
  EXPECT_THAT(r.err, HasSubstr("'x' is not a token id"));
  r = run("trace --model " + p("fp") + " --tokens 1 --synthetic 3 --out " + p("x.st"));
  EXPECT_EQ(r.status, 1);
  EXPECT_THAT(r.err, HasSubstr("exactly one of"));
  r = run("trace --model " + p("fp") + " --tokens 1 --mode fast --out " + p("x.st"));
  EXPECT_EQ(r.status, 1);
  EXPECT_THAT(r.err, HasSubstr("unknown precision mode 'fast'"));
  std::ofstream(dir_ / "bad.txt") << "1 2 -3\n";
  r = run("quantize --in " + p("fp") + " --scheme fp8-tensor --calib " + p("bad.txt") + " --out " +
          p("q"));
  EXPECT_EQ(r.status, 1);
  EXPECT_THAT(r.err, HasSubstr("'-3' is not a token id"));
  r = run("quantize --in " + p("nowhere") + " --scheme fp8-tensor --out " + p("q"));
  EXPECT_EQ(r.status, 1);
  EXPECT_THAT(r.err, HasSubstr("nowhere"));
}

}  // namespace
}  // namespace qparity
