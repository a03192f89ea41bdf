// Tensor-parallel sharding of quantized tensors (schemes/parallel/quant_sharding.h) on CPU shapes,
// for TP = 1, 2, 4, 8: every tensor every weight scheme stores (as `qparity schemes` lists them) on
// column- and row-parallel linears. Each rank's slice must cover exactly the weight rows /
// columns of that rank's weight shard (so scales, offsets and packed words travel with their
// codes), the ranks' slices must tile the tensor once, per-channel terms on a row-parallel layer
// stay whole except quant_bias / bias (rank 0 alone), per-tensor scalars stay whole everywhere;
// a group, fp8 block or packed word that straddles a rank boundary is refused naming the tensor.
// And the point of it: a group-quantized row-parallel layer dequantized rank by rank from its
// slices reassembles TP = 1's weight exactly.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cmath>
#include <map>
#include <optional>

#include "core/parallel/tp_sharding.h"
#include "error_of.h"
#include "schemes/parallel/quant_sharding.h"

namespace qparity {
namespace {

using ::testing::AllOf;
using ::testing::HasSubstr;

ModelConfig model(int64_t kv_heads) {
  ModelConfig c;
  c.hidden = 1024;
  c.num_heads = 8;
  c.num_kv_heads = kv_heads;
  c.head_dim = 128;
  c.intermediate = 2048;
  c.vocab = 1000;
  return c;
}

// The stored extent of a registry axis token for a weight [n, k] (the test's own reading of the
// table: N, Hkv*D, K, K/<c>, K/G, ceil(N/B), ceil(K/B), constants).
std::optional<uint64_t> extent(std::string t, int64_t n, int64_t k, int64_t g) {
  while (!t.empty() && t.front() == ' ')
    t.erase(t.begin());
  const auto div = [](int64_t a, int64_t b) { return static_cast<uint64_t>((a + b - 1) / b); };
  if (t == "N" || t == "Hkv*D") return static_cast<uint64_t>(n);
  if (t == "K") return static_cast<uint64_t>(k);
  if (t == "K/G") return div(k, g);
  if (t.starts_with("K/")) return div(k, std::stoll(t.substr(2)));
  if (t == "ceil(N/128)") return div(n, 128);
  if (t == "ceil(K/128)") return div(k, 128);
  if (t.find_first_not_of("0123456789") == std::string::npos) return std::stoull(t);
  return std::nullopt;
}

std::optional<std::vector<uint64_t>> stored_shape(const std::string& spec, int64_t n, int64_t k,
                                                  int64_t g) {
  std::vector<uint64_t> s;
  std::string body = spec.substr(1, spec.size() - 2);
  size_t at = 0;
  while (at <= body.size()) {
    const size_t end = std::min(body.find(',', at), body.size());
    const std::optional<uint64_t> e = extent(body.substr(at, end - at), n, k, g);
    if (!e) return std::nullopt;
    s.push_back(*e);
    at = end + 1;
  }
  return s;
}

struct Linear {
  std::string prefix;
  int64_t n, k;
  bool row_parallel;
};

std::vector<Linear> linears(const ModelConfig& c) {
  const std::string l = "model.layers.3.";
  return {{l + "self_attn.q_proj", c.q_size(), c.hidden, false},
          {l + "self_attn.k_proj", c.kv_size(), c.hidden, false},
          {l + "self_attn.o_proj", c.hidden, c.q_size(), true},
          {l + "mlp.gate_proj", c.intermediate, c.hidden, false},
          {l + "mlp.down_proj", c.hidden, c.intermediate, true},
          {l + "mlp.experts.5.up_proj", 1024, c.hidden, false},
          {l + "mlp.experts.5.down_proj", c.hidden, 1024, true}};
}

TEST(QuantSharding, EveryRegistryTensorTravelsWithItsWeightShard) {
  const ModelConfig c = model(8);
  int checked = 0;
  for (const SchemeInfo& info : all_schemes()) {
    if (info.family != SchemeFamily::kWeight || info.kind == SchemeKind::kBf16) continue;
    if (info.kind == SchemeKind::kW4A8Dyn) continue;  // no TP rule: refused (test below)
    const SchemeId scheme =
        info.kind == SchemeKind::kW8A16Group ? parse_scheme_id("w8a16-g128") : SchemeId{info.kind};
    const int64_t g = effective_group_size(scheme);
    for (const TensorSpec& spec : info.tensors)
      for (const Linear& lin : linears(c))
        for (const int tp : {1, 2, 4, 8}) {
          const std::optional<std::vector<uint64_t>> shape =
              stored_shape(spec.shape, lin.n, lin.k, g);
          if (!shape) continue;  // an engine-side stack
          SCOPED_TRACE(info.id + " " + lin.prefix + "." + spec.name + " " + spec.shape + " tp " +
                       std::to_string(tp));
          uint64_t numel = 1;
          for (const uint64_t d : *shape)
            numel *= d;
          int64_t covered = 0, prev_end = 0;
          for (int r = 0; r < tp; ++r) {
            const QuantTensorShard s =
                quant_tensor_shard(c, scheme, lin.prefix, spec.name, *shape, lin.n, lin.k, r, tp);
            const TensorShard w =
                tensor_shard(c, lin.prefix + ".weight",
                             {static_cast<uint64_t>(lin.n), static_cast<uint64_t>(lin.k)}, r, tp);
            ++checked;
            if (numel == 1 || spec.shape == "[2]") {  // per-tensor scalars, weight_shape
              EXPECT_EQ(s.kind, QuantShardKind::kWhole);
              continue;
            }
            const bool has_rows = spec.shape.find('N') != std::string::npos ||
                                  spec.shape.find("Hkv") != std::string::npos;
            const bool has_cols = spec.shape.find('K') != std::string::npos;
            if (lin.row_parallel && !has_cols) {
              const bool once = spec.name == "quant_bias" || spec.name == "bias";
              EXPECT_EQ(s.kind, once && r > 0 ? QuantShardKind::kZeros : QuantShardKind::kWhole);
              continue;
            }
            if (!lin.row_parallel && !has_rows) {
              EXPECT_EQ(s.kind, QuantShardKind::kWhole);
              continue;
            }
            ASSERT_EQ(s.kind, QuantShardKind::kSlice);
            // The slice covers exactly the weight rows / columns of this rank's shard.
            const int64_t total = lin.row_parallel ? lin.k : lin.n;
            const int64_t units = static_cast<int64_t>((*shape)[static_cast<size_t>(s.dim)]);
            const int64_t per = (total + units - 1) / units;
            EXPECT_EQ(s.begin * per, w.begin);
            EXPECT_EQ(std::min(s.end * per, total), w.end);
            EXPECT_EQ(s.begin, prev_end);  // tiles: each rank starts where the last ended
            prev_end = s.end;
            covered += s.end - s.begin;
            if (r == tp - 1) {
              EXPECT_EQ(covered, units);
            }
          }
        }
  }
  EXPECT_GT(checked, 1500);
}

TEST(QuantSharding, W4A8IsRefusedByName) {
  const ModelConfig c = model(8);
  const std::string down = "model.layers.0.mlp.down_proj";
  for (const char* t : {"weight", "scale_bias"})
    EXPECT_THAT(
        test::error_of([&] {
          quant_tensor_shard(c, parse_scheme_id("w4a8-dyn"), down, t, {1024, 16}, 1024, 2048, 1, 2);
        }),
        AllOf(HasSubstr(down + "." + t), HasSubstr("w4a8-dyn has no tensor-parallel")));
}

TEST(QuantSharding, ReplicatedKvHeadsKeepTheirCacheScales) {
  const ModelConfig c = model(2);
  const SchemeId kv = parse_scheme_id("kv-int8");
  for (int r = 0; r < 4; ++r) {
    const QuantTensorShard s = quant_tensor_shard(c, kv, "model.layers.0.self_attn",
                                                  "k_proj.kv_cache_scale", {256}, 256, 1024, r, 4);
    ASSERT_EQ(s.kind, QuantShardKind::kSlice);
    EXPECT_EQ(s.begin, (r / 2) * 128);  // KV head r / (tp / kv): ranks 0, 1 head 0; 2, 3 head 1
    EXPECT_EQ(s.end, (r / 2) * 128 + 128);
  }
  const QuantTensorShard k_scale = quant_tensor_shard(
      c, parse_scheme_id("kv-fp8"), "model.layers.0.self_attn", "k_scale", {1}, 256, 1024, 3, 4);
  EXPECT_EQ(k_scale.kind, QuantShardKind::kWhole);
}

TEST(QuantSharding, RefusesPartitionsThatSplitAGroupBlockOrWord) {
  const ModelConfig c = model(8);
  const std::string down = "model.layers.0.mlp.down_proj";
  // w8a16-g128 on a down_proj of K = 2048 at tp 32: 64 columns a rank, half a group.
  ModelConfig wide = c;
  wide.num_heads = 32, wide.num_kv_heads = 32, wide.head_dim = 32;
  EXPECT_THAT(test::error_of([&] {
                quant_tensor_shard(wide, parse_scheme_id("w8a16-g128"), down, "weight_scale",
                                   {1024, 16}, 1024, 2048, 1, 32);
              }),
              AllOf(HasSubstr(down + ".weight_scale"), HasSubstr("block of 128 weight columns"),
                    HasSubstr("rank 1")));
  // fp8-block on an o_proj of K = 1024 at tp 16: 64 columns a rank inside a 128-block.
  ModelConfig sixteen = c;
  sixteen.num_heads = 16, sixteen.head_dim = 64, sixteen.num_kv_heads = 16;
  EXPECT_THAT(test::error_of([&] {
                quant_tensor_shard(sixteen, parse_scheme_id("fp8-block"),
                                   "model.layers.0.self_attn.o_proj", "weight_scale", {8, 8}, 1024,
                                   1024, 3, 16);
              }),
              AllOf(HasSubstr("o_proj.weight_scale"), HasSubstr("block of 128 weight columns")));
  // fp8-block column-parallel: a gate_proj of 2048 rows at tp 32, 64 rows a rank.
  EXPECT_THAT(test::error_of([&] {
                quant_tensor_shard(c, parse_scheme_id("fp8-block"), "model.layers.0.mlp.gate_proj",
                                   "weight_scale", {16, 8}, 2048, 1024, 5, 32);
              }),
              HasSubstr("block of 128 weight rows"));
  // int4 packed 8 a word: K = 1000 split by 4 gives 250 columns, not whole words.
  EXPECT_THAT(test::error_of([&] {
                quant_tensor_shard(c, parse_scheme_id("w4a16-g32"), down, "weight_packed",
                                   {1024, 125}, 1024, 1000, 1, 4);
              }),
              HasSubstr(down + ".weight_packed"));
  // A stored shape the registry does not give, a tensor the scheme does not store, and a
  // quantized lm_head.
  EXPECT_THAT(test::error_of([&] {
                quant_tensor_shard(c, parse_scheme_id("w8a16-g128"), down, "weight_scale",
                                   {1024, 17}, 1024, 2048, 0, 2);
              }),
              AllOf(HasSubstr("shape [1024, 17] matches none"), HasSubstr("weight_scale")));
  EXPECT_THAT(test::error_of([&] {
                quant_tensor_shard(c, parse_scheme_id("fp8-tensor"), down, "weight_offset", {1},
                                   1024, 2048, 0, 2);
              }),
              HasSubstr("stores no tensor 'weight_offset'"));
  EXPECT_THAT(test::error_of([&] {
                quant_tensor_shard(c, parse_scheme_id("fp8-channel"), "lm_head", "weight_scale",
                                   {1000, 1}, 1000, 1024, 0, 2);
              }),
              HasSubstr("quantized embedding or lm_head"));
}

// Act order (weight_g_idx): on a row-parallel layer the codes and g_idx follow the columns, the
// group scales stay whole on every rank (g_idx holds global group ids); column-parallel as usual.
TEST(QuantSharding, ActOrderKeepsGroupScalesWholeOnRowParallelLayers) {
  const ModelConfig c = model(8);
  const SchemeId w4 = parse_scheme_id("w4a16-g32");
  const std::string down = "model.layers.0.mlp.down_proj";
  const auto shard = [&](const std::string& t, std::vector<uint64_t> shape, int rank) {
    return quant_tensor_shard(c, w4, down, t, shape, 1024, 2048, rank, 2, true);
  };
  EXPECT_EQ(shard("weight_scale", {1024, 64}, 1).kind, QuantShardKind::kWhole);
  const QuantTensorShard packed = shard("weight_packed", {1024, 256}, 1);
  EXPECT_EQ(packed.kind, QuantShardKind::kSlice);
  EXPECT_EQ(packed.begin, 128);
  const QuantTensorShard g_idx = shard("weight_g_idx", {2048}, 1);
  EXPECT_EQ(g_idx.kind, QuantShardKind::kSlice);
  EXPECT_EQ(g_idx.begin, 1024);
  const QuantTensorShard col = quant_tensor_shard(
      c, w4, "model.layers.0.mlp.up_proj", "weight_scale", {2048, 32}, 2048, 1024, 1, 2, true);
  EXPECT_EQ(col.kind, QuantShardKind::kSlice);  // rows with their weight rows
  EXPECT_EQ(col.begin, 1024);
}

// w = (q - offset) * scale per 128-group: the row-parallel ranks' slices of codes, scales and
// offsets dequantize to exactly TP = 1's columns, and msModelSlim's quant_bias reaches the
// all-reduced sum once.
TEST(QuantSharding, RowParallelGroupSlicesDequantizeToTheWholeWeight) {
  const ModelConfig c = model(8);
  const SchemeId scheme = parse_scheme_id("w8a16-g128");
  const int64_t n = 64, k = 2048, g = 128, groups = k / g;
  const std::string down = "model.layers.0.mlp.down_proj";
  std::vector<double> q(static_cast<size_t>(n * k)), s(static_cast<size_t>(n * groups)),
      z(s.size());
  for (size_t i = 0; i < q.size(); ++i)
    q[i] = static_cast<double>(static_cast<int>((i * 7919) % 255) - 127);
  for (size_t i = 0; i < s.size(); ++i) {
    s[i] = std::ldexp(1.0 + static_cast<double>(i % 13) / 16, -static_cast<int>(i % 9));
    z[i] = static_cast<double>(static_cast<int>(i % 5) - 2);
  }
  const auto whole = [&](int64_t r, int64_t col) {
    return (q[static_cast<size_t>(r * k + col)] - z[static_cast<size_t>(r * groups + col / g)]) *
           s[static_cast<size_t>(r * groups + col / g)];
  };
  for (const int tp : {2, 4, 8}) {
    for (int rank = 0; rank < tp; ++rank) {
      const auto cut = [&](const std::string& t, std::vector<uint64_t> shape) {
        return quant_tensor_shard(c, scheme, down, t, shape, n, k, rank, tp);
      };
      const QuantTensorShard qs = cut("weight", {64, 2048});
      const QuantTensorShard ss = cut("weight_scale", {64, 16});
      const QuantTensorShard zs = cut("weight_offset", {64, 16});
      ASSERT_EQ(qs.dim, 1);
      ASSERT_EQ(ss.dim, 1);
      EXPECT_EQ(zs.begin, ss.begin);
      const int64_t kr = qs.end - qs.begin, gr = ss.end - ss.begin;
      EXPECT_EQ(kr, k / tp);
      // The rank's own tensors, as a loader would copy them, dequantized with the rank's local
      // group index.
      for (int64_t r = 0; r < n; ++r)
        for (int64_t j = 0; j < kr; ++j) {
          const double qv = q[static_cast<size_t>(r * k + qs.begin + j)];
          const size_t gi = static_cast<size_t>(r * groups + ss.begin + j / g);
          ASSERT_LT(j / g, gr);
          ASSERT_EQ((qv - z[gi]) * s[gi], whole(r, qs.begin + j)) << "rank " << rank;
        }
    }
  }
  // quant_bias of a row-parallel W8A8 layer: the all-reduce sums the ranks' (acc_r + qb_r), so
  // only rank 0 may hold it.
  const SchemeId w8a8 = parse_scheme_id("w8a8-static");
  int holders = 0;
  for (int rank = 0; rank < 4; ++rank) {
    const QuantTensorShard b =
        quant_tensor_shard(c, w8a8, down, "quant_bias", {64}, 64, 2048, rank, 4);
    const QuantTensorShard d =
        quant_tensor_shard(c, w8a8, down, "deq_scale", {64}, 64, 2048, rank, 4);
    holders += b.kind == QuantShardKind::kWhole;
    EXPECT_EQ(b.kind, rank == 0 ? QuantShardKind::kWhole : QuantShardKind::kZeros);
    EXPECT_EQ(d.kind, QuantShardKind::kWhole);  // scales each rank's partial sum
  }
  EXPECT_EQ(holders, 1);
}

}  // namespace
}  // namespace qparity
