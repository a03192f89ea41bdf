// Image-text checkpoints (Qwen3VLForConditionalGeneration, Qwen3_5ForConditionalGeneration) run
// on text by the fp64 reference: their language model is read from under
// model.language_model.* with the config's text_config, the vision tower (model.visual.*) and
// Qwen3.5's mtp head are left unread. Each test wraps a text fixture the way transformers saves
// the image-text class (nested config, renamed tensors, a vision tower beside them) and checks
// the wrapped checkpoint computes the text fixture's numbers bit for bit: Qwen3.5's own text
// model, and for Qwen3-VL the Qwen3 fixture (its text decoder is Qwen3's blocks, and text-only
// M-RoPE positions are the 1-D ones). The quantizer writes the wrapper's names, copies the
// vision tower through and ignores it as llm-compressor's recipes do.
#include <gtest/gtest.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <map>
#include <set>

#include "../unit/error_of.h"
#include "../unit/test_seed.h"
#include "core/capture/capture_points.h"
#include "core/codecs/float_format.h"
#include "core/json_util.h"
#include "core/safetensors/chatglm_names.h"  // open_model_checkpoint
#include "core/safetensors/safetensors_file.h"
#include "core/safetensors/safetensors_writer.h"
#include "fixtures/checkpoint_quantizer.h"
#include "fixtures/fixture_model.h"
#include "reference_cpu/models/calibration.h"
#include "reference_cpu/models/model_loader.h"
#include "reference_cpu/models/qwen3_vl_vision.h"

namespace qparity::reference {
namespace {

namespace fs = std::filesystem;

// Stand-ins for the parts the text path must not read, at shapes of their own.
struct ExtraTensor {
  std::string name;
  std::vector<uint64_t> shape;
};

class ImageTextReference : public testing::Test {
 protected:
  static void SetUpTestSuite() {
    seed_ = test::test_seed();
    root_ = fs::temp_directory_path() / ("qparity_image_text_" + std::to_string(seed_));
    fs::create_directories(root_);
    for (const Arch a : {Arch::kQwen3, Arch::kQwen3_5}) {
      fixtures::FixtureSpec spec;
      spec.arch = a;
      spec.seed = seed_;
      fixtures::write_fp_checkpoint(spec, text_dir(a), OverwritePolicy::kRefuse);
    }
    fixtures::FixtureSpec vl;
    vl.arch = Arch::kQwen3Vl;
    vl.seed = seed_;
    fixtures::write_fp_checkpoint(vl, fixture_vl(), OverwritePolicy::kRefuse);
    wrap(text_dir(Arch::kQwen3), qwen3_vl(), "Qwen3VLForConditionalGeneration", "qwen3_vl",
         "qwen3_vl_text",
         {{"model.visual.patch_embed.proj.weight", {16, 3, 2, 4, 4}},
          {"model.visual.blocks.0.attn.qkv.weight", {48, 16}},
          {"model.visual.merger.linear_fc1.weight", {64, 64}}});
    wrap(text_dir(Arch::kQwen3_5), qwen3_5_vl(), "Qwen3_5ForConditionalGeneration", "qwen3_5",
         "qwen3_5_text",
         {{"model.visual.blocks.0.attn.qkv.weight", {48, 16}},
          {"mtp.fc.weight", {8, 16}},
          {"mtp.layers.0.mlp.down_proj.weight", {8, 8}}});
  }
  static void TearDownTestSuite() { fs::remove_all(root_); }

  static fs::path text_dir(Arch a) { return root_ / (a == Arch::kQwen3 ? "qwen3" : "qwen3_5"); }
  static fs::path qwen3_vl() { return root_ / "qwen3_vl"; }
  static fs::path fixture_vl() { return root_ / "fixture_qwen3_vl"; }
  static fs::path qwen3_5_vl() { return root_ / "qwen3_5_vl"; }

