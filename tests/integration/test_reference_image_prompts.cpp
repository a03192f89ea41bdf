// Image prompts in the fp64 reference (CausalLm::forward_image_prompt) on the qwen3-vl fixture:
// the placeholders take the vision tower's embeddings, deepstack features join the image rows
// after their layer (and only there), decode continues at the prompt's mrope_position_delta (a
// prefill of prompt + text equals the prompt's prefill and one decode step per text token, bit
// for bit), a prompt without images is the text forward, and bad input is named. The numbers
// themselves are checked against transformers' Qwen3VLForConditionalGeneration in float64 on the
// device (tools/device/run.sh images).
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>

#include "../unit/error_of.h"
#include "../unit/test_seed.h"
#include "core/capture/capture_points.h"
#include "core/json_util.h"
#include "fixtures/fixture_model.h"
#include "reference_cpu/models/image_input.h"
#include "reference_cpu/models/model_loader.h"

namespace qparity::reference {
namespace {

namespace fs = std::filesystem;
using test::error_of;

class ImagePrompts : public testing::Test {
 protected:
  static void SetUpTestSuite() {
    seed_ = test::test_seed();
    root_ = fs::temp_directory_path() / ("qparity_image_prompts_" + std::to_string(seed_));
    fs::create_directories(root_);
    fixtures::FixtureSpec vl;
    vl.arch = Arch::kQwen3Vl;
    vl.seed = seed_;
    fixtures::write_fp_checkpoint(vl, root_ / "vl", OverwritePolicy::kRefuse);
    fixtures::FixtureSpec q3;
    q3.arch = Arch::kQwen3;
    q3.seed = seed_;
    fixtures::write_fp_checkpoint(q3, root_ / "qwen3", OverwritePolicy::kRefuse);
  }
  static void TearDownTestSuite() { fs::remove_all(root_); }

  static std::unique_ptr<CausalLm> model(PrecisionMode mode = PrecisionMode::kExact) {
    LoadOptions o;
    o.mode = mode;
    return load_model(root_ / "vl", o);
  }
  // Two images (a 4 x 4 and a 4 x 6 patch grid: 4 and 6 placeholders) between text, each opened
  // by vision_start and closed by vision_end, and `tail` text tokens after them.
  static std::vector<int64_t> prompt(const ModelConfig& c, int tail = 3) {
    const int64_t img = c.image_token_id, start = c.vision_start_token_id, end = start + 1;
    std::vector<int64_t> t = {3, 14, 15, start, img, img, img, img, end, 92, 65, start};
    t.insert(t.end(), 6, img);
    t.push_back(end);
    for (int i = 0; i < tail; ++i)
      t.push_back(35 + 8 * i);
    return t;
  }
  static ImageFeatures features(const CausalLm& m) {
    const Qwen3VlVisionTower tower = load_vision_tower((root_ / "vl").string(), m.config());
    PixelInput in;
    in.grids = {{1, 4, 4}, {1, 4, 6}};
    in.pixels = Matrix(16 + 24, tower.config().patch_dim());
    for (size_t i = 0; i < in.pixels.data.size(); ++i)
      in.pixels.data[i] = std::sin(0.37 * static_cast<double>(i) + static_cast<double>(seed_ % 7));
    return image_features(tower, in);
  }
  static std::vector<double> row(const Matrix& m, int64_t r) {
    return {m.data.begin() + r * m.cols, m.data.begin() + (r + 1) * m.cols};
  }

