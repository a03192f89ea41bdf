// Goldens of image prompts (Qwen3-VL): the images group round-trips and its rules are enforced,
// the golden run computes what forward_image_prompt computes (the same bits, sequence by
// sequence), and bisect's layer re-run takes the golden's images (its rotary rows and deepstack
// features): on the golden's own inputs it reproduces the golden exactly, while the same points
// re-run as text do not.
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>

#include "../unit/error_of.h"
#include "../unit/test_seed.h"
#include "fixtures/fixture_model.h"
#include "golden/golden_file.h"
#include "golden/layer_rerun.h"
#include "golden/reference_run.h"
#include "reference_cpu/models/image_input.h"
#include "reference_cpu/models/model_loader.h"

namespace qparity::golden {
namespace {

namespace fs = std::filesystem;
using test::error_of;

class GoldenImagesTest : public testing::Test {
 protected:
  static void SetUpTestSuite() {
    seed_ = test::test_seed();
    root_ = fs::temp_directory_path() / ("qparity_golden_images_" + std::to_string(seed_));
    fs::create_directories(root_);
    fixtures::FixtureSpec vl;
    vl.arch = Arch::kQwen3Vl;
    vl.seed = seed_;
    fixtures::write_fp_checkpoint(vl, root_ / "vl", OverwritePolicy::kRefuse);
  }
  static void TearDownTestSuite() { fs::remove_all(root_); }

  // Two sequences of 20 tokens: the first with a 4 x 4 image (4 placeholders), the second with
  // a 4 x 6 one (6); the tiny fixture's image 510, vision_start 508, vision_end 509.
  static TokenInputs inputs() {
    TokenInputs in;
    in.sequences = 2;
    in.seq_len = 20;
    in.tokens = {3,   14, 508, 510, 510, 510, 510, 509, 92,  7,   8,   9,   10,  11,
                 12,  13, 14,  15,  16,  17,  5,   508, 510, 510, 510, 510, 510, 510,
                 509, 20, 21,  22,  23,  24,  25,  26,  27,  28,  29,  30};
    in.description = "test";
    in.pixels.grids = {{1, 4, 4}, {1, 4, 6}};
    in.pixels.pixels = Matrix(40, 96);
    for (size_t i = 0; i < in.pixels.pixels.data.size(); ++i)
      in.pixels.pixels.data[i] =
          std::sin(0.29 * static_cast<double>(i) + static_cast<double>(seed_ % 11));
    return in;
  }
  static Golden golden(reference::PrecisionMode mode = reference::PrecisionMode::kExact) {
    ReferenceRunOptions o;
    o.mode = mode;
    return run_reference(root_ / "vl", inputs(), o, nullptr);
  }

