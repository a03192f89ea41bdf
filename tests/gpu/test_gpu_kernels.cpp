// Every engine kernel against the fp64 reference op (reference_cpu/layers) on fresh random
// bf16-representable inputs, outputs poisoned with NaN first so an element a kernel fails to
// write fails the test. Judged by ||out - ref|| / ||ref|| where ref is the fp64 op rounded once to
// bf16, against kFlipBound (kernel_test_util.h says why that number). Launcher checks (bad
// shapes, missing pointers) run without a GPU.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <numeric>
#include <random>

#include "../unit/error_of.h"
#include "../unit/test_seed.h"
#include "gpu_engine/device_buffer.h"
#include "gpu_engine/kernels/activation.h"
#include "gpu_engine/kernels/attention_prologue.h"
#include "gpu_engine/kernels/decode_attention.h"
#include "gpu_engine/kernels/embedding.h"
#include "gpu_engine/kernels/gemm.h"
#include "gpu_engine/kernels/moe_dispatch.h"
#include "gpu_engine/kernels/moe_routing.h"
#include "gpu_engine/kernels/paged_attention.h"
#include "gpu_engine/kernels/prefill_attention.h"
#include "gpu_engine/kernels/rms_norm.h"
#include "gpu_engine/kernels/sampling.h"
#include "gpu_engine/kernels/skinny_gemm.h"
#include "gpu_test.h"
#include "kernel_test_util.h"
#include "reference_cpu/layers/activation.h"
#include "reference_cpu/layers/attention.h"
#include "reference_cpu/layers/moe_router.h"
#include "reference_cpu/layers/rms_norm.h"
#include "reference_cpu/layers/rope.h"

