// Assembling a tensor-parallel run's capture points (core/parallel/tp_gather.h): for TP = 1, 2,
// 4, 8 and KV heads split or replicated, every column-sharded point split into the ranks' shard
// layouts and gathered again is the whole point bit for bit (the segments land where a TP = 1
// run has them: q before k before v, gate before up, each replicated KV head once); replicated
// points are rank 0's once every rank holds the same bits, and a rank that diverged is an error
// naming the point; per-rank dynamic activation scales of a row-parallel layer make it and its
// codes absent with the reason, while static (shared) and group scales are kept.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cstring>

#include "core/capture/capture_points.h"
#include "core/parallel/tp_gather.h"
#include "core/parallel/tp_sharding.h"
#include "error_of.h"

namespace qparity {
namespace {

using test::error_of;
using ::testing::AllOf;
using ::testing::HasSubstr;

ModelConfig model(int64_t kv_heads) {
  ModelConfig c;
  c.num_layers = 1;
  c.hidden = 64;
  c.num_heads = 8;
  c.num_kv_heads = kv_heads;
  c.head_dim = 8;
  c.intermediate = 32;
  c.vocab = 100;
  return c;
}

Matrix numbered(int64_t rows, int64_t cols, double base) {
  Matrix m(rows, cols);
  for (size_t i = 0; i < m.data.size(); ++i)
    m.data[i] = base + static_cast<double>(i);
  return m;
}

bool same(const Matrix& a, const Matrix& b) {
  return a.rows == b.rows && a.cols == b.cols &&
         std::memcmp(a.data.data(), b.data.data(), a.data.size() * sizeof(double)) == 0;
}

TEST(TpGather, ShardedPointsRoundTripForEveryTpAndKvLayout) {
  for (const int64_t kv : {int64_t{8}, int64_t{2}, int64_t{1}})
    for (const int tp : {1, 2, 4, 8}) {
      SCOPED_TRACE("kv heads " + std::to_string(kv) + ", tp " + std::to_string(tp));
      const ModelConfig c = model(kv);
      const int64_t q = c.q_size(), k = c.kv_size(), in = c.intermediate;
      const std::vector<std::pair<std::string, int64_t>> points = {
          {"layers.0.attn.qkv", q + 2 * k},
          {"layers.0.attn.q_norm", q},
          {"layers.0.attn.k_norm", k},
          {"layers.0.attn.rope_q", q},
          {"layers.0.attn.rope_k", k},
          {"layers.0.attn.k_cache", k},
          {"layers.0.attn.v_cache", k},
          {"layers.0.attn.core", q},
          {"layers.0.mlp.gate_up", 2 * in},
          {"layers.0.mlp.act", in},
          {"layers.0.attn.out", c.hidden},
          {"layers.0.attn.o_proj.x_values", q},
          {"logits", c.vocab}};
      std::vector<Trace> ranks(static_cast<size_t>(tp));
      std::vector<Matrix> whole;
      double base = 0;
      for (const auto& [name, width] : points) {
        whole.push_back(numbered(3, width, base));
        base += 1000;
        for (int r = 0; r < tp; ++r)
          ranks[static_cast<size_t>(r)].record(name, split_tp_point(name, whole.back(), c, r, tp));
      }
      // The row-parallel codes keep a group scale per 4 columns (shared layout per rank).
      const ModelConfig local = tp_rank_config(c, tp);
      for (int r = 0; r < tp; ++r)
        ranks[static_cast<size_t>(r)].record("layers.0.attn.o_proj.x_scales",
                                             numbered(3, local.q_size() / 4, 100000 + 10 * r));
      std::vector<const Trace*> p;
      for (const Trace& t : ranks)
        p.push_back(&t);
      const GatheredTrace g = gather_tp_trace(p, c);
      EXPECT_TRUE(g.absent.empty());
      for (size_t i = 0; i < points.size(); ++i)
        EXPECT_TRUE(same(g.trace.at(points[i].first), whole[i])) << points[i].first;
      EXPECT_EQ(g.trace.at("layers.0.attn.o_proj.x_scales").cols, q / 4);
      // Rank order: every point in the order rank 0 recorded it.
      EXPECT_EQ(g.trace.points().front().first, "layers.0.attn.qkv");
    }
}

TEST(TpGather, KvHeadsAreTakenOnceWhenReplicated) {
  const ModelConfig c = model(2);
  const int tp = 4;  // ranks 0, 1 hold KV head 0; ranks 2, 3 head 1
  const Matrix whole = numbered(2, c.kv_size(), 0);
  EXPECT_TRUE(same(split_tp_point("layers.0.attn.rope_k", whole, c, 1, tp),
                   split_tp_point("layers.0.attn.rope_k", whole, c, 0, tp)));
  std::vector<Trace> ranks(4);
  for (int r = 0; r < tp; ++r) {
    Matrix m = split_tp_point("layers.0.attn.rope_k", whole, c, r, tp);
    if (r % 2 == 1) m.data[0] = -1;  // a replica's copy is never read
    ranks[static_cast<size_t>(r)].record("layers.0.attn.rope_k", m);
  }
  const GatheredTrace g = gather_tp_trace({&ranks[0], &ranks[1], &ranks[2], &ranks[3]}, c);
  EXPECT_TRUE(same(g.trace.at("layers.0.attn.rope_k"), whole));
}

TEST(TpGather, ReplicatedPointsMustAgreeBitForBit) {
  const ModelConfig c = model(8);
  Trace a, b;
  a.record("layers.0.residual", numbered(2, c.hidden, 0));
  Matrix m = numbered(2, c.hidden, 0);
  m.data[5] = std::nextafter(m.data[5], 1e9);
  b.record("layers.0.residual", m);
  EXPECT_THAT(error_of([&] {
                gather_tp_trace({&a, &b}, c);
              }),
              AllOf(HasSubstr("layers.0.residual"), HasSubstr("rank 1"), HasSubstr("diverged")));
  Trace lacking;
  EXPECT_THAT(error_of([&] {
                gather_tp_trace({&a, &lacking}, c);
              }),
              AllOf(HasSubstr("layers.0.residual"), HasSubstr("did not capture")));
}

TEST(TpGather, PerRankDynamicScalesOfARowParallelLayerAreAbsentWithTheirCodes) {
  const ModelConfig c = model(8);
  const int64_t ql = c.q_size() / 2, il = c.intermediate / 2;
  Trace r0, r1;
  for (int r = 0; r < 2; ++r) {
    Trace& t = r == 0 ? r0 : r1;
    // o_proj: per-token scales over the rank's slice (they differ).
    t.record("layers.0.attn.o_proj.x_values", numbered(2, ql, 10.0 * r));
    t.record("layers.0.attn.o_proj.x_scales", numbered(2, 1, 1.0 + r));
    // down_proj: a static per-tensor scale (all ranks alike): kept.
    t.record("layers.0.mlp.down_proj.x_values", numbered(2, il, 20.0 * r));
    t.record("layers.0.mlp.down_proj.x_scales", numbered(2, 1, 0.5));
    // qkv_proj: a replicated input, its codes alike on every rank.
    t.record("layers.0.attn.qkv_proj.x_values", numbered(2, c.hidden, 3));
    t.record("layers.0.attn.qkv_proj.x_scales", numbered(2, 1, 0.25));
    t.record("layers.0.moe.expert_out", numbered(4, c.hidden, r));
  }
  const GatheredTrace g = gather_tp_trace({&r0, &r1}, c);
  std::vector<std::string> absent;
  for (const AbsentTpPoint& a : g.absent)
    absent.push_back(a.name);
  EXPECT_THAT(absent, ::testing::UnorderedElementsAre("layers.0.attn.o_proj.x_values",
                                                      "layers.0.attn.o_proj.x_scales",
                                                      "layers.0.moe.expert_out"));
  for (const AbsentTpPoint& a : g.absent)
    EXPECT_FALSE(a.reason.empty()) << a.name;
  EXPECT_EQ(g.trace.at("layers.0.mlp.down_proj.x_values").cols, c.intermediate);
  EXPECT_EQ(g.trace.at("layers.0.mlp.down_proj.x_scales").cols, 1);
  EXPECT_EQ(g.trace.at("layers.0.attn.qkv_proj.x_values").cols, c.hidden);
  EXPECT_EQ(g.trace.find("layers.0.attn.o_proj.x_values"), nullptr);
}

}  // namespace
}  // namespace qparity