  // The text checkpoint as transformers saves the image-text class: config under text_config
  // (the tie kept at the top level only), model.* under model.language_model.*, lm_head and the
  // extra tensors beside them.
  static void wrap(const fs::path& text, const fs::path& out, const std::string& cls,
                   const std::string& model_type, const std::string& text_model_type,
                   const std::vector<ExtraTensor>& extra) {
    fs::create_directories(out);
    Json tc = read_json_file(text / "config.json");
    const Json tie = tc.at("tie_word_embeddings");
    tc.erase("architectures");
    tc.erase("tie_word_embeddings");
    tc["model_type"] = text_model_type;
    if (text_model_type == "qwen3_vl_text") {
      // Qwen3VLTextConfig's interleaved M-RoPE sections (the 2B / 8B models'), rope_theta inside.
      tc["rope_scaling"] = {{"rope_type", "default"},
                            {"mrope_interleaved", true},
                            {"mrope_section", {24, 20, 20}},
                            {"rope_theta", tc.at("rope_theta")}};
      tc.erase("rope_theta");
    }
    const Json cfg = {{"architectures", {cls}},
                      {"model_type", model_type},
                      {"text_config", tc},
                      {"tie_word_embeddings", tie},
                      {"image_token_id", 5},
                      {"vision_config", {{"depth", 1}, {"hidden_size", 16}, {"patch_size", 4}}}};
    std::ofstream(out / "config.json") << cfg.dump(2);

    const auto f = SafetensorsFile::open(text / "model.safetensors");
    std::vector<TensorToWrite> w;
    for (const auto& info : f.tensors()) {
      const std::string name = info.name.starts_with("model.")
                                   ? "model.language_model." + info.name.substr(6)
                                   : info.name;
      const auto b = f.bytes(info);
      w.push_back({name, info.dtype, info.shape, {b.begin(), b.end()}});
    }
    std::vector<std::vector<uint8_t>> storage;
    for (const ExtraTensor& e : extra) {
      uint64_t n = 1;
      for (uint64_t d : e.shape)
        n *= d;
      std::vector<uint8_t> bytes(2 * n);
      for (uint64_t i = 0; i < n; ++i) {
        const uint16_t v = codec::double_to_bf16(0.01 * static_cast<double>(i % 17) - 0.08);
        bytes[2 * i] = static_cast<uint8_t>(v & 0xff);
        bytes[2 * i + 1] = static_cast<uint8_t>(v >> 8);
      }
      storage.push_back(std::move(bytes));
    }
    for (size_t i = 0; i < extra.size(); ++i)
      w.push_back({extra[i].name, DType::kBF16, extra[i].shape, storage[i]});
    write_safetensors(out / "model.safetensors", std::move(w), std::nullopt,
                      OverwritePolicy::kRefuse);
  }

  static std::vector<int64_t> tokens(int64_t vocab) { return synthetic_tokens(9, vocab, seed_); }

  // Every catalog point of both checkpoints, bit for bit.
  static void expect_same_trace(const fs::path& a, const fs::path& b, PrecisionMode mode) {
    LoadOptions o;
    o.mode = mode;
    auto ma = load_model(a, o);
    auto mb = load_model(b, o);
    Trace ta, tb;
    ForwardHooks ha, hb;
    ha.trace = &ta;
    hb.trace = &tb;
    const auto t = tokens(ma->config().vocab);
    const Matrix la = ma->forward(t, ha);
    const Matrix lb = mb->forward(t, hb);
    EXPECT_EQ(la.data, lb.data) << a << " vs " << b << " (" << to_string(mode) << ")";
    const auto points = model_capture_points(ma->config());
    EXPECT_EQ(points, model_capture_points(mb->config()));
    for (const std::string& p : points) {
      ASSERT_TRUE(ta.find(p) && tb.find(p)) << p;
      EXPECT_EQ(ta.at(p).data, tb.at(p).data) << p;
    }
  }

  static fs::path quantized(const fs::path& fp, const std::string& scheme) {
    const fs::path out = root_ / (fp.filename().string() + "-" + scheme);
    if (fs::exists(out)) return out;
    const ModelConfig cfg = load_model_config(fp / "config.json");
    fixtures::quantize_checkpoint(
        fp, parse_scheme_id(scheme), Dialect::kIdeal, out,
        fixtures::calibrate_checkpoint(fp, synthetic_tokens(16, cfg.vocab, seed_)),
        OverwritePolicy::kRefuse, nullptr);
    return out;
  }