  static inline uint64_t seed_ = 0;
  static inline fs::path root_;
};

TEST_F(ImagePrompts, DecodeContinuesAtThePromptsDelta) {
  for (const PrecisionMode mode : {PrecisionMode::kExact, PrecisionMode::kEmulate}) {
    auto whole = model(mode), stepped = model(mode);
    const ImageFeatures f = features(*whole);
    const std::vector<int64_t> tokens = prompt(whole->config(), 4);
    const Matrix all = whole->forward_image_prompt(tokens, f);
    const size_t n = tokens.size() - 4;
    stepped->forward_image_prompt(std::span(tokens).first(n), f);
    // Text 0..3 (with vision_start), the 2 x 2 merged grid at 4..5, text 6..9, the 2 x 3 grid
    // at 10..12, vision_end at 13: the prompt's 19 tokens end at position 13, delta = 14 - 19.
    EXPECT_EQ(stepped->mrope_delta(), 14 - static_cast<int64_t>(n));
    for (size_t i = n; i < tokens.size(); ++i) {
      const Matrix step = stepped->forward(std::span(tokens).subspan(i, 1));
      EXPECT_EQ(step.data, row(all, static_cast<int64_t>(i))) << to_string(mode) << " token " << i;
    }
    stepped->reset_cache();
    EXPECT_EQ(stepped->mrope_delta(), 0);
  }
}

TEST_F(ImagePrompts, PlaceholdersTakeTheImageEmbeddings) {
  auto m = model();
  const ImageFeatures f = features(*m);
  const std::vector<int64_t> tokens = prompt(m->config());
  Trace trace("embed");
  ForwardHooks hooks;
  hooks.trace = &trace;
  m->forward_image_prompt(tokens, f, hooks);
  const Matrix& embed = trace.points().at(0).second;
  const Matrix text = m->embed_tokens(tokens);
  int64_t image = 0;
  for (size_t t = 0; t < tokens.size(); ++t) {
    const auto r = static_cast<int64_t>(t);
    if (tokens[t] == m->config().image_token_id)
      EXPECT_EQ(row(embed, r), row(f.embeds, image++)) << t;
    else
      EXPECT_EQ(row(embed, r), row(text, r)) << t;
  }
  EXPECT_EQ(image, f.embeds.rows);
}

TEST_F(ImagePrompts, DeepstackJoinsTheImageRowsAfterItsLayerOnly) {
  auto m = model();
  const ImageFeatures f = features(*m);
  ASSERT_EQ(f.deepstack.size(), 1u);  // the tiny fixture taps one block
  ImageFeatures none = f;
  for (Matrix& d : none.deepstack)
    std::fill(d.data.begin(), d.data.end(), 0.0);
  const std::vector<int64_t> tokens = prompt(m->config());
  auto traced = [&](const ImageFeatures& feats) {
    Trace trace("layers.0.attn.out,layers.0.mlp.out,layers.0.residual,layers.1.attn.out");
    ForwardHooks hooks;
    hooks.trace = &trace;
    m->reset_cache();
    m->forward_image_prompt(tokens, feats, hooks);
    std::map<std::string, Matrix> points(trace.points().begin(), trace.points().end());
    return points;
  };
  auto with = traced(f), without = traced(none);
  EXPECT_EQ(with.at("layers.0.attn.out").data, without.at("layers.0.attn.out").data);
  EXPECT_EQ(with.at("layers.0.mlp.out").data, without.at("layers.0.mlp.out").data);
  const Matrix& a = with.at("layers.0.residual");
  const Matrix& b = without.at("layers.0.residual");
  int64_t image = 0;
  for (size_t t = 0; t < tokens.size(); ++t) {
    const auto r = static_cast<int64_t>(t);
    if (tokens[t] != m->config().image_token_id) {
      EXPECT_EQ(row(a, r), row(b, r)) << t;
      continue;
    }
    for (int64_t c = 0; c < a.cols; ++c)  // (x + d) − x = d up to the sum's rounding
      EXPECT_NEAR(a(r, c) - b(r, c), f.deepstack[0](image, c), 1e-15 * std::abs(a(r, c)) + 1e-300)
          << t << ", " << c;
    ++image;
  }
  EXPECT_NE(with.at("layers.1.attn.out").data, without.at("layers.1.attn.out").data);
}

TEST_F(ImagePrompts, APromptWithoutImagesIsTheTextForward) {
  auto a = model(), b = model();
  const std::vector<int64_t> tokens = {5, 6, 7, 8, 9, 10, 11};
  ImageFeatures none;
  none.merge = 2;
  none.embeds = Matrix(0, a->config().hidden);
  EXPECT_EQ(a->forward_image_prompt(tokens, none).data, b->forward(tokens).data);
  EXPECT_EQ(a->mrope_delta(), 0);
}

TEST_F(ImagePrompts, BadInputIsNamed) {
  auto m = model();
  const ImageFeatures f = features(*m);
  const std::vector<int64_t> tokens = prompt(m->config());
  ImageFeatures fewer = f;
  fewer.embeds.rows -= 1;
  fewer.embeds.data.resize(static_cast<size_t>(fewer.embeds.rows * fewer.embeds.cols));
  EXPECT_NE(error_of([&] {
              m->forward_image_prompt(tokens, fewer);
            }).find("image embeddings: [9, 128] for a prompt of 10 image placeholders"),
            std::string::npos);
  std::vector<int64_t> no_start = tokens;
  no_start[3] = 2;
  EXPECT_NE(error_of([&] {
              m->forward_image_prompt(no_start, f);
            }).find("must directly follow the vision_start token"),
            std::string::npos);
  ImageFeatures video = f;
  video.grids[0].t = 2;
  EXPECT_NE(error_of([&] {
              m->forward_image_prompt(tokens, video);
            }).find("videos (timestamped frames) are not implemented"),
            std::string::npos);
  ImageFeatures nan = f;
  nan.deepstack[0].data[3] = std::nan("");
  EXPECT_NE(error_of([&] {
              m->forward_image_prompt(tokens, nan);
            }).find("deepstack feature 0: NaN or Inf"),
            std::string::npos);
  ImageFeatures deep = f;
  deep.deepstack.resize(3, f.deepstack[0]);
  EXPECT_NE(error_of([&] {
              m->forward_image_prompt(tokens, deep);
            }).find("3 deepstack features for a decoder of 2 layers"),
            std::string::npos);
  m->forward(std::span(tokens).first(2));
  EXPECT_NE(error_of([&] { m->forward_image_prompt(tokens, f); }).find("2 tokens are cached"),
            std::string::npos);
  auto text_only = load_model(root_ / "qwen3");
  EXPECT_NE(error_of([&] {
              text_only->forward_image_prompt(tokens, f);
            }).find("Qwen3ForCausalLM takes no images"),
            std::string::npos);
}

}  // namespace
}  // namespace qparity::reference
