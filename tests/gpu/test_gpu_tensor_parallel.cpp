// Tensor parallelism for real over NCCL on two GPUs (nvidia-h200-x2), with the sharding rules of
// core/parallel/tp_sharding.h: a row-parallel linear (o_proj) all-reduces fp32 partial sums, a
// column-parallel one (q_proj) all-gathers its slices, the vocab-parallel embedding all-reduces
// rows only their owner filled. Each against the single-GPU result / the fp64 product. Skips,
// saying why, with fewer than two GPUs.
#include <gtest/gtest.h>

#include <cstring>
#include <random>

#include "../unit/test_seed.h"
#include "gpu_engine/device_buffer.h"
#include "gpu_engine/kernels/embedding.h"
#include "gpu_engine/kernels/gemm.h"
#include "gpu_engine/tensor_parallel.h"
#include "gpu_test.h"
#include "kernel_test_util.h"
#include "schemes/math/matmul.h"

namespace qparity {
namespace {

using gpu::DeviceBuffer;
using test::Bf16;

class GpuTensorParallel : public test::GpuTest {
 protected:
  void SetUp() override {
    test::GpuTest::SetUp();
    if (IsSkipped()) return;
    int n = 0;
    cudaGetDeviceCount(&n);
    if (n < 2) GTEST_SKIP() << "needs 2 GPUs (nvidia-h200-x2); " << n << " visible";
  }
  const uint64_t seed_ = test::test_seed();  // printed on failure: QPARITY_TEST_SEED replays it
  std::mt19937_64 rng{seed_};
};

ModelConfig shapes() {
  ModelConfig c;
  c.hidden = 1024;
  c.num_heads = 16;
  c.num_kv_heads = 8;
  c.head_dim = 64;
  c.intermediate = 2048;
  c.vocab = 1001;
  return c;
}

TEST_F(GpuTensorParallel, RowParallelAllReduceMatchesTheFullProduct) {
  SCOPED_TRACE(test::seed_note(seed_));
  const ModelConfig c = shapes();
  const int64_t t = 16, n = c.hidden, k = c.q_size();
  std::vector<Bf16> hx, hw;
  const Matrix x = test::random_bf16(rng, t, k, 1.0, hx);
  const Matrix w = test::random_bf16(rng, n, k, 0.03, hw);
  gpu::TpGroup g(2);
  std::vector<DeviceBuffer<Bf16>> dx, dw;
  std::vector<DeviceBuffer<float>> dy;
  std::vector<std::unique_ptr<gpu::BlasLtGemm>> gemm;
  std::vector<void*> bufs;
  for (int r = 0; r < 2; ++r) {
    ASSERT_EQ(cudaSetDevice(r), cudaSuccess);
    const TensorShard s = tensor_shard(c, "model.layers.0.self_attn.o_proj.weight",
                                       {static_cast<uint64_t>(n), static_cast<uint64_t>(k)}, r, 2);
    ASSERT_EQ(s.kind, ShardKind::kRow);
    // The input's matching columns: a row-parallel linear sees its slice of the activation.
    dx.emplace_back(gpu::shard_of(hx, t, k, s));
    dw.emplace_back(gpu::shard_of(hw, n, k, s));
    dy.emplace_back(static_cast<size_t>(t * n));
    gemm.push_back(std::make_unique<gpu::BlasLtGemm>());
    gemm.back()->nt(dx.back().get(), dw.back().get(), dy.back().get(), gpu::GemmOut::kF32, t, n,
                    s.end - s.begin, g.stream(r));
    bufs.push_back(dy.back().get());
  }
  g.all_reduce_sum(bufs, static_cast<size_t>(t * n), ncclFloat32);
  g.synchronize();
  const Matrix want = reference::matmul_nt(x, w);
  std::vector<float> y0, y1;
  ASSERT_EQ(cudaSetDevice(0), cudaSuccess);
  y0 = dy[0].download();
  ASSERT_EQ(cudaSetDevice(1), cudaSuccess);
  y1 = dy[1].download();
  EXPECT_EQ(std::memcmp(y0.data(), y1.data(), y0.size() * 4), 0) << "ranks disagree";
  // fp32 partial sums of K/2 terms each, then one fp32 add: ~sqrt(K) 2^-24 relative.
  const double e = test::rel_l2(std::vector<double>(y0.begin(), y0.end()), want.data);
  EXPECT_LE(e, 16 * std::sqrt(static_cast<double>(k)) * std::ldexp(1.0, -24)) << e;
}

TEST_F(GpuTensorParallel, ColumnParallelAllGatherMatchesTheFullProduct) {
  SCOPED_TRACE(test::seed_note(seed_));
  const ModelConfig c = shapes();
  const int64_t t = 16, n = c.q_size(), k = c.hidden;
  std::vector<Bf16> hx, hw;
  const Matrix x = test::random_bf16(rng, t, k, 1.0, hx);
  const Matrix w = test::random_bf16(rng, n, k, 0.03, hw);
  gpu::TpGroup g(2);
  std::vector<DeviceBuffer<Bf16>> dx, dw, dy, dall;
  std::vector<std::unique_ptr<gpu::BlasLtGemm>> gemm;
  std::vector<const void*> send;
  std::vector<void*> recv;
  for (int r = 0; r < 2; ++r) {
    ASSERT_EQ(cudaSetDevice(r), cudaSuccess);
    const TensorShard s = tensor_shard(c, "model.layers.0.self_attn.q_proj.weight",
                                       {static_cast<uint64_t>(n), static_cast<uint64_t>(k)}, r, 2);
    ASSERT_EQ(s.kind, ShardKind::kColumn);
    dx.emplace_back(hx);
    dw.emplace_back(gpu::shard_of(hw, n, k, s));
    // Each rank computes its output columns transposed to [n/2, t] rows, so the gathered buffer
    // is [n, t]: rank order is column order.
    dy.emplace_back(static_cast<size_t>(t * (n / 2)));
    dall.emplace_back(static_cast<size_t>(t * n));
    gemm.push_back(std::make_unique<gpu::BlasLtGemm>());
    gemm.back()->nt(dw.back().get(), dx.back().get(), dy.back().get(), gpu::GemmOut::kBf16, n / 2,
                    t, k, g.stream(r));
    send.push_back(dy.back().get());
    recv.push_back(dall.back().get());
  }
  g.all_gather(send, recv, static_cast<size_t>(t * (n / 2) * 2), ncclUint8);
  g.synchronize();
  const Matrix want = reference::matmul_nt(w, x);  // [n, t]
  for (int r = 0; r < 2; ++r) {
    ASSERT_EQ(cudaSetDevice(r), cudaSuccess);
    const double e = test::rel_l2(test::to_doubles(dall[static_cast<size_t>(r)].download()),
                                  test::round_bf16(want.data));
    EXPECT_LE(e, test::kFlipBound) << "rank " << r << ": " << e;
  }
}

TEST_F(GpuTensorParallel, VocabParallelEmbeddingIsExact) {
  SCOPED_TRACE(test::seed_note(seed_));
  const ModelConfig c = shapes();
  const int64_t v = c.vocab, h = 256;
  std::vector<Bf16> ht;
  const Matrix table = test::random_bf16(rng, v, h, 1.0, ht);
  const std::vector<int32_t> ids = {0, 511, 512, 1000, 7, 777};
  gpu::TpGroup g(2);
  std::vector<DeviceBuffer<Bf16>> dt, out;
  std::vector<DeviceBuffer<int32_t>> di;
  std::vector<void*> bufs;
  const int64_t tn = static_cast<int64_t>(ids.size());
  for (int r = 0; r < 2; ++r) {
    ASSERT_EQ(cudaSetDevice(r), cudaSuccess);
    const TensorShard s = tensor_shard(c, "model.embed_tokens.weight",
                                       {static_cast<uint64_t>(v), static_cast<uint64_t>(h)}, r, 2);
    ASSERT_EQ(s.kind, ShardKind::kVocab);
    std::vector<Bf16> shard = gpu::shard_of(ht, v, h, s);
    shard.resize(shard.size() + static_cast<size_t>(h), test::to_bf16(0.0));  // a zero row
    // Ids this rank does not own read the zero row; the all-reduce adds the owner's row to
    // zeros, which is exact.
    std::vector<int32_t> local;
    for (int32_t id : ids)
      local.push_back(id >= s.begin && id < s.end ? static_cast<int32_t>(id - s.begin)
                                                  : static_cast<int32_t>(s.padded));
    dt.emplace_back(shard);
    di.emplace_back(local);
    out.emplace_back(static_cast<size_t>(tn * h));
    gpu::launch_embedding(
        {di.back().get(), dt.back().get(), out.back().get(), nullptr, tn, s.padded + 1, h},
        g.stream(r));
    bufs.push_back(out.back().get());
  }
  g.all_reduce_sum(bufs, static_cast<size_t>(tn * h), ncclBfloat16);
  g.synchronize();
  for (int r = 0; r < 2; ++r) {
    ASSERT_EQ(cudaSetDevice(r), cudaSuccess);
    const std::vector<double> got = test::to_doubles(out[static_cast<size_t>(r)].download());
    for (int64_t i = 0; i < tn; ++i)
      for (int64_t j = 0; j < h; ++j)
        ASSERT_EQ(got[static_cast<size_t>(i * h + j)], table(ids[static_cast<size_t>(i)], j))
            << "rank " << r << " token " << i;
  }
}

}  // namespace
}  // namespace qparity
