// ChatGLM2's checkpoint names seen under the canonical names (core/safetensors/chatglm_names.h)
// and written back (fixtures/producer_naming.h): the mapping both ways, the zero-copy row view of
// the fused query_key_value / dense_h_to_4h, shared one-value tensors, block rows, the
// description file, and the errors for what cannot be cut or named.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstring>
#include <filesystem>
#include <span>
#include <string>
#include <vector>

#include "core/error.h"
#include "core/safetensors/chatglm_names.h"
#include "core/safetensors/safetensors_writer.h"
#include "error_of.h"
#include "fixtures/fixture_model.h"
#include "fixtures/producer_naming.h"

namespace qparity {
namespace {

namespace fs = std::filesystem;
using test::error_of;

// heads 4, groups 2, head_dim 8 (q 32 rows, k and v 16 each), hidden 32, ffn 48, 2 layers.
ModelConfig glm() {
  return parse_model_config(Json::parse(R"({
    "architectures": ["ChatGLMModel"], "model_type": "chatglm", "num_layers": 2,
    "hidden_size": 32, "num_attention_heads": 4, "kv_channels": 8, "multi_query_attention": true,
    "multi_query_group_num": 2, "ffn_hidden_size": 48, "padded_vocab_size": 64,
    "add_qkv_bias": true, "torch_dtype": "float32"})"),
                            "glm config");
}

fs::path scratch(const std::string& name) {
  const fs::path p =
      fs::temp_directory_path() / ("qparity_glm_" + name + "_" + std::to_string(getpid()));
  fs::remove_all(p);
  fs::create_directories(p);
  return p;
}

std::vector<uint8_t> f32_rows(int64_t rows, int64_t cols, float base) {
  std::vector<uint8_t> b(static_cast<size_t>(rows * cols) * 4);
  for (int64_t i = 0; i < rows * cols; ++i) {
    const float v = base + static_cast<float>(i);
    std::memcpy(b.data() + i * 4, &v, 4);
  }
  return b;
}

float f32_at(std::span<const uint8_t> b, int64_t i) {
  float v;
  std::memcpy(&v, b.data() + i * 4, 4);
  return v;
}

TEST(ChatGlmNames, CanonicalNames) {
  const ModelConfig c = glm();
  const std::string l = "transformer.encoder.layers.1.";
  EXPECT_EQ(chatglm2_canonical_name("transformer.embedding.word_embeddings.weight", c).canonical,
            std::vector<std::string>{"model.embed_tokens.weight"});
  EXPECT_EQ(chatglm2_canonical_name("transformer.output_layer.weight", c).canonical,
            std::vector<std::string>{"lm_head.weight"});
  EXPECT_EQ(chatglm2_canonical_name("transformer.encoder.final_layernorm.weight", c).canonical,
            std::vector<std::string>{"model.norm.weight"});
  EXPECT_EQ(chatglm2_canonical_name(l + "input_layernorm.module.bias", c).canonical,
            std::vector<std::string>{"model.layers.1.input_layernorm.module.bias"});
  const ChatGlmName qkv =
      chatglm2_canonical_name(l + "self_attention.query_key_value.deq_scale", c);
  EXPECT_EQ(qkv.canonical, (std::vector<std::string>{"model.layers.1.self_attn.q_proj.deq_scale",
                                                     "model.layers.1.self_attn.k_proj.deq_scale",
                                                     "model.layers.1.self_attn.v_proj.deq_scale"}));
  EXPECT_EQ(qkv.part_rows, (std::vector<int64_t>{32, 16, 16}));
  EXPECT_EQ(chatglm2_canonical_name(l + "self_attention.query_key_value.v_proj.kv_cache_offset", c)
                .canonical,
            std::vector<std::string>{"model.layers.1.self_attn.v_proj.kv_cache_offset"});
  const ChatGlmName h4 = chatglm2_canonical_name(l + "mlp.dense_h_to_4h.weight", c);
  EXPECT_EQ(h4.canonical, (std::vector<std::string>{"model.layers.1.mlp.gate_proj.weight",
                                                    "model.layers.1.mlp.up_proj.weight"}));
  EXPECT_EQ(h4.part_rows, (std::vector<int64_t>{48, 48}));
  EXPECT_TRUE(chatglm2_canonical_name("transformer.rotary_pos_emb.inv_freq", c).canonical.empty());
  EXPECT_NE(error_of([&] {
              chatglm2_canonical_name("transformer.encoder.layers.2.mlp.x", c);
            }).find("names no layer of the model's 2"),
            std::string::npos);
  EXPECT_NE(error_of([&] {
              chatglm2_canonical_name("transformer.prefix_encoder.embedding", c);
            }).find("is not a ChatGLM2 tensor qparity knows"),
            std::string::npos);
}

TEST(ChatGlmNames, TargetNamesInvertCanonicalNames) {
  const ModelConfig c = glm();
  const std::vector<std::string> raw = {
      "transformer.embedding.word_embeddings.weight",
      "transformer.output_layer.weight",
      "transformer.encoder.final_layernorm.weight",
      "transformer.encoder.layers.0.input_layernorm.weight",
      "transformer.encoder.layers.0.post_attention_layernorm.module.weight",
      "transformer.encoder.layers.0.self_attention.query_key_value.weight",
      "transformer.encoder.layers.0.self_attention.query_key_value.input_scale",
      "transformer.encoder.layers.1.self_attention.query_key_value.k_proj.kv_cache_scale",
      "transformer.encoder.layers.1.self_attention.dense.weight_scale",
      "transformer.encoder.layers.1.mlp.dense_h_to_4h.quant_bias",
      "transformer.encoder.layers.1.mlp.dense_4h_to_h.weight"};
  for (const std::string& r : raw) {
    const ChatGlmName n = chatglm2_canonical_name(r, c);
    for (size_t i = 0; i < n.canonical.size(); ++i) {
      const ChatGlmTarget t = chatglm2_target_name(n.canonical[i], c);
      EXPECT_EQ(t.name, r) << n.canonical[i];
      EXPECT_EQ(t.part, static_cast<int64_t>(i));
      EXPECT_EQ(t.parts, n.canonical.size() == 1 ? 1 : static_cast<int64_t>(n.canonical.size()));
    }
  }
  EXPECT_THROW(chatglm2_target_name("model.layers.0.self_attn.q_norm.weight", c), Error);
}

TEST(ChatGlmNames, ViewCutsFusedTensorsWithoutCopying) {
  const ModelConfig c = glm();
  const fs::path d = scratch("view");
  const std::string l0 = "transformer.encoder.layers.0.";
  const auto w = f32_rows(64, 4, 0.0f), b = f32_rows(64, 1, 1000.0f), one = f32_rows(1, 1, 7.0f);
  const auto blk = f32_rows(8, 2, 50.0f), h4 = f32_rows(96, 2, 0.0f);
  write_safetensors(
      d / "model.safetensors",
      {{l0 + "self_attention.query_key_value.weight", DType::kF32, {64, 4}, w},
       {l0 + "self_attention.query_key_value.bias", DType::kF32, {64}, b},
       {l0 + "self_attention.query_key_value.input_scale", DType::kF32, {1}, one},
       {l0 + "self_attention.query_key_value.weight_scale_blocks", DType::kF32, {8, 2}, blk},
       {l0 + "mlp.dense_h_to_4h.weight", DType::kF32, {96, 2}, h4},
       {"transformer.rotary_pos_emb.inv_freq", DType::kF32, {1}, one}},
      std::nullopt);
  const Checkpoint v = open_model_checkpoint(d, c);
  const std::string a = "model.layers.0.self_attn.";
  ASSERT_TRUE(v.contains(a + "k_proj.weight"));
  EXPECT_FALSE(v.contains("transformer.rotary_pos_emb.inv_freq"));
  EXPECT_EQ(v.tensors().size(), 3u * 4u + 2u);
  const TensorRef& k = v.at(a + "k_proj.weight");
  EXPECT_EQ(k.info->shape, (std::vector<uint64_t>{16, 4}));
  EXPECT_EQ(f32_at(k.bytes(), 0), 32.0f * 4);  // row 32 of the fused tensor
  EXPECT_EQ(v.origin(a + "k_proj.weight"),
            l0 + "self_attention.query_key_value.weight rows [32, 48)");
  const TensorInfo* fused = k.file->find(l0 + "self_attention.query_key_value.weight");
  ASSERT_NE(fused, nullptr);
  EXPECT_EQ(k.bytes().data(), k.file->bytes(*fused).data() + 32 * 16)
      << "a view reads the fused tensor's own mapped bytes";
  EXPECT_EQ(f32_at(v.at(a + "v_proj.bias").bytes(), 0), 1048.0f);
  for (const char* p : {"q_proj", "k_proj", "v_proj"})
    EXPECT_EQ(f32_at(v.at(a + p + ".input_scale").bytes(), 0), 7.0f) << p;
  // 8 block rows of a 64-row output: 8 rows a block; q 4 blocks, k and v 2 each.
  EXPECT_EQ(v.at(a + "v_proj.weight_scale_blocks").info->shape[0], 2u);
  EXPECT_EQ(f32_at(v.at(a + "v_proj.weight_scale_blocks").bytes(), 0), 50.0f + 12);
  EXPECT_EQ(f32_at(v.at("model.layers.0.mlp.up_proj.weight").bytes(), 0), 96.0f);
  fs::remove_all(d);
}

TEST(ChatGlmNames, UncuttableTensorsAreErrors) {
  const ModelConfig c = glm();
  const fs::path d = scratch("uncut");
  const std::string n = "transformer.encoder.layers.0.self_attention.query_key_value.odd";
  write_safetensors(d / "model.safetensors", {{n, DType::kF32, {3, 2}, f32_rows(3, 2, 0.0f)}},
                    std::nullopt);
  const std::string e = error_of([&] { open_model_checkpoint(d, c); });
  EXPECT_NE(e.find(n), std::string::npos) << e;
  EXPECT_NE(e.find("cannot be cut into its fused parts: 3 rows for a fused output of 64"),
            std::string::npos)
      << e;
  fs::remove_all(d);
}

TEST(ChatGlmNames, DescriptionKeysBecomeCanonical) {
  const ModelConfig c = glm();
  const Json desc = chatglm2_canonical_description(
      Json{{"model_quant_type", "W8A8"},
           {"transformer.encoder.layers.0.self_attention.query_key_value.weight", "W8A8"},
           {"transformer.encoder.layers.0.self_attention.query_key_value.k_proj.kv_cache_scale",
            "C8"},
           {"transformer.rotary_pos_emb.inv_freq", "FLOAT"}},
      c, "desc.json");
  EXPECT_EQ(desc.at("model_quant_type"), "W8A8");
  for (const char* p : {"q_proj", "k_proj", "v_proj"})
    EXPECT_EQ(desc.at(std::string("model.layers.0.self_attn.") + p + ".weight"), "W8A8");
  EXPECT_EQ(desc.at("model.layers.0.self_attn.k_proj.kv_cache_scale"), "C8");
  EXPECT_EQ(desc.size(), 5u);
}

TEST(ProducerNaming, FusesPartsBackInOrder) {
  const ModelConfig c = glm();
  std::vector<fixtures::NamedTensor> got;
  fixtures::ProducerNaming naming(c, [&](fixtures::NamedTensor t) { got.push_back(std::move(t)); });
  const std::string a = "model.layers.0.self_attn.";
  auto part = [&](const char* p, const char* t, std::vector<uint64_t> shape, float base) {
    fixtures::NamedTensor n;
    n.name = a + p + "." + t;
    n.dtype = DType::kF32;
    n.shape = shape;
    n.owned = f32_rows(static_cast<int64_t>(shape[0]), shape.size() > 1 ? shape[1] : 1, base);
    n.type = "W8A8";
    return n;
  };
  naming.put(part("v_proj", "deq_scale", {16}, 300.0f));
  naming.put(part("q_proj", "deq_scale", {32}, 100.0f));
  EXPECT_TRUE(got.empty()) << "waits for every part";
  naming.put(part("k_proj", "deq_scale", {16}, 200.0f));
  ASSERT_EQ(got.size(), 1u);
  EXPECT_EQ(got[0].name, "transformer.encoder.layers.0.self_attention.query_key_value.deq_scale");
  EXPECT_EQ(got[0].shape, std::vector<uint64_t>{64});
  EXPECT_EQ(f32_at(got[0].owned, 0), 100.0f);
  EXPECT_EQ(f32_at(got[0].owned, 32), 200.0f);
  EXPECT_EQ(f32_at(got[0].owned, 48), 300.0f);
  // One value per fused module: written once when the parts agree, an Error when they do not.
  naming.put(part("q_proj", "input_scale", {1}, 5.0f));
  naming.put(part("k_proj", "input_scale", {1}, 5.0f));
  naming.put(part("v_proj", "input_scale", {1}, 5.0f));
  ASSERT_EQ(got.size(), 2u);
  EXPECT_EQ(got[1].shape, std::vector<uint64_t>{1});
  naming.put(part("q_proj", "input_offset", {1}, 5.0f));
  naming.put(part("k_proj", "input_offset", {1}, 6.0f));
  EXPECT_NE(error_of([&] {
              naming.put(part("v_proj", "input_offset", {1}, 5.0f));
            }).find("is one value for the fused module, but its parts"),
            std::string::npos);
  fixtures::ProducerNaming other(c, [](fixtures::NamedTensor) {});
  other.put(part("q_proj", "weight", {32, 2}, 0.0f));
  EXPECT_NE(error_of([&] { other.finish(); }).find("parts 1, 2 were never written"),
            std::string::npos);
}

TEST(ChatGlmNames, FixtureRoundTrip) {
  // The fixture is written under ChatGLM2's names and reads back under the canonical ones.
  const fs::path d = scratch("fixture");
  fixtures::write_fp_checkpoint({Arch::kChatGlm2, fixtures::FixtureSize::kTiny, 3}, d,
                                OverwritePolicy::kReplace);
  const ModelConfig c = load_model_config(d / "config.json");
  const Checkpoint raw = Checkpoint::open(d);
  EXPECT_TRUE(raw.contains("transformer.encoder.layers.0.self_attention.query_key_value.bias"));
  EXPECT_FALSE(raw.contains("model.embed_tokens.weight"));
  const Checkpoint v = open_model_checkpoint(d, c);
  EXPECT_TRUE(v.contains("model.layers.1.self_attn.v_proj.bias"));
  EXPECT_TRUE(v.contains("model.layers.1.mlp.up_proj.weight"));
  EXPECT_TRUE(v.contains("lm_head.weight"));
  fs::remove_all(d);
}

}  // namespace
}  // namespace qparity