  static inline uint64_t seed_ = 0;
  static inline fs::path root_;
};

TEST_F(ImageTextReference, Qwen3VlTextDecoderComputesQwen3sNumbers) {
  auto m = load_model(qwen3_vl());
  EXPECT_TRUE(m->config().image_text);
  EXPECT_EQ(m->config().arch, Arch::kQwen3Vl);
  EXPECT_TRUE(m->config().tie_word_embeddings);  // from the top level
  for (const PrecisionMode mode : {PrecisionMode::kExact, PrecisionMode::kEmulate})
    expect_same_trace(text_dir(Arch::kQwen3), qwen3_vl(), mode);
}

TEST_F(ImageTextReference, Qwen3_5ConditionalGenerationComputesItsTextModel) {
  for (const PrecisionMode mode : {PrecisionMode::kExact, PrecisionMode::kEmulate})
    expect_same_trace(text_dir(Arch::kQwen3_5), qwen3_5_vl(), mode);
}

TEST_F(ImageTextReference, QuantizedWrapperKeepsItsNamesAndCopiesTheVisionTower) {
  for (const std::string scheme : {"w8a8-int8-dyn", "fp8-block"}) {
    const fs::path wrapped = quantized(qwen3_vl(), scheme);
    const fs::path plain = quantized(text_dir(Arch::kQwen3), scheme);
    // The same tensors as the text fixture's quantized checkpoint, under the wrapper's names,
    // and the vision tower byte for byte.
    const auto fw = SafetensorsFile::open(wrapped / "model.safetensors");
    const auto fp = SafetensorsFile::open(plain / "model.safetensors");
    const auto fin = SafetensorsFile::open(qwen3_vl() / "model.safetensors");
    std::set<std::string> expected;
    for (const auto& info : fp.tensors())
      expected.insert(info.name.starts_with("model.")
                          ? "model.language_model." + info.name.substr(6)
                          : info.name);
    for (const auto& info : fin.tensors())
      if (info.name.starts_with("model.visual.")) {
        expected.insert(info.name);
        const auto* out = fw.find(info.name);
        ASSERT_NE(out, nullptr) << scheme << " " << info.name;
        EXPECT_EQ(out->dtype, info.dtype) << info.name;
        const auto a = fw.bytes(*out);
        const auto b = fin.bytes(info);
        EXPECT_TRUE(std::equal(a.begin(), a.end(), b.begin(), b.end())) << info.name;
      }
    std::set<std::string> got;
    for (const auto& info : fw.tensors())
      got.insert(info.name);
    EXPECT_EQ(got, expected) << scheme;

    const Json cfg = read_json_file(wrapped / "config.json");
    EXPECT_EQ(cfg.at("architectures")[0], "Qwen3VLForConditionalGeneration");
    EXPECT_TRUE(cfg.contains("text_config"));
    const Json& ignore = cfg.at("quantization_config").at("ignore");
    EXPECT_NE(std::find(ignore.begin(), ignore.end(), "re:model.visual.*"), ignore.end())
        << ignore.dump();

    // Read back: no warning about the vision tower's ignore entry, the same plan and logits as
    // the text fixture's quantized checkpoint.
    auto mw = load_model(wrapped);
    auto mp = load_model(plain);
    for (const std::string& w : mw->plan().warnings())
      EXPECT_EQ(w.find("visual"), std::string::npos) << w;
    ASSERT_EQ(mw->plan().entries().size(), mp->plan().entries().size());
    for (size_t i = 0; i < mw->plan().entries().size(); ++i)
      EXPECT_EQ(mw->plan().entries()[i].quantized(), mp->plan().entries()[i].quantized());
    const auto t = tokens(mw->config().vocab);
    EXPECT_EQ(mw->forward(t).data, mp->forward(t).data) << scheme;
  }
}

TEST_F(ImageTextReference, HfNamedIgnoreEntriesReachTheLanguageModel) {
  // A compressed-tensors config as llm-compressor writes it for the wrapper: module names carry
  // model.language_model.
  const fs::path d = root_ / "ignore_by_hf_name";
  fs::create_directories(d);
  const fs::path q = quantized(qwen3_vl(), "fp8-block");
  for (const auto& e : fs::directory_iterator(q))
    fs::copy_file(e.path(), d / e.path().filename(), fs::copy_options::overwrite_existing);
  Json cfg = read_json_file(q / "config.json");
  cfg["quantization_config"]["ignore"].push_back("model.language_model.layers.0.mlp.down_proj");
  // The ignored module's weight must be a plain one: restore the fp checkpoint's for it.
  {
    const auto fq = SafetensorsFile::open(q / "model.safetensors");
    const auto fin = SafetensorsFile::open(qwen3_vl() / "model.safetensors");
    std::vector<TensorToWrite> w;
    const std::string down = "model.language_model.layers.0.mlp.down_proj.";
    for (const auto& info : fq.tensors()) {
      if (info.name.starts_with(down)) continue;
      const auto b = fq.bytes(info);
      w.push_back({info.name, info.dtype, info.shape, {b.begin(), b.end()}});
    }
    const auto* orig = fin.find(down + "weight");
    ASSERT_NE(orig, nullptr);
    const auto b = fin.bytes(*orig);
    w.push_back({orig->name, orig->dtype, orig->shape, {b.begin(), b.end()}});
    write_safetensors(d / "model.safetensors", std::move(w),
                      std::map<std::string, std::string>{{"format", "pt"}},
                      OverwritePolicy::kReplace);
  }
  std::ofstream(d / "config.json") << cfg.dump(2);
  auto m = load_model(d);
  bool seen = false;
  for (const auto& e : m->plan().entries())
    if (e.prefix == "model.layers.0.mlp.down_proj") {
      seen = true;
      EXPECT_FALSE(e.quantized());
    } else if (e.prefix == "model.layers.1.mlp.down_proj") {
      EXPECT_TRUE(e.quantized());
    }
  EXPECT_TRUE(seen);
}

TEST_F(ImageTextReference, RefusalsNameTheCheckpointAndTheRule) {
  // msModelSlim's layout is not written for image-text checkpoints.
  const std::string msm = test::error_of([&] {
    fixtures::quantize_checkpoint(qwen3_vl(), parse_scheme_id("w8a16-ch"), Dialect::kIdeal,
                                  root_ / "msm", fixtures::StatsProviders{},
                                  OverwritePolicy::kRefuse, nullptr);
  });
  EXPECT_NE(msm.find("image-text"), std::string::npos) << msm;
  // A language-model tensor held under both names.
  const fs::path d = root_ / "twice";
  fs::create_directories(d);
  fs::copy_file(qwen3_vl() / "config.json", d / "config.json");
  {
    const auto f = SafetensorsFile::open(qwen3_vl() / "model.safetensors");
    std::vector<TensorToWrite> w;
    for (const auto& info : f.tensors()) {
      const auto b = f.bytes(info);
      w.push_back({info.name, info.dtype, info.shape, {b.begin(), b.end()}});
      if (info.name == "model.language_model.norm.weight")
        w.push_back({"model.norm.weight", info.dtype, info.shape, {b.begin(), b.end()}});
    }
    write_safetensors(d / "model.safetensors", std::move(w), std::nullopt,
                      OverwritePolicy::kRefuse);
  }
  const std::string twice = test::error_of([&] { load_model(d); });
  EXPECT_NE(twice.find("model.norm.weight"), std::string::npos) << twice;
  EXPECT_NE(twice.find("twice"), std::string::npos) << twice;
  // The GPU engine's refusal is checked where it is built (it names the class).
}

TEST_F(ImageTextReference, MakeFixtureQwen3VlIsTheQwen3FixtureWithTransformersVisionTower) {
  fixtures::FixtureSpec spec;
  spec.arch = Arch::kQwen3Vl;
  spec.seed = seed_;
  const fs::path dir = fixture_vl();
  // On text, the Qwen3 fixture's numbers bit for bit (same sizes, seed and rope_theta).
  expect_same_trace(text_dir(Arch::kQwen3), dir, PrecisionMode::kExact);
  // The vision tower as transformers 5.17's Qwen3VLForConditionalGeneration.save_pretrained
  // writes it for this vision_config (depth 2, hidden 32, intermediate 64, patch 4, temporal 2,
  // merge 2, 16 positions, one deepstack tap; tools/peers/make_hf_image_text.py --manifest on the
  // device), the mergers' output at the text hidden size (128).
  const std::vector<std::pair<std::string, std::vector<uint64_t>>> expected = {
      {"blocks.0.attn.proj.bias", {32}},
      {"blocks.0.attn.proj.weight", {32, 32}},
      {"blocks.0.attn.qkv.bias", {96}},
      {"blocks.0.attn.qkv.weight", {96, 32}},
      {"blocks.0.mlp.linear_fc1.bias", {64}},
      {"blocks.0.mlp.linear_fc1.weight", {64, 32}},
      {"blocks.0.mlp.linear_fc2.bias", {32}},
      {"blocks.0.mlp.linear_fc2.weight", {32, 64}},
      {"blocks.0.norm1.bias", {32}},
      {"blocks.0.norm1.weight", {32}},
      {"blocks.0.norm2.bias", {32}},
      {"blocks.0.norm2.weight", {32}},
      {"blocks.1.attn.proj.bias", {32}},
      {"blocks.1.attn.proj.weight", {32, 32}},
      {"blocks.1.attn.qkv.bias", {96}},
      {"blocks.1.attn.qkv.weight", {96, 32}},
      {"blocks.1.mlp.linear_fc1.bias", {64}},
      {"blocks.1.mlp.linear_fc1.weight", {64, 32}},
      {"blocks.1.mlp.linear_fc2.bias", {32}},
      {"blocks.1.mlp.linear_fc2.weight", {32, 64}},
      {"blocks.1.norm1.bias", {32}},
      {"blocks.1.norm1.weight", {32}},
      {"blocks.1.norm2.bias", {32}},
      {"blocks.1.norm2.weight", {32}},
      {"deepstack_merger_list.0.linear_fc1.bias", {128}},
      {"deepstack_merger_list.0.linear_fc1.weight", {128, 128}},
      {"deepstack_merger_list.0.linear_fc2.bias", {128}},
      {"deepstack_merger_list.0.linear_fc2.weight", {128, 128}},
      {"deepstack_merger_list.0.norm.bias", {128}},
      {"deepstack_merger_list.0.norm.weight", {128}},
      {"merger.linear_fc1.bias", {128}},
      {"merger.linear_fc1.weight", {128, 128}},
      {"merger.linear_fc2.bias", {128}},
      {"merger.linear_fc2.weight", {128, 128}},
      {"merger.norm.bias", {32}},
      {"merger.norm.weight", {32}},
      {"patch_embed.proj.bias", {32}},
      {"patch_embed.proj.weight", {32, 3, 2, 4, 4}},
      {"pos_embed.weight", {16, 32}},
  };
  const auto f = SafetensorsFile::open(dir / "model.safetensors");
  std::vector<std::pair<std::string, std::vector<uint64_t>>> got;
  for (const auto& info : f.tensors())
    if (info.name.starts_with("model.visual.")) got.emplace_back(info.name.substr(13), info.shape);
  std::sort(got.begin(), got.end());
  EXPECT_EQ(got, expected);
  EXPECT_NE(f.find("model.language_model.layers.0.self_attn.q_proj.weight"), nullptr);
  EXPECT_EQ(f.find("model.layers.0.self_attn.q_proj.weight"), nullptr);

  // The small size: the mergers map 64 * 2 * 2 = 256 to the text hidden size 512 ([out, in]),
  // one deepstack merger per tap.
  spec.size = fixtures::FixtureSize::kSmall;
  const fs::path small = root_ / "fixture_qwen3_vl_small";
  fixtures::write_fp_checkpoint(spec, small, OverwritePolicy::kRefuse);
  const ModelConfig cfg = load_model_config(small / "config.json");
  EXPECT_TRUE(cfg.image_text);
  const Json vc = read_json_file(small / "config.json").at("vision_config");
  const auto taps = vc.at("deepstack_visual_indexes").size();
  EXPECT_EQ(taps, 2u);
  std::map<std::string, std::vector<uint64_t>> shapes;
  for (const auto& entry : fs::directory_iterator(small))
    if (entry.path().extension() == ".safetensors") {
      const auto shard = SafetensorsFile::open(entry.path());
      for (const auto& info : shard.tensors())
        shapes[info.name] = info.shape;
    }
  EXPECT_EQ(shapes.at("model.visual.merger.linear_fc2.weight"), (std::vector<uint64_t>{512, 256}));
  EXPECT_EQ(shapes.at("model.visual.deepstack_merger_list.1.norm.weight"),
            (std::vector<uint64_t>{256}));
  EXPECT_EQ(shapes.count("model.visual.deepstack_merger_list.2.norm.weight"), 0u);
  EXPECT_EQ(shapes.at("model.visual.patch_embed.proj.weight"),
            (std::vector<uint64_t>{64, 3, 2, 8, 8}));
}

class VisionTowerOnTheFixture : public ImageTextReference {
 protected:
  static Qwen3VlVisionTower tower() {
    const fs::path dir = fixture_vl();
    const Json raw = read_json_file(dir / "config.json");
    const ModelConfig cfg = parse_model_config(raw, "config.json");
    return Qwen3VlVisionTower(parse_vision_config(raw.at("vision_config"), "vision_config"),
                              open_model_checkpoint(dir, cfg));
  }
  static Matrix pixels(int64_t rows, int64_t cols, uint64_t salt) {
    Matrix m(rows, cols);
    for (int64_t i = 0; i < rows * cols; ++i) {
      const uint64_t h = (static_cast<uint64_t>(i) + 1) * 0x9E3779B97F4A7C15ull ^ (seed_ + salt);
      m.data[static_cast<size_t>(i)] = static_cast<double>(h % 2001) / 1000.0 - 1.0;
    }
    return m;
  }
  static Matrix rows_of(const Matrix& m, int64_t first, int64_t count) {
    Matrix out(count, m.cols);
    std::copy(m.data.begin() + first * m.cols, m.data.begin() + (first + count) * m.cols,
              out.data.begin());
    return out;
  }
};

TEST_F(VisionTowerOnTheFixture, ShapesPointsAndImagesIndependentOfTheirBatch) {
  const Qwen3VlVisionTower t = tower();
  const VisionConfig& c = t.config();
  const std::vector<GridThw> grids = {{1, 4, 4}, {1, 2, 6}, {2, 4, 4}};
  const Matrix px = pixels(16 + 12 + 32, c.patch_dim(), 1);
  Trace trace;
  const VisionOutput all = t.forward(px, grids, &trace);
  ASSERT_EQ(all.merged.rows, 15);
  EXPECT_EQ(all.merged.cols, c.out_hidden);
  ASSERT_EQ(all.deepstack.size(), 1u);
  EXPECT_EQ(all.deepstack[0].rows, 15);
  for (double v : all.merged.data)
    ASSERT_TRUE(std::isfinite(v));
  std::vector<std::string> names;
  for (const auto& [name, m] : trace.points())
    names.push_back(name);
  EXPECT_EQ(names,
            (std::vector<std::string>{"visual.embed", "visual.blocks.0.out", "visual.deepstack.0",
                                      "visual.blocks.1.out", "visual.merger"}));
  // Each image alone gives its rows of the batch bit for bit: attention stays within a frame,
  // positions within an image.
  int64_t row = 0, merged_row = 0;
  for (const GridThw& g : grids) {
    const int64_t n = g.t * g.h * g.w;
    const VisionOutput one = t.forward(rows_of(px, row, n), {&g, 1});
    EXPECT_EQ(one.merged.data, rows_of(all.merged, merged_row, n / 4).data);
    EXPECT_EQ(one.deepstack[0].data, rows_of(all.deepstack[0], merged_row, n / 4).data);
    row += n;
    merged_row += n / 4;
  }
}

TEST_F(VisionTowerOnTheFixture, AVideosFramesAttendWithinThemselves) {
  const Qwen3VlVisionTower t = tower();
  const int64_t frame = 4 * 4;
  const Matrix one = pixels(frame, t.config().patch_dim(), 2);
  Matrix two(2 * frame, one.cols);
  std::copy(one.data.begin(), one.data.end(), two.data.begin());
  std::copy(one.data.begin(), one.data.end(), two.data.begin() + frame * one.cols);
  const GridThw video{2, 4, 4};
  const VisionOutput v = t.forward(two, {&video, 1});
  EXPECT_EQ(rows_of(v.merged, 0, 4).data, rows_of(v.merged, 4, 4).data);
  const GridThw image{1, 4, 4};
  EXPECT_EQ(t.forward(one, {&image, 1}).merged.data, rows_of(v.merged, 0, 4).data);
}

TEST_F(VisionTowerOnTheFixture, BadInputIsNamed) {
  const Qwen3VlVisionTower t = tower();
  const GridThw g{1, 4, 4};
  const std::string width = test::error_of([&] {
    t.forward(pixels(16, t.config().patch_dim() - 1, 3), {&g, 1});
  });
  EXPECT_NE(width.find("pixel_values"), std::string::npos) << width;
  const GridThw odd{1, 3, 4};
  const std::string grid = test::error_of([&] {
    t.forward(pixels(12, t.config().patch_dim(), 3), {&odd, 1});
  });
  EXPECT_NE(grid.find("multiples of spatial_merge_size"), std::string::npos) << grid;
  Matrix nan = pixels(16, t.config().patch_dim(), 3);
  nan.data[5] = std::nan("");
  EXPECT_NE(test::error_of([&] { t.forward(nan, {&g, 1}); }).find("NaN"), std::string::npos);
}

}  // namespace
}  // namespace qparity::reference
