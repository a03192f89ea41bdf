// Tensor-parallel sharding rules (core/parallel/tp_sharding.h) on CPU-side shapes: TP=1 holds
// everything; TP=2 splits column tensors by rows and row tensors by columns so that the ranks'
// slices tile the tensor exactly once, replicates KV heads when tp > num_kv_heads, pads the
// vocabulary, and refuses shapes that do not divide.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "core/parallel/tp_sharding.h"
#include "error_of.h"

namespace qparity {
namespace {

using ::testing::HasSubstr;

ModelConfig llama_like(int64_t kv_heads) {
  ModelConfig c;
  c.hidden = 512;
  c.num_heads = 8;
  c.num_kv_heads = kv_heads;
  c.head_dim = 64;
  c.intermediate = 1024;
  c.vocab = 1001;
  return c;
}

struct Case {
  std::string name;
  std::vector<uint64_t> shape;
  ShardKind kind;
};

TEST(TpSharding, Tp1HoldsEveryTensorWhole) {
  const ModelConfig c = llama_like(4);
  for (const auto& [name, shape] : std::vector<std::pair<std::string, std::vector<uint64_t>>>{
           {"model.layers.0.self_attn.q_proj.weight", {512, 512}},
           {"model.layers.0.self_attn.o_proj.weight", {512, 512}},
           {"model.layers.0.mlp.down_proj.weight", {512, 1024}},
           {"model.embed_tokens.weight", {1001, 512}}}) {
    const TensorShard s = tensor_shard(c, name, shape, 0, 1);
    const int64_t n = static_cast<int64_t>(shape[static_cast<size_t>(s.dim)]);
    EXPECT_EQ(s.begin, 0) << name;
    EXPECT_EQ(s.end, n) << name;
  }
}

TEST(TpSharding, Tp2SlicesTileEachTensorOnce) {
  const ModelConfig c = llama_like(4);
  const std::vector<Case> cases = {
      {"model.layers.1.self_attn.q_proj.weight", {512, 512}, ShardKind::kColumn},
      {"model.layers.1.self_attn.k_proj.weight", {256, 512}, ShardKind::kColumn},
      {"model.layers.1.self_attn.v_proj.weight", {256, 512}, ShardKind::kColumn},
      {"model.layers.1.self_attn.o_proj.weight", {512, 512}, ShardKind::kRow},
      {"model.layers.1.mlp.gate_proj.weight", {1024, 512}, ShardKind::kColumn},
      {"model.layers.1.mlp.up_proj.weight", {1024, 512}, ShardKind::kColumn},
      {"model.layers.1.mlp.down_proj.weight", {512, 1024}, ShardKind::kRow},
      {"model.layers.1.mlp.experts.3.gate_proj.weight", {256, 512}, ShardKind::kColumn},
      {"model.layers.1.mlp.experts.3.down_proj.weight", {512, 256}, ShardKind::kRow}};
  for (const Case& k : cases) {
    const TensorShard a = tensor_shard(c, k.name, k.shape, 0, 2);
    const TensorShard b = tensor_shard(c, k.name, k.shape, 1, 2);
    EXPECT_EQ(a.kind, k.kind) << k.name;
    EXPECT_EQ(a.dim, k.kind == ShardKind::kRow ? 1 : 0) << k.name;
    const int64_t n = static_cast<int64_t>(k.shape[static_cast<size_t>(a.dim)]);
    EXPECT_EQ(a.begin, 0) << k.name;
    EXPECT_EQ(a.end, b.begin) << k.name;
    EXPECT_EQ(b.end, n) << k.name;
    EXPECT_EQ(a.end - a.begin, n / 2) << k.name;
  }
  for (const char* name :
       {"model.layers.1.input_layernorm.weight", "model.norm.weight",
        "model.layers.1.self_attn.q_norm.weight", "model.layers.1.mlp.gate.weight"}) {
    const TensorShard s = tensor_shard(c, name, {512}, 1, 2);
    EXPECT_EQ(s.kind, ShardKind::kReplicated) << name;
    EXPECT_EQ(s.end - s.begin, 512) << name;
  }
}

TEST(TpSharding, KvHeadsReplicateWhenTpExceedsThem) {
  const ModelConfig c = llama_like(1);
  for (int rank = 0; rank < 2; ++rank) {
    const TensorShard s =
        tensor_shard(c, "model.layers.0.self_attn.k_proj.weight", {64, 512}, rank, 2);
    EXPECT_EQ(s.begin, 0);
    EXPECT_EQ(s.end, 64);  // both ranks hold the one KV head
  }
  const ModelConfig three = llama_like(3);
  EXPECT_THAT(test::error_of([&] {
                tensor_shard(three, "model.layers.0.self_attn.k_proj.weight", {192, 512}, 0, 2);
              }),
              HasSubstr("num_kv_heads 3 does not divide by tp 2"));
}

TEST(TpSharding, VocabIsPaddedAndSplit) {
  const ModelConfig c = llama_like(4);
  EXPECT_EQ(padded_vocab(1001, 2), 1024);
  EXPECT_EQ(padded_vocab(1024, 2), 1024);
  const TensorShard a = tensor_shard(c, "model.embed_tokens.weight", {1001, 512}, 0, 2);
  const TensorShard b = tensor_shard(c, "lm_head.weight", {1001, 512}, 1, 2);
  EXPECT_EQ(a.kind, ShardKind::kVocab);
  EXPECT_EQ(a.begin, 0);
  EXPECT_EQ(a.end, 512);
  EXPECT_EQ(b.begin, 512);
  EXPECT_EQ(b.end, 1001);
  EXPECT_EQ(b.padded, 512);  // 23 padding rows on rank 1
}

TEST(TpSharding, RefusesWhatDoesNotDivide) {
  ModelConfig c = llama_like(4);
  c.num_heads = 6;
  EXPECT_THAT(test::error_of([&] {
                tensor_shard(c, "model.layers.0.self_attn.q_proj.weight", {384, 512}, 0, 4);
              }),
              HasSubstr("num_heads 6 does not divide by tp 4"));
  EXPECT_THAT(test::error_of([&] {
                tensor_shard(c, "model.layers.0.mlp.gate_proj.weight", {1000, 512}, 0, 3);
              }),
              HasSubstr("intermediate rows 1000 does not divide by tp 3"));
  EXPECT_THAT(test::error_of([&] {
                tensor_shard(c, "model.layers.0.mlp.gate_proj.weight", {8, 8}, 2, 2);
              }),
              HasSubstr("rank 2 of tp 2"));
  EXPECT_THAT(test::error_of([&] {
                tensor_shard(c, "model.layers.0.odd.weight", {8, 8}, 0, 2);
              }),
              HasSubstr("no tensor-parallel rule"));
}

}  // namespace
}  // namespace qparity