namespace qparity {
namespace {

using gpu::DeviceBuffer;
using test::Bf16;
using test::kFlipBound;
using test::random_bf16;
using test::rel_l2;
using test::round_bf16;
using test::to_doubles;
using ::testing::HasSubstr;

class GpuKernels : public test::GpuTest {
 protected:
  std::mt19937_64 rng{test::test_seed()};
};

TEST_F(GpuKernels, RmsNormPlainFusedAndPerHead) {
  const int64_t t = 37, h = 1024;
  std::vector<Bf16> hx, hr, hw;
  const Matrix x = random_bf16(rng, t, h, 1.0, hx), res = random_bf16(rng, t, h, 4.0, hr);
  Matrix wm = random_bf16(rng, 1, h, 0.3, hw);
  const std::vector<double> w = wm.data;
  DeviceBuffer<Bf16> dx(hx), dr(hr), dw(hw), out(hx.size()), rout(hx.size());
  {  // plain
    out.poison();
    gpu::RmsNormParams p{dx.get(), nullptr, nullptr, dw.get(), out.get(), t, 1, h, h, 1e-6f};
    gpu::launch_rms_norm(p, nullptr);
    const double e =
        rel_l2(to_doubles(out.download()), round_bf16(reference::rms_norm(x, w, 1e-6).data));
    EXPECT_LE(e, kFlipBound) << e;
  }
  {  // fused residual add: h = bf16(x + res) is the new residual, and what is normalized
    out.poison();
    rout.poison();
    gpu::RmsNormParams p{dx.get(), dr.get(), rout.get(), dw.get(), out.get(), t, 1, h, h, 1e-6f};
    gpu::launch_rms_norm(p, nullptr);
    Matrix sum = x;
    for (size_t i = 0; i < sum.data.size(); ++i)
      sum.data[i] += res.data[i];
    sum.data = round_bf16(sum.data);
    // The sum of two bf16 numbers rounds identically in fp32 and fp64: exact.
    EXPECT_EQ(to_doubles(rout.download()), sum.data);
    const double e =
        rel_l2(to_doubles(out.download()), round_bf16(reference::rms_norm(sum, w, 1e-6).data));
    EXPECT_LE(e, kFlipBound) << e;
  }
  {  // Qwen3 q_norm: every head of the q part of a fused qkv row, in place
    const int64_t heads = 8, d = 128, kv = 2 * 2 * d, width = heads * d + kv;
    std::vector<Bf16> hq, hwq;
    const Matrix qkv = random_bf16(rng, t, width, 2.0, hq);
    const Matrix wq = random_bf16(rng, 1, d, 0.5, hwq);
    DeviceBuffer<Bf16> dq(hq), dwq(hwq);
    gpu::RmsNormParams p{dq.get(), nullptr, nullptr, dwq.get(), dq.get(),
                         t,        heads,   d,       width,     1e-6f};
    gpu::launch_rms_norm(p, nullptr);
    const std::vector<double> got = to_doubles(dq.download());
    Matrix q(t, heads * d), got_q(t, heads * d), got_rest(t, kv), want_rest(t, kv);
    for (int64_t r = 0; r < t; ++r) {
      for (int64_t c = 0; c < heads * d; ++c)
        q(r, c) = qkv(r, c), got_q(r, c) = got[static_cast<size_t>(r * width + c)];
      for (int64_t c = 0; c < kv; ++c)
        want_rest(r, c) = qkv(r, heads * d + c),
                     got_rest(r, c) = got[static_cast<size_t>(r * width + heads * d + c)];
    }
    const double e =
        rel_l2(got_q.data, round_bf16(reference::rms_norm_heads(q, d, wq.data, 1e-6).data));
    EXPECT_LE(e, kFlipBound) << e;
    EXPECT_EQ(got_rest.data, want_rest.data) << "k and v are left alone";
  }
}

ModelConfig rope_config(int64_t head_dim, bool llama3) {
  ModelConfig c;
  c.head_dim = head_dim;
  c.rope_theta = llama3 ? 500000.0 : 1000000.0;
  if (llama3) {
    c.rope_scaling.type = RopeType::kLlama3;
    c.rope_scaling.factor = 8.0;
    c.rope_scaling.low_freq_factor = 1.0;
    c.rope_scaling.high_freq_factor = 4.0;
    c.rope_scaling.original_max_position_embeddings = 8192;
  }
  return c;
}

// Qwen3-style (q/k norm, default RoPE) and Llama-3-style (no norm, llama3-scaled RoPE) rows:
// the normalized q and k against the fp64 per-head norm; the rotated q and k against fp64 RoPE of
// the kernel's own normalized values (so each stage is judged alone); K and V in the cache equal
// the row's rotated K and input V bit for bit, at each token's own block and slot.
TEST_F(GpuKernels, AttentionPrologueNormRopeAndCacheWrite) {
  for (const bool llama3 : {false, true}) {
    SCOPED_TRACE(llama3 ? "llama3, no qk norm" : "qwen3, qk norm");
    const int64_t t = 37, heads = 8, kv_heads = 2, d = 128, block = 16;
    const int64_t qk_w = (heads + kv_heads) * d, stride = (heads + 2 * kv_heads) * d + 64;
    const reference::Rope rope(rope_config(d, llama3));
    std::vector<Bf16> hx, hwq, hwk;
    const Matrix x = random_bf16(rng, t, stride, 1.0, hx);
    const Matrix wq = random_bf16(rng, 1, d, 0.5, hwq), wk = random_bf16(rng, 1, d, 0.5, hwk);
    // Token i is sequence i at a random position up to 10^5 (long-context angles), its block
    // mapped to physical block i; every other table entry points nowhere valid.
    std::uniform_int_distribution<int32_t> pd(0, 100000);
    const int64_t max_blocks = 100000 / block + 1;
    std::vector<int32_t> pos(static_cast<size_t>(t)), seq(pos.size());
    std::vector<int32_t> table(static_cast<size_t>(t * max_blocks), -1);
    std::vector<int64_t> pos64(pos.size());
    for (int32_t i = 0; i < t; ++i) {
      const size_t u = static_cast<size_t>(i);
      pos[u] = pd(rng), pos64[u] = pos[u], seq[u] = i;
      table[static_cast<size_t>(i * max_blocks + pos[u] / block)] = i;
    }
    DeviceBuffer<Bf16> dx(hx), dwq(hwq), dwk(hwk), normed(static_cast<size_t>(t * qk_w)),
        kc(static_cast<size_t>(t * block * kv_heads * d)), vc(kc.size());
    DeviceBuffer<int32_t> dp(pos), ds(seq), dt(table);
    DeviceBuffer<double> di(rope.inv_freq());
    normed.poison();
    kc.poison();
    vc.poison();
    gpu::AttentionPrologueParams p;
    p.qkv = dx.get();
    p.row_stride = stride;
    if (!llama3) p.q_norm = dwq.get(), p.k_norm = dwk.get(), p.normed_out = normed.get();
    p.positions = dp.get();
    p.inv_freq = di.get();
    p.k_cache = kc.get();
    p.v_cache = vc.get();
    p.block_table = dt.get();
    p.seq = ds.get();
    p.tokens = t, p.num_heads = heads, p.num_kv_heads = kv_heads, p.head_dim = d;
    p.block_size = block, p.max_blocks_per_seq = max_blocks;
    gpu::launch_attention_prologue(p, nullptr);
    const std::vector<double> got = to_doubles(dx.download());
    // The q and k heads of t rows of a flat [t, row] buffer.
    const auto split_qk = [&](const std::vector<double>& flat, int64_t row) {
      std::pair<Matrix, Matrix> qk{Matrix(t, heads * d), Matrix(t, kv_heads * d)};
      for (int64_t r = 0; r < t; ++r) {
        for (int64_t c = 0; c < heads * d; ++c)
          qk.first(r, c) = flat[static_cast<size_t>(r * row + c)];
        for (int64_t c = 0; c < kv_heads * d; ++c)
          qk.second(r, c) = flat[static_cast<size_t>(r * row + heads * d + c)];
      }
      return qk;
    };
    auto [q, k] = split_qk(x.data, stride);
    if (!llama3) {
      const auto [gq, gk] = split_qk(to_doubles(normed.download()), qk_w);
      const double eq =
          rel_l2(gq.data, round_bf16(reference::rms_norm_heads(q, d, wq.data, 1e-6).data));
      const double ek =
          rel_l2(gk.data, round_bf16(reference::rms_norm_heads(k, d, wk.data, 1e-6).data));
      EXPECT_LE(eq, kFlipBound) << eq;
      EXPECT_LE(ek, kFlipBound) << ek;
      q = gq, k = gk;
    }
    const auto [gq, gk] = split_qk(got, stride);
    rope.apply(q, heads, pos64);
    rope.apply(k, kv_heads, pos64);
    // fp64 on both sides: only libm's and CUDA's sin/cos (each within an fp64 ULP or two) differ.
    const double eq = rel_l2(gq.data, round_bf16(q.data)), ek = rel_l2(gk.data, round_bf16(k.data));
    EXPECT_LE(eq, kFlipBound) << eq;
    EXPECT_LE(ek, kFlipBound) << ek;
    const std::vector<double> kcache = to_doubles(kc.download()),
                              vcache = to_doubles(vc.download());
    for (int64_t r = 0; r < t; ++r) {
      const int64_t slot = pos64[static_cast<size_t>(r)] % block;
      for (int64_t c = 0; c < kv_heads * d; ++c) {
        const size_t at = static_cast<size_t>(((r * block + slot) * kv_heads) * d + c);
        ASSERT_EQ(kcache[at], gk(r, c)) << "token " << r;
        ASSERT_EQ(vcache[at], x(r, (heads + kv_heads) * d + c)) << "token " << r;
        ASSERT_EQ(got[static_cast<size_t>(r * stride + (heads + kv_heads) * d + c)],
                  x(r, (heads + kv_heads) * d + c))
            << "v stays in the row";
      }
      for (int64_t c = (heads + 2 * kv_heads) * d; c < stride; ++c)  // the tail is untouched
        ASSERT_EQ(got[static_cast<size_t>(r * stride + c)], x(r, c));
    }
  }
}

// Decode-shaped GEMMs: plain (bf16 and fp32 out, odd N, a K-split shape), then the fused
// residual-add + RMSNorm prologue with the SiLU-and-mul epilogue, each stage judged on the
// kernel's own input to it. A token's row is bit-identical alone and inside a batch of M.
TEST_F(GpuKernels, SkinnyGemmPlainAndFused) {
  for (const auto& [n, k] : std::vector<std::pair<int64_t, int64_t>>{
           {1024, 3072}, {1001, 1024}, {6144, 1024}, {256, 14336}, {77, 64}}) {
    for (const int64_t m : {int64_t{1}, int64_t{3}, gpu::kSkinnyMaxM}) {
      SCOPED_TRACE(std::to_string(m) + "x" + std::to_string(n) + "x" + std::to_string(k));
      ASSERT_TRUE(gpu::skinny_gemm_fits(m, k)) << "X fits in shared memory";
      std::vector<Bf16> hx, hw;
      const Matrix a = random_bf16(rng, m, k, 1.0, hx), w = random_bf16(rng, n, k, 0.05, hw);
      DeviceBuffer<Bf16> dx(hx), dw(hw), dy(static_cast<size_t>(m * n));
      DeviceBuffer<float> df(static_cast<size_t>(m * n));
      dy.poison();
      df.poison();
      gpu::SkinnyGemmParams p;
      p.x = dx.get(), p.w = dw.get(), p.y = dy.get(), p.m = m, p.n = n, p.k = k;
      gpu::launch_skinny_gemm(p, nullptr);
      p.y = df.get(), p.y_f32 = true;
      gpu::launch_skinny_gemm(p, nullptr);
      const Matrix want = reference::matmul_nt(a, w);
      const double e = rel_l2(to_doubles(dy.download()), round_bf16(want.data));
      EXPECT_LE(e, kFlipBound) << e;
      const std::vector<float> f = df.download();
      const double ef = rel_l2(std::vector<double>(f.begin(), f.end()), want.data);
      EXPECT_LE(ef, 16 * std::sqrt(static_cast<double>(k)) * std::ldexp(1.0, -24)) << ef;
      if (m > 1) {  // the last token alone: the same bits
        DeviceBuffer<Bf16> x1(std::vector<Bf16>(hx.end() - k, hx.end())),
            y1(static_cast<size_t>(n));
        gpu::SkinnyGemmParams one = p;
        one.x = x1.get(), one.y = y1.get(), one.y_f32 = false, one.m = 1;
        gpu::launch_skinny_gemm(one, nullptr);
        const std::vector<Bf16> all = dy.download(), alone = y1.download();
        ASSERT_EQ(std::memcmp(alone.data(), all.data() + (m - 1) * n, n * sizeof(Bf16)), 0);
      }
    }
  }
  // Fused: x + add -> residual_out, RMSNorm -> normed_out, gate_up -> gate_up_out, act -> y.
  const int64_t m = gpu::kSkinnyMaxM, k = 1024, inter = 1536;
  std::vector<Bf16> hx, ha, hnw, hw;
  const Matrix x = random_bf16(rng, m, k, 1.0, hx), add = random_bf16(rng, m, k, 4.0, ha);
  const Matrix nw = random_bf16(rng, 1, k, 0.3, hnw), w = random_bf16(rng, 2 * inter, k, 0.05, hw);
  DeviceBuffer<Bf16> dx(hx), da(ha), dnw(hnw), dw(hw), res(hx.size()), normed(hx.size()),
      gu(static_cast<size_t>(m * 2 * inter)), act(static_cast<size_t>(m * inter));
  for (auto* b : {&res, &normed, &gu, &act})
    b->poison();
  gpu::SkinnyGemmParams p;
  p.x = dx.get(), p.add = da.get(), p.residual_out = res.get(), p.norm_weight = dnw.get();
  p.normed_out = normed.get(), p.w = dw.get(), p.y = act.get(), p.m = m, p.n = 2 * inter, p.k = k;
  p.silu_mul = true, p.gate_up_out = gu.get();
  gpu::launch_skinny_gemm(p, nullptr);
  Matrix sum = x;
  for (size_t i = 0; i < sum.data.size(); ++i)
    sum.data[i] += add.data[i];
  sum.data = round_bf16(sum.data);
  EXPECT_EQ(to_doubles(res.download()), sum.data) << "the sum of two bf16 numbers is exact in fp32";
  Matrix got_normed(m, k);
  got_normed.data = to_doubles(normed.download());
  const double en =
      rel_l2(got_normed.data, round_bf16(reference::rms_norm(sum, nw.data, 1e-6).data));
  EXPECT_LE(en, kFlipBound) << en;
  Matrix got_gu(m, 2 * inter);
  got_gu.data = to_doubles(gu.download());
  const double eg = rel_l2(got_gu.data, round_bf16(reference::matmul_nt(got_normed, w).data));
  EXPECT_LE(eg, kFlipBound) << eg;
  const double ea =
      rel_l2(to_doubles(act.download()), round_bf16(reference::silu_and_mul(got_gu).data));
  EXPECT_LE(ea, kFlipBound) << ea;
  // The last token alone (M = 1: the single-pass kernel, X in each lane's slots), with and
  // without the residual add: every output bit-identical to its row of the batch of M.
  for (const bool with_add : {true, false}) {
    SCOPED_TRACE(with_add ? "alone, with the residual add" : "alone, norm only");
    const auto tail = [](const std::vector<Bf16>& v, int64_t width) {
      return std::vector<Bf16>(v.end() - width, v.end());
    };
    gpu::SkinnyGemmParams batch = p;
    if (!with_add) {
      batch.add = nullptr, batch.residual_out = nullptr;
      for (auto* b : {&normed, &gu, &act})
        b->poison();
      gpu::launch_skinny_gemm(batch, nullptr);
    }
    DeviceBuffer<Bf16> x1(tail(hx, k)), a1(tail(ha, k)), res1(static_cast<size_t>(k)),
        normed1(static_cast<size_t>(k)), gu1(static_cast<size_t>(2 * inter)),
        act1(static_cast<size_t>(inter));
    for (auto* b : {&res1, &normed1, &gu1, &act1})
      b->poison();
    gpu::SkinnyGemmParams one = batch;
    one.m = 1, one.x = x1.get(), one.normed_out = normed1.get(), one.gate_up_out = gu1.get();
    one.y = act1.get();
    if (with_add) one.add = a1.get(), one.residual_out = res1.get();
    gpu::launch_skinny_gemm(one, nullptr);
    const auto same_bits = [&](DeviceBuffer<Bf16>& alone, DeviceBuffer<Bf16>& all, int64_t width) {
      const std::vector<Bf16> a1v = alone.download(), t = tail(all.download(), width);
      return std::memcmp(a1v.data(), t.data(), t.size() * sizeof(Bf16)) == 0;
    };
    if (with_add) {
      EXPECT_TRUE(same_bits(res1, res, k)) << "residual_out";
    }
    EXPECT_TRUE(same_bits(normed1, normed, k)) << "normed_out";
    EXPECT_TRUE(same_bits(gu1, gu, 2 * inter)) << "gate_up_out";
    EXPECT_TRUE(same_bits(act1, act, inter)) << "y";
  }
}

// M = 1 through the single-pass kernel and through the generic one: the same bits for every
// output, over the shapes and options the single pass covers (plain bf16 / fp32, odd N, each K
// split, SiLU-and-mul, the norm prologue with and without the residual add and its captures, K
// from 64 to the prologue's 2048) and one it hands back (K = 4096 with the prologue).
TEST_F(GpuKernels, SkinnyGemmSinglePassMatchesTheGenericKernelBitForBit) {
  struct Shape {
    int64_t n, k;
    bool silu, norm, add, f32;
  };
  for (const Shape& sh : std::vector<Shape>{{1024, 2048, false, false, false, false},
                                            {1024, 3072, false, false, false, true},
                                            {1001, 1024, false, false, false, false},
                                            {77, 64, false, false, false, true},
                                            {6144, 1024, true, true, true, false},
                                            {4096, 1024, false, true, true, false},
                                            {512, 2048, false, true, false, false},
                                            {300, 64, true, true, true, false},
                                            {256, 4096, false, true, true, false}}) {
    SCOPED_TRACE(std::to_string(sh.n) + "x" + std::to_string(sh.k) + (sh.silu ? " silu" : "") +
                 (sh.norm ? " norm" : "") + (sh.add ? " add" : "") + (sh.f32 ? " f32" : ""));
    std::vector<Bf16> hx, ha, hnw, hw;
    random_bf16(rng, 1, sh.k, 1.0, hx);
    random_bf16(rng, 1, sh.k, 4.0, ha);
    random_bf16(rng, 1, sh.k, 0.3, hnw);
    random_bf16(rng, sh.n, sh.k, 0.05, hw);
    DeviceBuffer<Bf16> dx(hx), da(ha), dnw(hnw), dw(hw);
    const int64_t out_n = sh.silu ? sh.n / 2 : sh.n;
    const auto run = [&](bool single_pass) {
      DeviceBuffer<uint8_t> y(static_cast<size_t>(out_n * (sh.f32 ? 4 : 2)));
      DeviceBuffer<Bf16> res(static_cast<size_t>(sh.k)), normed(static_cast<size_t>(sh.k)),
          gu(static_cast<size_t>(sh.n));
      for (auto* b : {&res, &normed, &gu})
        b->poison();
      y.poison();
      gpu::SkinnyGemmParams p;
      p.x = dx.get(), p.w = dw.get(), p.y = y.get(), p.y_f32 = sh.f32;
      p.m = 1, p.n = sh.n, p.k = sh.k, p.silu_mul = sh.silu, p.single_pass = single_pass;
      if (sh.silu) p.gate_up_out = gu.get();
      if (sh.norm) p.norm_weight = dnw.get(), p.normed_out = normed.get();
      if (sh.add) p.add = da.get(), p.residual_out = res.get();
      gpu::launch_skinny_gemm(p, nullptr);
      std::vector<uint8_t> all = y.download();
      for (auto* b : {&res, &normed, &gu}) {
        const std::vector<Bf16> v = b->download();
        const auto* bytes = reinterpret_cast<const uint8_t*>(v.data());
        all.insert(all.end(), bytes, bytes + v.size() * sizeof(Bf16));
      }
      return all;
    };
    const std::vector<uint8_t> single = run(true), generic = run(false);
    ASSERT_EQ(single.size(), generic.size());
    EXPECT_EQ(std::memcmp(single.data(), generic.data(), single.size()), 0);
  }
}

// The greedy argmax fused into the fp32 skinny GEMM: equal to the argmax kernel over the same
// output for random rows, for an exact tie planted at two rows (the lower id wins, wherever the
// two land among blocks), and -1 for a token whose row holds a NaN; the output is unchanged.
TEST_F(GpuKernels, SkinnyGemmFusedArgmax) {
  const int64_t n = 50021, k = 512;  // odd N: the last row pair has one row
  for (const int64_t m : {int64_t{1}, int64_t{2}, gpu::kSkinnyMaxM}) {
    SCOPED_TRACE(m);
    std::vector<Bf16> hx, hw;
    random_bf16(rng, m, k, 1.0, hx);
    random_bf16(rng, n, k, 0.05, hw);
    // rows 40000 and 123 identical and large for every token: an exact tie at the top.
    for (int64_t j = 0; j < k; ++j)
      hw[static_cast<size_t>(40000 * k + j)] = hw[static_cast<size_t>(123 * k + j)] =
          test::to_bf16(0.5 * (j % 2 == 0 ? 1 : -1));
    for (int64_t r = 0; r < m; ++r)  // each token's x aligned with that row
      for (int64_t j = 0; j < k; ++j)
        hx[static_cast<size_t>(r * k + j)] = test::to_bf16(j % 2 == 0 ? 1.0 : -1.0);
    for (const bool nan_row : {false, true}) {
      SCOPED_TRACE(nan_row ? "a NaN row" : "a tie");
      std::vector<Bf16> w = hw;
      if (nan_row) w[static_cast<size_t>(777 * k + 5)] = test::to_bf16(NAN);
      DeviceBuffer<Bf16> dx(hx), dw(w);
      DeviceBuffer<float> y(static_cast<size_t>(m * n)), y2(static_cast<size_t>(m * n));
      DeviceBuffer<unsigned long long> keys(static_cast<size_t>(m));
      DeviceBuffer<int32_t> ids(static_cast<size_t>(m));
      y.poison();
      y2.poison();
      ASSERT_EQ(cudaMemset(keys.get(), 0, keys.bytes()), cudaSuccess);
      gpu::SkinnyGemmParams p;
      p.x = dx.get(), p.w = dw.get(), p.y = y.get(), p.y_f32 = true, p.m = m, p.n = n, p.k = k;
      gpu::launch_skinny_gemm(p, nullptr);
      p.y = y2.get(), p.argmax_keys = keys.get();
      gpu::launch_skinny_gemm(p, nullptr);
      gpu::launch_argmax({y.get(), ids.get(), m, n}, nullptr);
      const std::vector<float> a = y.download(), b = y2.download();
      ASSERT_EQ(std::memcmp(a.data(), b.data(), a.size() * 4), 0)
          << "the fused argmax changed the output";
      const std::vector<unsigned long long> kh = keys.download();
      const std::vector<int32_t> want = ids.download();
      for (int64_t r = 0; r < m; ++r) {
        EXPECT_EQ(gpu::argmax_id(kh[static_cast<size_t>(r)]), want[static_cast<size_t>(r)])
            << "token " << r;
        EXPECT_EQ(want[static_cast<size_t>(r)], nan_row ? -1 : 123) << "token " << r;
      }
    }
  }
  gpu::SkinnyGemmParams bad;
  DeviceBuffer<Bf16> x(8), w(8);
  DeviceBuffer<unsigned long long> keys(1);
  bad.x = x.get(), bad.w = w.get(), bad.y = x.get(), bad.m = 1, bad.n = 1, bad.k = 8;
  bad.argmax_keys = keys.get();
  EXPECT_THAT(test::error_of([&] { gpu::launch_skinny_gemm(bad, nullptr); }),
              HasSubstr("argmax_keys needs an fp32 output"));
}

TEST_F(GpuKernels, SiluAndMul) {
  const int64_t t = 33, inter = 3072;
  std::vector<Bf16> hg;
  const Matrix gu = random_bf16(rng, t, 2 * inter, 2.0, hg);
  DeviceBuffer<Bf16> dg(hg), out(static_cast<size_t>(t * inter));
  out.poison();
  gpu::launch_silu_and_mul({dg.get(), out.get(), t, inter}, nullptr);
  const double e = rel_l2(to_doubles(out.download()), round_bf16(reference::silu_and_mul(gu).data));
  EXPECT_LE(e, kFlipBound) << e;
}

TEST_F(GpuKernels, EmbeddingGatherIsExactAndFlagsBadIds) {
  const int64_t vocab = 1000, hidden = 256;
  std::vector<Bf16> ht;
  const Matrix table = random_bf16(rng, vocab, hidden, 1.0, ht);
  const std::vector<int32_t> ids = {0, 999, 5, 5, -1, 1000, 17};
  DeviceBuffer<Bf16> dt(ht), out(ids.size() * hidden);
  DeviceBuffer<int32_t> di(ids), bad(std::vector<int32_t>{0});
  out.poison();
  gpu::launch_embedding(
      {di.get(), dt.get(), out.get(), bad.get(), static_cast<int64_t>(ids.size()), vocab, hidden},
      nullptr);
  const std::vector<double> got = to_doubles(out.download());
  for (size_t t = 0; t < ids.size(); ++t)
    for (int64_t j = 0; j < hidden; ++j) {
      const double g = got[t * hidden + static_cast<size_t>(j)];
      if (ids[t] < 0 || ids[t] >= vocab)
        ASSERT_TRUE(std::isnan(g)) << "token " << t;
      else
        ASSERT_EQ(g, table(ids[t], j)) << "token " << t;
    }
  EXPECT_EQ(bad.download()[0], 2);
}

TEST_F(GpuKernels, GemmMatchesTheFp64ProductForEveryShapeKind) {
  gpu::BlasLtGemm gemm;
  // decode (M = 1, 8), prefill, a non-power-of-two N, a long K
  for (const auto& [m, n, k] : std::vector<std::tuple<int64_t, int64_t, int64_t>>{
           {1, 1024, 1024}, {8, 3072, 1024}, {128, 1536, 2048}, {77, 1000, 4096}}) {
    SCOPED_TRACE(std::to_string(m) + "x" + std::to_string(n) + "x" + std::to_string(k));
    std::vector<Bf16> ha, hb;
    const Matrix a = random_bf16(rng, m, k, 1.0, ha), b = random_bf16(rng, n, k, 0.05, hb);
    DeviceBuffer<Bf16> da(ha), db(hb), dc(static_cast<size_t>(m * n));
    DeviceBuffer<float> df(static_cast<size_t>(m * n));
    dc.poison();
    df.poison();
    gemm.nt(da.get(), db.get(), dc.get(), gpu::GemmOut::kBf16, m, n, k, nullptr);
    gemm.nt(da.get(), db.get(), df.get(), gpu::GemmOut::kF32, m, n, k, nullptr);
    const Matrix want = reference::matmul_nt(a, b);
    const double e = rel_l2(to_doubles(dc.download()), round_bf16(want.data));
    EXPECT_LE(e, kFlipBound) << e;
    const std::vector<float> f = df.download();
    // fp32 output: only the fp32 accumulation, ~sqrt(K) 2^-24 relative per element.
    const double ef = rel_l2(std::vector<double>(f.begin(), f.end()), want.data);
    EXPECT_LE(ef, 16 * std::sqrt(static_cast<double>(k)) * std::ldexp(1.0, -24)) << ef;
    // Same shape, same algorithm: bit-identical on a rerun.
    DeviceBuffer<Bf16> dc2(static_cast<size_t>(m * n));
    gemm.nt(da.get(), db.get(), dc2.get(), gpu::GemmOut::kBf16, m, n, k, nullptr);
    const auto c1 = dc.download(), c2 = dc2.download();
    ASSERT_EQ(std::memcmp(c1.data(), c2.data(), c1.size() * sizeof(Bf16)), 0);
  }
}

// Three sequences of different lengths in one paged cache with shuffled blocks: every token's
// output against the fp64 causal attention of its sequence; then a decode step (the last token of
// each sequence alone) reproduces the prefill row bit for bit.
TEST_F(GpuKernels, PagedAttentionPrefillAndDecodeWithGqa) {
  const int64_t heads = 8, kv_heads = 2, block = 16;
  // Every row-load width: 2 (4-byte), 3 (2-byte), 4 (8-byte) and 8 (16-byte) elements per lane;
  // sequences of one, two and three key chunks (chunks of 128 or 256 positions).
  for (const int64_t d : {64, 96, 128, 256}) {
    const int64_t chunk = d == 128 ? 256 : 128;
    SCOPED_TRACE("head_dim " + std::to_string(d) + ", chunk " + std::to_string(chunk));
    const std::vector<int64_t> lens = {1, 37, 130, 300};
    const int64_t nseq = static_cast<int64_t>(lens.size());
    const int64_t max_blocks = 20, num_blocks = nseq * max_blocks;
    const int64_t max_chunks = (max_blocks * block + chunk - 1) / chunk;
    std::vector<int32_t> table(static_cast<size_t>(nseq * max_blocks));
    std::iota(table.begin(), table.end(), 0);
    std::shuffle(table.begin(), table.end(), rng);
    std::vector<int32_t> seq, pos;
    for (int32_t s = 0; s < nseq; ++s)
      for (int32_t p = 0; p < lens[static_cast<size_t>(s)]; ++p)
        seq.push_back(s), pos.push_back(p);
    const int64_t tokens = static_cast<int64_t>(seq.size());
    const int64_t qkv_w = (heads + 2 * kv_heads) * d;
    std::vector<Bf16> hqkv;
    const Matrix qkv = random_bf16(rng, tokens, qkv_w, 1.0, hqkv);
    DeviceBuffer<Bf16> dqkv(hqkv), kc(static_cast<size_t>(num_blocks * block * kv_heads * d)),
        vc(kc.size()), out(static_cast<size_t>(tokens * heads * d));
    DeviceBuffer<int32_t> dt(table), ds(seq), dp(pos);
    kc.poison();
    vc.poison();
    out.poison();
    const float scale = 1.f / std::sqrt(static_cast<float>(d));
    gpu::KvCacheWriteParams w{dqkv.get() + heads * d,
                              dqkv.get() + (heads + kv_heads) * d,
                              qkv_w,
                              qkv_w,
                              kc.get(),
                              vc.get(),
                              dt.get(),
                              ds.get(),
                              dp.get(),
                              tokens,
                              kv_heads,
                              d,
                              block,
                              max_blocks,
                              num_blocks};
    gpu::launch_kv_cache_write(w, nullptr);
    gpu::PagedAttentionParams a{dqkv.get(), qkv_w,     kc.get(),   vc.get(), dt.get(), ds.get(),
                                dp.get(),   out.get(), heads * d,  tokens,   heads,    kv_heads,
                                d,          block,     max_blocks, scale};
    const gpu::AttentionScratchSize sz = gpu::paged_attention_scratch(tokens, heads, d, max_chunks);
    DeviceBuffer<float> pacc(static_cast<size_t>(sz.acc)), pml(static_cast<size_t>(sz.ml));
    DeviceBuffer<uint32_t> done(std::vector<uint32_t>(static_cast<size_t>(sz.counters), 0u));
    a.chunk = chunk, a.max_chunks = max_chunks;
    a.partial_acc = pacc.get(), a.partial_ml = pml.get(), a.chunks_done = done.get();
    gpu::launch_paged_attention(a, nullptr);
    const std::vector<double> got = to_doubles(out.download());
    int64_t row0 = 0;
    for (size_t s = 0; s < lens.size(); ++s) {
      const int64_t n = lens[s];
      Matrix q(n, heads * d), k(n, kv_heads * d), v(n, kv_heads * d), g(n, heads * d);
      std::vector<int64_t> p(static_cast<size_t>(n));
      for (int64_t r = 0; r < n; ++r) {
        p[static_cast<size_t>(r)] = r;
        for (int64_t c = 0; c < heads * d; ++c)
          q(r, c) = qkv(row0 + r, c),
               g(r, c) = got[static_cast<size_t>((row0 + r) * heads * d + c)];
        for (int64_t c = 0; c < kv_heads * d; ++c)
          k(r, c) = qkv(row0 + r, heads * d + c),
               v(r, c) = qkv(row0 + r, (heads + kv_heads) * d + c);
      }
      const Matrix want = reference::causal_attention(q, k, v, p, p, heads, kv_heads, d,
                                                      1.0 / std::sqrt(static_cast<double>(d)));
      const double e = rel_l2(g.data, round_bf16(want.data));
      EXPECT_LE(e, kFlipBound) << "sequence " << s << ": " << e;
      row0 += n;
    }
    // Decode: the last token of each sequence, alone in the batch.
    std::vector<int32_t> dseq(lens.size()), dpos;
    std::iota(dseq.begin(), dseq.end(), 0);
    std::vector<int64_t> last_rows;
    row0 = 0;
    for (size_t s = 0; s < lens.size(); ++s) {
      dpos.push_back(static_cast<int32_t>(lens[s] - 1));
      last_rows.push_back(row0 + lens[s] - 1);
      row0 += lens[s];
    }
    std::vector<Bf16> hq;
    for (const int64_t r : last_rows)
      hq.insert(hq.end(), hqkv.begin() + r * qkv_w, hqkv.begin() + r * qkv_w + heads * d);
    DeviceBuffer<Bf16> dq(hq), dout(static_cast<size_t>(nseq * heads * d));
    DeviceBuffer<int32_t> dds(dseq), ddp(dpos);
    dout.poison();
    gpu::PagedAttentionParams dec = a;
    dec.q = dq.get();
    dec.q_stride = heads * d;
    dec.seq = dds.get();
    dec.pos = ddp.get();
    dec.out = dout.get();
    dec.tokens = nseq;
    gpu::launch_paged_attention(dec, nullptr);
    const std::vector<Bf16> decoded = dout.download(), prefill = out.download();
    for (size_t s = 0; s < lens.size(); ++s)
      ASSERT_EQ(std::memcmp(&decoded[s * heads * d], &prefill[last_rows[s] * heads * d],
                            heads * d * sizeof(Bf16)),
                0)
          << "decode differs from prefill for sequence " << s;
    for (const uint32_t c : done.download())
      ASSERT_EQ(c, 0u) << "a launch leaves the chunk counters at zero";
    // Too few chunks for a position: that token's output is NaN, never a silently short sum.
    dec.max_chunks = 1;
    dout.poison();
    gpu::launch_paged_attention(dec, nullptr);
    const std::vector<double> short_out = to_doubles(dout.download());
    for (size_t s = 0; s < lens.size(); ++s)
      EXPECT_EQ(std::isnan(short_out[s * static_cast<size_t>(heads * d)]), lens[s] > chunk)
          << "sequence " << s;
  }
}

// The query-tiled prefill attention: three sequences interleaved in one batch (tiles cut at
// sequence changes and every 16 rows; a 1-row tile), GQA, head_dim 64 and 128, against the fp64
// reference, and within the output rounding of the per-token kernel. A row's bits do not depend
// on its tile: the same rows re-tiled one by one give the same output.
// The fused decode attention against the two-launch pipeline it replaces (attention_prologue,
// then paged_attention), both tested against the fp64 reference above, on identical inputs: a
// cache with sequences of 1..5 key chunks, then (a) one decode token per sequence and (b) a short
// prefill (four tokens of one sequence across a chunk boundary, whose keys this launch must
// compute itself) beside a decode token. Outputs, the new K/V in the cache and the rope / norm
// captures agree within kFlipBound (bit for bit without the q/k norm, whose fp32 sum runs in
// another order); the chunk counters end at zero; a position beyond the chunks gives NaN.
TEST_F(GpuKernels, DecodeAttentionMatchesPrologueThenPagedAttention) {
  const int64_t heads = 8, kv_heads = 2, block = 16, chunk = 64;
  for (const int64_t d : {64, 96, 128}) {
    for (const bool qk_norm : {false, true}) {
      SCOPED_TRACE("head_dim " + std::to_string(d) + (qk_norm ? ", qk norm" : ", no qk norm"));
      const std::vector<int64_t> lens = {1, 37, 130, 300};  // cached positions per sequence
      const int64_t nseq = static_cast<int64_t>(lens.size()), max_blocks = 24;
      const int64_t num_blocks = nseq * max_blocks, max_chunks = max_blocks * block / chunk;
      std::vector<int32_t> table(static_cast<size_t>(num_blocks));
      std::iota(table.begin(), table.end(), 0);
      std::shuffle(table.begin(), table.end(), rng);
      const size_t cache_elems = static_cast<size_t>(num_blocks * block * kv_heads * d);
      std::vector<Bf16> hk, hv, hwq, hwk;
      random_bf16(rng, 1, static_cast<int64_t>(cache_elems), 1.0, hk);
      random_bf16(rng, 1, static_cast<int64_t>(cache_elems), 1.0, hv);
      random_bf16(rng, 1, d, 0.5, hwq);
      random_bf16(rng, 1, d, 0.5, hwk);
      const reference::Rope rope(rope_config(d, false));
      DeviceBuffer<double> di(rope.inv_freq());
      DeviceBuffer<Bf16> dwq(hwq), dwk(hwk);
      DeviceBuffer<int32_t> dt(table);
      const float scale = 1.f / std::sqrt(static_cast<float>(d));
      const int64_t qkv_w = (heads + 2 * kv_heads) * d, qk_w = (heads + kv_heads) * d;
      // (a) decode: sequence s at position lens[s]; (b) sequence 3 at 62..65 (crossing the
      // chunk at 64; its cache holds 0..61 then) and sequence 1 at 37.
      const std::vector<std::pair<std::vector<int32_t>, std::vector<int32_t>>> batches = {
          {{0, 1, 2, 3}, {1, 37, 130, 300}}, {{3, 3, 1, 3, 3}, {62, 63, 37, 64, 65}}};
      for (const auto& [seq, pos] : batches) {
        const int64_t t = static_cast<int64_t>(seq.size());
        SCOPED_TRACE(std::to_string(t) + " tokens");
        std::vector<Bf16> hqkv;
        random_bf16(rng, t, qkv_w, 1.0, hqkv);
        DeviceBuffer<Bf16> raw(hqkv), roped_in_place(hqkv), kc_a(hk), vc_a(hv), kc_b(hk), vc_b(hv);
        DeviceBuffer<Bf16> out_a(static_cast<size_t>(t * heads * d)), out_b(out_a.size());
        DeviceBuffer<Bf16> normed_a(static_cast<size_t>(t * qk_w)), normed_b(normed_a.size()),
            rope_b(normed_a.size());
        for (auto* b : {&out_a, &out_b, &normed_a, &normed_b, &rope_b})
          b->poison();
        DeviceBuffer<int32_t> ds(seq), dp(pos);
        const gpu::AttentionScratchSize sz = gpu::paged_attention_scratch(t, heads, d, max_chunks);
        DeviceBuffer<float> pacc(static_cast<size_t>(sz.acc)), pml(static_cast<size_t>(sz.ml));
        DeviceBuffer<uint32_t> done(std::vector<uint32_t>(static_cast<size_t>(sz.counters), 0u));
        // The pipeline.
        gpu::AttentionPrologueParams pro;
        pro.qkv = roped_in_place.get(), pro.row_stride = qkv_w, pro.positions = dp.get();
        if (qk_norm)
          pro.q_norm = dwq.get(), pro.k_norm = dwk.get(), pro.normed_out = normed_a.get();
        pro.inv_freq = di.get(), pro.k_cache = kc_a.get(), pro.v_cache = vc_a.get();
        pro.block_table = dt.get(), pro.seq = ds.get(), pro.tokens = t, pro.num_heads = heads;
        pro.num_kv_heads = kv_heads, pro.head_dim = d, pro.block_size = block;
        pro.max_blocks_per_seq = max_blocks;
        gpu::launch_attention_prologue(pro, nullptr);
        gpu::PagedAttentionParams pa;
        pa.q = roped_in_place.get(), pa.q_stride = qkv_w, pa.k_cache = kc_a.get();
        pa.v_cache = vc_a.get(), pa.block_table = dt.get(), pa.seq = ds.get(), pa.pos = dp.get();
        pa.out = out_a.get(), pa.out_stride = heads * d, pa.tokens = t, pa.num_heads = heads;
        pa.num_kv_heads = kv_heads, pa.head_dim = d, pa.block_size = block;
        pa.max_blocks_per_seq = max_blocks, pa.scale = scale, pa.chunk = 128;
        pa.max_chunks = max_chunks / 2, pa.partial_acc = pacc.get(), pa.partial_ml = pml.get();
        pa.chunks_done = done.get();
        gpu::launch_paged_attention(pa, nullptr);
        // The fused kernel.
        gpu::DecodeAttentionParams da;
        da.qkv = raw.get(), da.qkv_stride = qkv_w, da.positions = dp.get(), da.seq = ds.get();
        if (qk_norm) da.q_norm = dwq.get(), da.k_norm = dwk.get(), da.normed_out = normed_b.get();
        da.rope_out = rope_b.get(), da.inv_freq = di.get(), da.k_cache = kc_b.get();
        da.v_cache = vc_b.get(), da.block_table = dt.get(), da.block_size = block;
        da.max_blocks_per_seq = max_blocks, da.out = out_b.get(), da.out_stride = heads * d;
        da.tokens = t, da.num_heads = heads, da.num_kv_heads = kv_heads, da.head_dim = d;
        da.scale = scale, da.chunk = chunk, da.max_chunks = max_chunks;
        da.partial_acc = pacc.get(), da.partial_ml = pml.get(), da.chunks_done = done.get();
        // The short-prefill batch reads per-token table rows instead of the shared table.
        std::vector<int32_t> rows;
        for (const int32_t sq : seq)
          rows.insert(rows.end(), table.begin() + sq * max_blocks,
                      table.begin() + (sq + 1) * max_blocks);
        DeviceBuffer<int32_t> drows(rows);
        if (t == 5) da.token_table = drows.get();
        gpu::launch_decode_attention(da, nullptr);
        const auto close = [&](const std::vector<Bf16>& a, const std::vector<Bf16>& b,
                               const char* what) {
          if (!qk_norm) {
            EXPECT_EQ(std::memcmp(a.data(), b.data(), a.size() * sizeof(Bf16)), 0) << what;
          } else {
            const double e = rel_l2(to_doubles(b), to_doubles(a));
            EXPECT_LE(e, kFlipBound) << what << ": " << e;
          }
        };
        // Attention sums in another order (64-key chunks, 8 warps): within the flip bound.
        const double eo = rel_l2(to_doubles(out_b.download()), to_doubles(out_a.download()));
        EXPECT_LE(eo, kFlipBound) << "attention output: " << eo;
        close(kc_a.download(), kc_b.download(), "K cache");
        close(vc_a.download(), vc_b.download(), "V cache");
        // rope_out against the prologue's in-place q and k heads.
        const std::vector<Bf16> ip = roped_in_place.download(), rb = rope_b.download();
        std::vector<Bf16> want_rope;
        for (int64_t r = 0; r < t; ++r)
          want_rope.insert(want_rope.end(), ip.begin() + r * qkv_w, ip.begin() + r * qkv_w + qk_w);
        close(want_rope, rb, "rope_out");
        if (qk_norm) close(normed_a.download(), normed_b.download(), "normed_out");
        for (const uint32_t c : done.download())
          ASSERT_EQ(c, 0u) << "a launch leaves the chunk counters at zero";
        // Too few chunks for position 300: NaN for that token, never a short sum.
        da.max_chunks = 4;
        out_b.poison();
        gpu::launch_decode_attention(da, nullptr);
        const std::vector<double> short_out = to_doubles(out_b.download());
        for (int64_t r = 0; r < t; ++r)
          EXPECT_EQ(std::isnan(short_out[static_cast<size_t>(r * heads * d)]),
                    pos[static_cast<size_t>(r)] >= 4 * chunk)
              << "token " << r;
      }
    }
  }
}

TEST_F(GpuKernels, PrefillAttentionTiledMatchesTheReference) {
  EXPECT_EQ(gpu::plan_prefill_tiles({5, 5, 5, 2, 2, 5}),
            (std::vector<int32_t>{3, 0, 3, 3, 2, 5, 1}));
  std::vector<int32_t> many(40, 1);
  EXPECT_EQ(gpu::plan_prefill_tiles(many), (std::vector<int32_t>{3, 0, 16, 16, 16, 32, 8}));
  const int64_t heads = 8, kv_heads = 2, block = 16;
  for (const int64_t d : {64, 128}) {
    SCOPED_TRACE("head_dim " + std::to_string(d));
    const std::vector<int64_t> lens = {1, 77, 40};
    const int64_t nseq = static_cast<int64_t>(lens.size()), max_blocks = 8;
    std::vector<int32_t> table(static_cast<size_t>(nseq * max_blocks));
    std::iota(table.begin(), table.end(), 0);
    std::shuffle(table.begin(), table.end(), rng);
    // Rows: sequence 1's first 50, then sequence 0, then sequence 2, then sequence 1's rest.
    std::vector<int32_t> seq, pos;
    const auto add = [&](int32_t s, int32_t from, int32_t to) {
      for (int32_t p = from; p < to; ++p)
        seq.push_back(s), pos.push_back(p);
    };
    add(1, 0, 50), add(0, 0, 1), add(2, 0, 40), add(1, 50, 77);
    const int64_t tokens = static_cast<int64_t>(seq.size()), qkv_w = (heads + 2 * kv_heads) * d;
    std::vector<Bf16> hqkv;
    const Matrix qkv = random_bf16(rng, tokens, qkv_w, 1.0, hqkv);
    DeviceBuffer<Bf16> dqkv(hqkv),
        kc(static_cast<size_t>(nseq * max_blocks * block * kv_heads * d)), vc(kc.size()),
        out(static_cast<size_t>(tokens * heads * d)), ref_out(out.size()), one_out(out.size());
    DeviceBuffer<int32_t> dt(table), ds(seq), dp(pos);
    for (auto* b : {&kc, &vc, &out, &ref_out, &one_out})
      b->poison();
    gpu::launch_kv_cache_write({dqkv.get() + heads * d, dqkv.get() + (heads + kv_heads) * d, qkv_w,
                                qkv_w, kc.get(), vc.get(), dt.get(), ds.get(), dp.get(), tokens,
                                kv_heads, d, block, max_blocks, nseq * max_blocks},
                               nullptr);
    const std::vector<int32_t> tiles = gpu::plan_prefill_tiles(seq);
    DeviceBuffer<int32_t> dtiles(tiles);
    const float scale = 1.f / std::sqrt(static_cast<float>(d));
    gpu::PrefillAttentionParams pa;
    pa.q = dqkv.get(), pa.q_stride = qkv_w, pa.k_cache = kc.get(), pa.v_cache = vc.get();
    pa.block_table = dt.get(), pa.seq = ds.get(), pa.pos = dp.get(), pa.tiles = dtiles.get();
    pa.max_tiles = tokens, pa.out = out.get(), pa.out_stride = heads * d, pa.num_heads = heads;
    pa.num_kv_heads = kv_heads, pa.head_dim = d, pa.block_size = block;
    pa.max_blocks_per_seq = max_blocks, pa.scale = scale;
    gpu::launch_prefill_attention(pa, nullptr);
    const std::vector<Bf16> got_bits = out.download();
    const std::vector<double> got = to_doubles(got_bits);
    // fp64 reference per sequence, rows gathered in the batch's order.
    for (int32_t s = 0; s < nseq; ++s) {
      std::vector<int64_t> rows;
      for (int64_t i = 0; i < tokens; ++i)
        if (seq[static_cast<size_t>(i)] == s) rows.push_back(i);
      const int64_t n = static_cast<int64_t>(rows.size());
      Matrix q(n, heads * d), k(n, kv_heads * d), v(n, kv_heads * d), g(n, heads * d);
      std::vector<int64_t> p(static_cast<size_t>(n));
      for (int64_t r = 0; r < n; ++r) {
        const int64_t i = rows[static_cast<size_t>(r)];
        p[static_cast<size_t>(r)] = pos[static_cast<size_t>(i)];
        for (int64_t c = 0; c < heads * d; ++c)
          q(r, c) = qkv(i, c), g(r, c) = got[static_cast<size_t>(i * heads * d + c)];
        for (int64_t c = 0; c < kv_heads * d; ++c)
          k(r, c) = qkv(i, heads * d + c), v(r, c) = qkv(i, (heads + kv_heads) * d + c);
      }
      const Matrix want = reference::causal_attention(q, k, v, p, p, heads, kv_heads, d,
                                                      1.0 / std::sqrt(static_cast<double>(d)));
      const double e = rel_l2(g.data, round_bf16(want.data));
      EXPECT_LE(e, kFlipBound) << "sequence " << s << ": " << e;
    }
    // Against the per-token kernel on the same batch: within the output's rounding.
    gpu::PagedAttentionParams a{dqkv.get(), qkv_w,         kc.get(),   vc.get(), dt.get(), ds.get(),
                                dp.get(),   ref_out.get(), heads * d,  tokens,   heads,    kv_heads,
                                d,          block,         max_blocks, scale};
    a.chunk = max_blocks * block;
    gpu::launch_paged_attention(a, nullptr);
    EXPECT_LE(rel_l2(got, to_doubles(ref_out.download())), kFlipBound);
    // One row per tile: the same bits.
    std::vector<int32_t> single = {static_cast<int32_t>(tokens)};
    for (int32_t i = 0; i < tokens; ++i)
      single.push_back(i), single.push_back(1);
    DeviceBuffer<int32_t> dsingle(single);
    pa.tiles = dsingle.get(), pa.out = one_out.get();
    gpu::launch_prefill_attention(pa, nullptr);
    const std::vector<Bf16> one_bits = one_out.download();
    EXPECT_EQ(std::memcmp(one_bits.data(), got_bits.data(), got_bits.size() * sizeof(Bf16)), 0)
        << "a row's output depends on its tile";
  }
}

TEST_F(GpuKernels, MoeRoutingMatchesTheReferenceAndBreaksTiesLow) {
  const int64_t t = 200, e = 128, k = 8;
  std::vector<Bf16> hb;
  const Matrix logits = random_bf16(rng, t, e, 2.0, hb);
  const std::vector<float> hl(logits.data.begin(), logits.data.end());
  for (const bool norm : {true, false}) {
    DeviceBuffer<float> dl(hl);
    DeviceBuffer<int32_t> ids(static_cast<size_t>(t * k));
    DeviceBuffer<float> w(static_cast<size_t>(t * k));
    ids.poison();
    w.poison();
    gpu::launch_moe_routing({dl.get(), ids.get(), w.get(), t, e, k, norm}, nullptr);
    const auto gi = ids.download();
    const auto gw = w.download();
    const reference::Routing want = reference::route_topk(logits, k, norm);
    const Matrix probs = reference::router_softmax(logits);
    for (int64_t r = 0; r < t; ++r) {
      // Where two probabilities are within fp32 resolution the order may legitimately differ;
      // bf16 logits make exact ties possible, and those the rule fixes (lower index first).
      std::vector<double> pr(probs.row(r).begin(), probs.row(r).end());
      for (int64_t j = 0; j < k; ++j) {
        const int64_t want_id = want.ids[static_cast<size_t>(r)][static_cast<size_t>(j)];
        const int32_t got_id = gi[static_cast<size_t>(r * k + j)];
        ASSERT_TRUE(got_id >= 0 && got_id < e) << "token " << r << " slot " << j << ": " << got_id;
        if (got_id != want_id) {
          EXPECT_NEAR(pr[static_cast<size_t>(got_id)], pr[static_cast<size_t>(want_id)],
                      1e-6 * pr[static_cast<size_t>(want_id)])
              << "token " << r << " slot " << j;
        }
        EXPECT_NEAR(gw[static_cast<size_t>(r * k + j)],
                    want.weights[static_cast<size_t>(r)][static_cast<size_t>(j)],
                    2e-6 * want.weights[static_cast<size_t>(r)][static_cast<size_t>(j)] + 1e-12);
      }
    }
  }
  // Exact ties: equal logits everywhere pick experts 0..k-1 in order.
  std::vector<float> flat(static_cast<size_t>(e), 0.5f);
  DeviceBuffer<float> dl(flat);
  DeviceBuffer<int32_t> ids(static_cast<size_t>(k));
  DeviceBuffer<float> w(static_cast<size_t>(k));
  gpu::launch_moe_routing({dl.get(), ids.get(), w.get(), 1, e, k, true}, nullptr);
  const auto gi = ids.download();
  for (int32_t j = 0; j < k; ++j)
    EXPECT_EQ(gi[static_cast<size_t>(j)], j);
  for (const float x : w.download())
    EXPECT_FLOAT_EQ(x, 1.f / static_cast<float>(k));
}

// Gather and scatter are bit copies; the combine is the routing-weighted sum of a token's expert
// outputs in ascending expert id, rounded once.
// Grouping by expert on the device equals the host's stable counting sort; ids outside the
// experts are counted (and placed with expert 0, so indices stay in range). Then the grouped
// skinny GEMMs (gate_up with SiLU-and-mul, down) are bit-identical to one ungrouped launch per
// expert on that expert's rows.
TEST_F(GpuKernels, MoeGroupByExpertAndGroupedSkinnyGemm) {
  const int64_t t = gpu::kSkinnyMaxM, k = 4, experts = 16, h = 512, inter = 384;
  const int64_t n = t * k;
  std::vector<int32_t> ids(static_cast<size_t>(n));
  for (int64_t r = 0; r < t; ++r) {
    std::vector<int32_t> all(static_cast<size_t>(experts));
    std::iota(all.begin(), all.end(), 0);
    std::shuffle(all.begin(), all.end(), rng);
    for (int64_t j = 0; j < k; ++j)
      ids[static_cast<size_t>(r * k + j)] = all[static_cast<size_t>(j)];
  }
  DeviceBuffer<int32_t> di(ids), first(static_cast<size_t>(experts + 1)), rows(ids.size()),
      dest(ids.size()), active(static_cast<size_t>(1 + std::min(experts, n))),
      bad(std::vector<int32_t>{0});
  gpu::launch_moe_group_by_expert(
      {di.get(), first.get(), rows.get(), dest.get(), active.get(), bad.get(), n, experts, k},
      nullptr);
  // The host's stable grouping.
  std::vector<int32_t> want_first(static_cast<size_t>(experts + 1), 0), want_rows, want_dest,
      want_active = {0};
  for (int64_t x = 0; x < experts; ++x) {
    want_first[static_cast<size_t>(x)] = static_cast<int32_t>(want_rows.size());
    for (int64_t i = 0; i < n; ++i)
      if (ids[static_cast<size_t>(i)] == x)
        want_rows.push_back(static_cast<int32_t>(i / k)),
            want_dest.push_back(static_cast<int32_t>(i));
    if (static_cast<int32_t>(want_rows.size()) > want_first[static_cast<size_t>(x)])
      want_active.push_back(static_cast<int32_t>(x)), ++want_active[0];
  }
  want_first[static_cast<size_t>(experts)] = static_cast<int32_t>(n);
  EXPECT_EQ(first.download(), want_first);
  EXPECT_EQ(rows.download(), want_rows);
  EXPECT_EQ(dest.download(), want_dest);
  const std::vector<int32_t> got_active = active.download();
  EXPECT_EQ(std::vector<int32_t>(got_active.begin(), got_active.begin() + want_active.size()),
            want_active);
  EXPECT_EQ(bad.download()[0], 0);

  // Grouped GEMMs over the sorted rows.
  std::vector<Bf16> hx, hw13, hw2;
  const Matrix xm = random_bf16(rng, n, h, 1.0, hx);
  const Matrix w13m = random_bf16(rng, experts * 2 * inter, h, 0.05, hw13);
  random_bf16(rng, experts * h, inter, 0.05, hw2);
  DeviceBuffer<Bf16> dx(hx), dw13(hw13), dw2(hw2), act(static_cast<size_t>(n * inter)),
      y(static_cast<size_t>(n * h)), act1(act.size()), y1(y.size());
  for (auto* b : {&act, &y, &act1, &y1})
    b->poison();
  gpu::SkinnyGemmParams up;
  up.x = dx.get(), up.w = dw13.get(), up.y = act.get(), up.m = t, up.n = 2 * inter, up.k = h;
  up.silu_mul = true, up.group_first = first.get(), up.group_active = active.get();
  up.max_active = std::min(experts, n), up.w_group_stride = 2 * inter * h;
  gpu::launch_skinny_gemm(up, nullptr);
  gpu::SkinnyGemmParams down = up;
  down.x = act.get(), down.w = dw2.get(), down.y = y.get(), down.n = h, down.k = inter;
  down.silu_mul = false, down.w_group_stride = h * inter;
  gpu::launch_skinny_gemm(down, nullptr);
  const std::vector<Bf16> a_got = act.download(), y_got = y.download();
  for (int64_t x = 0; x < experts; ++x) {
    const int64_t a = want_first[static_cast<size_t>(x)],
                  m = want_first[static_cast<size_t>(x + 1)] - a;
    if (m == 0) continue;
    gpu::SkinnyGemmParams one;
    one.x = dx.get() + a * h, one.w = dw13.get() + x * 2 * inter * h,
    one.y = act1.get() + a * inter;
    one.m = m, one.n = 2 * inter, one.k = h, one.silu_mul = true;
    gpu::launch_skinny_gemm(one, nullptr);
    gpu::SkinnyGemmParams two;
    two.x = act.get() + a * inter, two.w = dw2.get() + x * h * inter, two.y = y1.get() + a * h;
    two.m = m, two.n = h, two.k = inter;
    gpu::launch_skinny_gemm(two, nullptr);
  }
  EXPECT_EQ(std::memcmp(a_got.data(), act1.download().data(), a_got.size() * sizeof(Bf16)), 0)
      << "grouped gate_up + SiLU-and-mul differs from per-expert launches";
  EXPECT_EQ(std::memcmp(y_got.data(), y1.download().data(), y_got.size() * sizeof(Bf16)), 0)
      << "grouped down differs from per-expert launches";
  // And the product itself, against fp64 on one expert's first row.
  const int64_t x0 = want_active[1], r0 = want_first[static_cast<size_t>(x0)];
  Matrix xr(1, h), wr(2 * inter, h);
  for (int64_t c = 0; c < h; ++c)
    xr(0, c) = xm(r0, c);
  for (int64_t r = 0; r < 2 * inter; ++r)
    for (int64_t c = 0; c < h; ++c)
      wr(r, c) = w13m(x0 * 2 * inter + r, c);
  Matrix gu = reference::matmul_nt(xr, wr);
  gu.data = round_bf16(gu.data);
  const Matrix want_act = reference::silu_and_mul(gu);
  const std::vector<double> all_act = to_doubles(a_got);
  const std::vector<double> got_row(all_act.begin() + r0 * inter,
                                    all_act.begin() + (r0 + 1) * inter);
  EXPECT_LE(rel_l2(got_row, round_bf16(want_act.data)), kFlipBound);

  // An id outside the experts is counted.
  ids[3] = -1;
  DeviceBuffer<int32_t> di2(ids);
  gpu::launch_moe_group_by_expert(
      {di2.get(), first.get(), rows.get(), dest.get(), active.get(), bad.get(), n, experts, k},
      nullptr);
  EXPECT_EQ(bad.download()[0], 1);
  EXPECT_EQ(first.download()[static_cast<size_t>(experts)], n) << "every pair is placed";
}

TEST_F(GpuKernels, MoeGatherScatterCombine) {
  const int64_t t = 50, k = 4, h = 512, experts = 16;
  std::vector<Bf16> hs;
  const Matrix slots = random_bf16(rng, t * k, h, 1.0, hs);
  std::vector<int32_t> ids(static_cast<size_t>(t * k));
  std::vector<float> w(ids.size());
  std::uniform_real_distribution<float> u(0.f, 1.f);
  for (int64_t r = 0; r < t; ++r) {
    std::vector<int32_t> all(static_cast<size_t>(experts));
    std::iota(all.begin(), all.end(), 0);
    std::shuffle(all.begin(), all.end(), rng);
    for (int64_t j = 0; j < k; ++j)
      ids[static_cast<size_t>(r * k + j)] = all[static_cast<size_t>(j)],
                                      w[static_cast<size_t>(r * k + j)] = u(rng);
  }
  DeviceBuffer<Bf16> ds(hs), out(static_cast<size_t>(t * h));
  DeviceBuffer<int32_t> di(ids);
  DeviceBuffer<float> dw(w);
  out.poison();
  gpu::launch_moe_combine({ds.get(), di.get(), dw.get(), out.get(), t, k, h}, nullptr);
  std::vector<double> want(static_cast<size_t>(t * h), 0.0);
  for (int64_t r = 0; r < t; ++r)
    for (int64_t j = 0; j < k; ++j)
      for (int64_t c = 0; c < h; ++c)
        want[static_cast<size_t>(r * h + c)] +=
            static_cast<double>(w[static_cast<size_t>(r * k + j)]) * slots(r * k + j, c);
  const double e = rel_l2(to_doubles(out.download()), round_bf16(want));
  EXPECT_LE(e, kFlipBound) << e;

  // Gather rows 7, 0, 7 of the slots, scatter them back to rows 1, 2, 3 of a fresh buffer.
  const std::vector<int32_t> rows = {7, 0, 7}, dest = {1, 2, 3};
  DeviceBuffer<int32_t> dr(rows), dd(dest);
  DeviceBuffer<Bf16> g(3 * static_cast<size_t>(h)), back(4 * static_cast<size_t>(h));
  g.poison();
  back.poison();
  gpu::launch_gather_rows({ds.get(), dr.get(), g.get(), 3, h, t * k}, nullptr);
  gpu::launch_scatter_rows({g.get(), dd.get(), back.get(), 3, h, 4}, nullptr);
  const std::vector<double> got = to_doubles(back.download());
  for (size_t i = 0; i < 3; ++i)
    for (int64_t c = 0; c < h; ++c)
      ASSERT_EQ(got[(dest[i]) * static_cast<size_t>(h) + static_cast<size_t>(c)],
                slots(rows[i], c));
  for (int64_t c = 0; c < h; ++c)
    ASSERT_TRUE(std::isnan(got[static_cast<size_t>(c)])) << "row 0 was not a destination";
}

// Launchers refuse bad parameters before touching the device: these run on CI without a GPU.
TEST(KernelLaunchers, RejectBadParametersByName) {
  using test::error_of;
  EXPECT_THAT(error_of([] { gpu::launch_rms_norm({}, nullptr); }), HasSubstr("rms_norm"));
  Bf16* fake = reinterpret_cast<Bf16*>(uintptr_t{256});
  EXPECT_THAT(
      error_of([&] {
        gpu::launch_rms_norm({fake, nullptr, nullptr, fake, fake, 4, 1, 64, 32, 1e-6f}, nullptr);
      }),
      HasSubstr("row_stride 32 < vectors_per_row * dim"));
  const int32_t* ip = reinterpret_cast<const int32_t*>(uintptr_t{256});
  const float* fp = reinterpret_cast<const float*>(uintptr_t{256});
  const double* dp = reinterpret_cast<const double*>(uintptr_t{256});
  gpu::AttentionPrologueParams ap;
  ap.qkv = fake, ap.positions = ip, ap.inv_freq = dp, ap.k_cache = fake, ap.v_cache = fake;
  ap.block_table = ip, ap.seq = ip, ap.tokens = 4, ap.num_heads = 2, ap.num_kv_heads = 1;
  ap.head_dim = 63, ap.row_stride = 4 * 63, ap.block_size = 16, ap.max_blocks_per_seq = 4;
  EXPECT_THAT(error_of([&] { gpu::launch_attention_prologue(ap, nullptr); }),
              HasSubstr("head_dim 63 must be even"));
  ap.head_dim = 64;
  ap.q_norm = fake;
  EXPECT_THAT(error_of([&] { gpu::launch_attention_prologue(ap, nullptr); }),
              HasSubstr("q_norm and k_norm come together"));
  gpu::SkinnyGemmParams sg;
  sg.x = fake, sg.w = fake, sg.y = fake, sg.m = gpu::kSkinnyMaxM + 1, sg.n = 64, sg.k = 64;
  EXPECT_THAT(error_of([&] { gpu::launch_skinny_gemm(sg, nullptr); }),
              HasSubstr("use the cuBLASLt GEMM"));
  sg.m = 2, sg.norm_weight = fake, sg.add = fake, sg.residual_out = fake;
  EXPECT_THAT(error_of([&] { gpu::launch_skinny_gemm(sg, nullptr); }), HasSubstr("may not alias"));
  sg.add = nullptr, sg.residual_out = nullptr, sg.n = 63, sg.silu_mul = true;
  EXPECT_THAT(error_of([&] { gpu::launch_skinny_gemm(sg, nullptr); }), HasSubstr("even N"));
  sg.n = 64, sg.silu_mul = false, sg.group_first = ip;
  EXPECT_THAT(error_of([&] { gpu::launch_skinny_gemm(sg, nullptr); }),
              HasSubstr("group_first and group_active go together"));
  sg.group_active = ip, sg.max_active = 4, sg.w_group_stride = 64;
  EXPECT_THAT(error_of([&] { gpu::launch_skinny_gemm(sg, nullptr); }),
              HasSubstr("w_group_stride >= N*K"));
  sg.group_first = sg.group_active = nullptr;
  EXPECT_THAT(error_of([&] {
                gpu::launch_moe_group_by_expert(
                    {ip, nullptr, nullptr, nullptr, nullptr, nullptr, 8, 4, 3}, nullptr);
              }),
              HasSubstr("every pointer is required"));
  gpu::PagedAttentionParams a{fake, 1024, fake, fake, ip,  ip, ip, fake,
                              1024, 1,    8,    3,    128, 16, 4,  0.1f};
  EXPECT_THAT(error_of([&] { gpu::launch_paged_attention(a, nullptr); }),
              HasSubstr("multiple of num_kv_heads"));
  a.num_kv_heads = 2;
  a.head_dim = 96 + 16;
  EXPECT_THAT(error_of([&] { gpu::launch_paged_attention(a, nullptr); }),
              HasSubstr("multiple of 32"));
  EXPECT_THAT(error_of([&] {
                gpu::launch_moe_routing(
                    {fp, const_cast<int32_t*>(ip), const_cast<float*>(fp), 1, 8, 9, true}, nullptr);
              }),
              HasSubstr("top_k 9"));
}

}  // namespace
}  // namespace qparity