  static inline uint64_t seed_ = 0;
  static inline fs::path root_;
};

TEST_F(GoldenImagesTest, TheGoldenRunIsForwardImagePromptPerSequence) {
  const Golden g = golden();
  ASSERT_EQ(g.images.images(), 2);
  EXPECT_EQ(g.images.sequence, (std::vector<int64_t>{0, 1}));
  EXPECT_EQ(g.images.embeds.rows, 10);
  ASSERT_EQ(g.images.deepstack.size(), 1u);
  auto model = reference::load_model(root_ / "vl");
  const TokenInputs in = inputs();
  for (int64_t s = 0; s < 2; ++s) {
    model->reset_cache();
    const std::span<const int64_t> tokens(in.tokens.data() + s * 20, 20);
    Trace trace("layers.0.residual");
    reference::ForwardHooks hooks;
    hooks.trace = &trace;
    const Matrix logits =
        model->forward_image_prompt(tokens, sequence_image_features(g.images, s), hooks);
    EXPECT_TRUE(std::equal(logits.data.begin(), logits.data.end(),
                           g.logits.data.begin() + s * 20 * g.logits.cols))
        << "sequence " << s;
    const auto it = std::find_if(g.points.begin(), g.points.end(), [](const CapturePoint& p) {
      return p.name == "layers.0.residual";
    });
    ASSERT_NE(it, g.points.end());
    const auto& r = trace.at("layers.0.residual").data;
    EXPECT_TRUE(std::equal(r.begin(), r.end(), it->values.data.begin() + s * 20 * it->values.cols));
  }
}

TEST_F(GoldenImagesTest, ImagesRoundTripAndTheirRulesAreEnforced) {
  const Golden g = golden(reference::PrecisionMode::kEmulate);
  const fs::path f = root_ / "g.h5";
  write_golden(f, g, OverwritePolicy::kReplace);
  const GoldenReader r = GoldenReader::open(f);
  ASSERT_TRUE(r.has_images());
  const GoldenImages im = r.images();
  EXPECT_EQ(im.grid_thw, g.images.grid_thw);
  EXPECT_EQ(im.sequence, g.images.sequence);
  EXPECT_EQ(im.merge, 2);
  EXPECT_EQ(im.pixels.data, g.images.pixels.data);
  EXPECT_EQ(im.embeds.data, g.images.embeds.data);
  EXPECT_EQ(im.deepstack[0].data, g.images.deepstack[0].data);
  Golden bad = g;
  bad.images.sequence = {1, 0};
  EXPECT_NE(error_of([&] {
              write_golden(root_ / "bad.h5", bad, OverwritePolicy::kReplace);
            }).find("images/sequence: entry 1 = 0"),
            std::string::npos);
  bad = g;
  bad.images.embeds.rows -= 1;
  bad.images.embeds.data.resize(
      static_cast<size_t>(bad.images.embeds.rows * bad.images.embeds.cols));
  EXPECT_NE(error_of([&] {
              write_golden(root_ / "bad.h5", bad, OverwritePolicy::kReplace);
            }).find("images/embeds: [9, 128]: the grids need 10 rows"),
            std::string::npos);
  bad = g;
  bad.images.deepstack[0].data[7] = std::nan("");
  EXPECT_NE(error_of([&] {
              write_golden(root_ / "bad.h5", bad, OverwritePolicy::kReplace);
            }).find("images/deepstack.0: not finite at row 0"),
            std::string::npos);
  EXPECT_FALSE(fs::exists(root_ / "bad.h5"));
}

TEST_F(GoldenImagesTest, PlaceholderRunsAndImagesMustAgree) {
  TokenInputs in = inputs();
  in.pixels.grids.pop_back();
  in.pixels.pixels.rows = 16;
  in.pixels.pixels.data.resize(16 * 96);
  EXPECT_NE(error_of([&] {
              run_reference(root_ / "vl", in, {}, nullptr);
            }).find("sequence 1's image placeholder run 0 has no image left (1 given)"),
            std::string::npos);
  in = inputs();
  std::swap(in.pixels.grids[0], in.pixels.grids[1]);
  EXPECT_NE(error_of([&] {
              run_reference(root_ / "vl", in, {}, nullptr);
            }).find("sequence 0: token 3: image 0's placeholder run is 4 tokens, not the 6"),
            std::string::npos);
}

TEST_F(GoldenImagesTest, LayerRerunTakesTheGoldensImages) {
  const fs::path f = root_ / "rerun.h5";
  write_golden(f, golden(), OverwritePolicy::kReplace);
  auto model = reference::load_model(root_ / "vl");
  const GoldenReader r = GoldenReader::open(f);
  // Layer 0 (attention at the image positions' rotary rows, deepstack after it) and layer 1
  // (rotary rows only) reproduce the golden bit for bit on its own inputs.
  for (const char* point : {"layers.0.attn.rope_q", "layers.0.residual", "layers.1.residual"}) {
    const LayerRerun lr = rerun_layer_point(*model, r, point, nullptr);
    ASSERT_TRUE(lr.available) << point << ": " << lr.why_not;
    EXPECT_EQ(lr.stats.rel_l2, 0.0) << point;
  }
  // The same golden without its images group: re-run as text, the layers differ.
  Golden text = r.read_all();
  text.images = GoldenImages{};
  const fs::path tf = root_ / "as-text.h5";
  write_golden(tf, text, OverwritePolicy::kReplace);
  const GoldenReader tr = GoldenReader::open(tf);
  for (const char* point : {"layers.0.residual", "layers.1.attn.rope_q"}) {
    const LayerRerun lr = rerun_layer_point(*model, tr, point, nullptr);
    ASSERT_TRUE(lr.available) << point;
    EXPECT_GT(lr.stats.rel_l2, 1e-6) << point;
  }
}

}  // namespace
}  // namespace qparity::golden
