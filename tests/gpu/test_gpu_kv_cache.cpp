// The quantized KV cache on the GPU (kernels/kv_quant.h) against the reference's KV-cache methods
// (schemes/kv/kv_int8.h, kv_fp8.h), built and loaded the way the engine builds them
// (gpu::upload_kv_cache of a processed reference method):
//   - the codes every writer stores (the attention prologue, the fused decode attention for its
//     batch's own tokens, kv_cache_write) are the reference's store() codes bit for bit, for
//     kv-int8 symmetric and asymmetric (ties included: power-of-two scales put x * (1/s) on
//     half-integers) and kv-fp8 in the vLLM (saturating) and SGLang (bf16 quotient) rules;
//   - what kv_cache_read gives back (the capture points) is bf16(fp32 read) exactly, within half
//     a bf16 ULP of the reference's fp64 read;
//   - the attention kernels attend to what the cache holds: against fp64 attention over the
//     reference's round trip of K and V they agree within the output's rounding (plus, for
//     vLLM's fp8, the bf16 read the rule itself has), and against the unquantized K and V they
//     do not (the coarse test scales make the cache's own error ten times that); the
//     tensor-core prefill refuses a cache read in fp32 (int8, SGLang's fp8);
//   - the fused decode attention equals attention_prologue + paged_attention over the same
//     quantized cache.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <numeric>
#include <random>

#include "../unit/test_seed.h"
#include "core/codecs/float_format.h"
#include "core/error.h"
#include "gpu_engine/cuda_check.h"
#include "gpu_engine/device_buffer.h"
#include "gpu_engine/kernels/attention_prologue.h"
#include "gpu_engine/kernels/decode_attention.h"
#include "gpu_engine/kernels/paged_attention.h"
#include "gpu_engine/kernels/prefill_attention.h"
#include "gpu_engine/quant/kv_cache_upload.h"
#include "gpu_test.h"
#include "kernel_test_util.h"
#include "reference_cpu/layers/attention.h"
#include "reference_cpu/layers/rope.h"
#include "schemes/description/scheme_registry.h"
#include "schemes/kv/kv_fp8.h"
#include "schemes/kv/kv_int8.h"

namespace qparity {
namespace {

using gpu::DeviceBuffer;
using reference::KvWhich;
using test::Bf16;
using test::random_bf16;
using test::rel_l2;
using test::to_doubles;

struct KvCase {
  std::string name;
  std::string scheme;  // kv-int8 / kv-fp8
  Dialect dialect = Dialect::kVllm;
  bool asymmetric = false;
  double coarse = 1.0;  // scales multiplied by this (> 1: a coarse lattice, for attention tests)
};

std::vector<KvCase> cases(double coarse = 1.0) {
  return {{"kv-int8 sym", "kv-int8", Dialect::kVllm, false, coarse},
          {"kv-int8 asym", "kv-int8", Dialect::kVllm, true, coarse},
          {"kv-fp8 vllm", "kv-fp8", Dialect::kVllm, false, coarse},
          {"kv-fp8 sglang", "kv-fp8", Dialect::kSglang, false, coarse}};
}

// A processed reference KV method of `c` for [kv_heads * d] channels, values ~N(0, 1).
// int8: per-channel scales ~ amax/127 (every 4th channel a power of two, 1/32: ties), offsets
// integers in [-20, 20] when asymmetric; fp8: k_scale a power of two (2^-7: some |x/s| beyond 448
// saturate under vLLM), v_scale 0.0091 (an inexact quotient); SGLang's scales keep |x/s| <= 440,
// where its unclamped cast is defined.
std::unique_ptr<reference::KvCacheMethod> make_method(const KvCase& c, int64_t kv_heads, int64_t d,
                                                      std::mt19937_64& rng) {
  reference::KvShape shape{"model.layers.0.self_attn", kv_heads, d, DType::kBF16};
  reference::MethodConfig mc;
  mc.scheme = parse_scheme_id(c.scheme);
  mc.dialect = c.dialect;
  const int64_t ch = kv_heads * d;
  reference::TensorMap t;
  std::unique_ptr<reference::KvCacheMethod> m;
  if (c.scheme == "kv-int8") {
    m = reference::make_kv_int8_method(shape, mc);
    std::uniform_real_distribution<double> u(3.0 / 127, 5.0 / 127);
    std::uniform_int_distribution<int> off(-20, 20);
    for (const char* p : {"k_proj", "v_proj"}) {
      std::vector<double> s(static_cast<size_t>(ch)), o(s.size(), 0.0);
      for (int64_t i = 0; i < ch; ++i) {
        s[static_cast<size_t>(i)] =
            static_cast<double>(static_cast<float>(i % 4 == 0 ? 1.0 / 32 : u(rng))) * c.coarse;
        if (c.asymmetric) o[static_cast<size_t>(i)] = off(rng);
      }
      t[std::string(p) + ".kv_cache_scale"] =
          reference::encode(DType::kF32, {ch}, s, reference::Encoding::kExact, p);
      t[std::string(p) + ".kv_cache_offset"] =
          reference::encode(DType::kF32, {ch}, o, reference::Encoding::kExact, p);
    }
  } else {
    m = reference::make_kv_fp8_method(shape, mc);
    const bool sglang = c.dialect == Dialect::kSglang;
    const double ks = (sglang ? 5.0 / 440 : 0x1p-7) * c.coarse,
                 vs = (sglang ? 5.2 / 440 : 0.0091) * c.coarse;
    t["k_scale"] = reference::encode(DType::kF32, {1}, std::vector<double>{ks},
                                     reference::Encoding::kNearest, "k_scale");
    t["v_scale"] = reference::encode(DType::kF32, {1}, std::vector<double>{vs},
                                     reference::Encoding::kNearest, "v_scale");
  }
  m->load_all(t);
  m->process_weights_after_loading();
  return m;
}

// Values ~N(0, 1) as bf16, clipped where SGLang's unclamped cast would store NaN (the reference
// refuses those inputs).
Matrix kv_values(std::mt19937_64& rng, int64_t rows, int64_t cols, std::vector<Bf16>& host) {
  Matrix m = random_bf16(rng, rows, cols, 1.0, host);
  for (size_t i = 0; i < host.size(); ++i)
    if (std::fabs(m.data[i]) > 4.5) {
      host[i] = test::to_bf16(std::copysign(4.5, m.data[i]));
      m.data[i] = test::bf16_value(host[i]);
    }
  return m;
}

// The value a cache byte stands for, as the reference's codes say it: int8 the raw code, fp8 the
// e4m3 value (the reference's lattice code times 2^-9).
double byte_value(const KvCase& c, uint8_t b) {
  return c.scheme == "kv-int8" ? static_cast<double>(static_cast<int8_t>(b))
                               : codec::e4m3fn_to_double(b);
}
double ref_value(const KvCase& c, const reference::QuantizedMatrix& q, int64_t r, int64_t col) {
  return c.scheme == "kv-int8" ? static_cast<double>(q.code(r, col))
                               : static_cast<double>(q.code(r, col)) * q.lattice;
}

// Cache element offset of (sequence s, position p, channel e) under `table`.
int64_t cache_at(const std::vector<int32_t>& table, int64_t max_blocks, int64_t block,
                 int64_t kv_heads, int64_t d, int64_t s, int64_t p, int64_t e) {
  const int64_t b = table[static_cast<size_t>(s * max_blocks + p / block)];
  return ((b * block + p % block) * kv_heads) * d + e;
}

class GpuKvCache : public test::GpuTest {
 protected:
  std::mt19937_64 rng{test::test_seed()};
  const int64_t heads = 8, kv_heads = 2, block = 16, max_blocks = 16;
};

// Every writer's codes against the reference's store(), and the read-back.
TEST_F(GpuKvCache, WrittenCodesAreTheReferencesBitForBit) {
  const int64_t d = 128, kv = kv_heads * d, qkv_w = (heads + 2 * kv_heads) * d;
  const int64_t nseq = 2, num_blocks = nseq * max_blocks;
  std::vector<int32_t> table(static_cast<size_t>(num_blocks));
  std::iota(table.begin(), table.end(), 0);
  std::shuffle(table.begin(), table.end(), rng);
  DeviceBuffer<int32_t> dt(table);
  const reference::Rope rope([&] {
    ModelConfig c;
    c.head_dim = d;
    c.rope_theta = 1000000.0;
    return c;
  }());
  DeviceBuffer<double> di(rope.inv_freq());
  for (const KvCase& c : cases()) {
    SCOPED_TRACE(c.name);
    const auto m = make_method(c, kv_heads, d, rng);
    const gpu::GpuKvCache g = gpu::upload_kv_cache(*m, d);
    const size_t bytes = static_cast<size_t>(num_blocks * block * kv);
    // Three writers, each its own tokens: (0) the prologue, sequence 0 positions 0..39;
    // (1) kv_cache_write, sequence 1 positions 0..39; (2) decode attention, sequence 1
    // positions 40..43 (a short prefill: each of its tokens' K/V computed and stored in-launch).
    DeviceBuffer<uint8_t> kc(bytes), vc(bytes);
    kc.poison(0x7F), vc.poison(0x7F);  // 0x7F: int8 127, e4m3 NaN - never a silent match
    const int64_t t = 40;
    std::vector<Bf16> hqkv;
    Matrix qkv = kv_values(rng, t, qkv_w, hqkv);
    std::vector<int32_t> pos(static_cast<size_t>(t)), seq0(pos.size(), 0), seq1(pos.size(), 1);
    std::iota(pos.begin(), pos.end(), 0);
    DeviceBuffer<int32_t> dp(pos), ds0(seq0), ds1(seq1);
    DeviceBuffer<Bf16> dqkv(hqkv);
    gpu::AttentionPrologueParams pro;
    pro.qkv = dqkv.get(), pro.row_stride = qkv_w, pro.positions = dp.get(), pro.inv_freq = di.get();
    pro.k_cache = kc.get(), pro.v_cache = vc.get(), pro.kv = g.quant, pro.block_table = dt.get();
    pro.seq = ds0.get(), pro.tokens = t, pro.num_heads = heads, pro.num_kv_heads = kv_heads;
    pro.head_dim = d, pro.block_size = block, pro.max_blocks_per_seq = max_blocks;
    gpu::launch_attention_prologue(pro, nullptr);
    const std::vector<double> rotated = to_doubles(dqkv.download());  // K rotated in place
    std::vector<Bf16> hk, hv;
    const Matrix k1 = kv_values(rng, t, kv, hk), v1 = kv_values(rng, t, kv, hv);
    DeviceBuffer<Bf16> dk1(hk), dv1(hv);
    gpu::launch_kv_cache_write({.k = dk1.get(),
                                .v = dv1.get(),
                                .k_stride = kv,
                                .v_stride = kv,
                                .k_cache = kc.get(),
                                .v_cache = vc.get(),
                                .block_table = dt.get(),
                                .seq = ds1.get(),
                                .pos = dp.get(),
                                .tokens = t,
                                .num_kv_heads = kv_heads,
                                .head_dim = d,
                                .block_size = block,
                                .max_blocks_per_seq = max_blocks,
                                .num_blocks = num_blocks,
                                .kv = g.quant},
                               nullptr);
    const int64_t td = 4;
    std::vector<Bf16> hdq;
    const Matrix dq = kv_values(rng, td, qkv_w, hdq);
    std::vector<int32_t> dpos = {40, 41, 42, 43}, dseq(4, 1);
    DeviceBuffer<int32_t> ddp(dpos), dds(dseq);
    DeviceBuffer<Bf16> ddq(hdq), out(static_cast<size_t>(td * heads * d)),
        rope_out(static_cast<size_t>(td * (heads + kv_heads) * d));
    const int64_t chunk = 64, max_chunks = max_blocks * block / chunk;
    const gpu::AttentionScratchSize sz = gpu::paged_attention_scratch(td, heads, d, max_chunks);
    DeviceBuffer<float> pacc(static_cast<size_t>(sz.acc)), pml(static_cast<size_t>(sz.ml));
    DeviceBuffer<uint32_t> done(std::vector<uint32_t>(static_cast<size_t>(sz.counters), 0u));
    gpu::DecodeAttentionParams da;
    da.qkv = ddq.get(), da.qkv_stride = qkv_w, da.positions = ddp.get(), da.seq = dds.get();
    da.inv_freq = di.get(), da.k_cache = kc.get(), da.v_cache = vc.get(), da.kv = g.quant;
    da.block_table = dt.get(), da.block_size = block, da.max_blocks_per_seq = max_blocks;
    da.out = out.get(), da.out_stride = heads * d, da.rope_out = rope_out.get(), da.tokens = td;
    da.num_heads = heads, da.num_kv_heads = kv_heads, da.head_dim = d;
    da.scale = 1.f / std::sqrt(static_cast<float>(d)), da.chunk = chunk;
    da.max_chunks = max_chunks, da.partial_acc = pacc.get(), da.partial_ml = pml.get();
    da.chunks_done = done.get();
    gpu::launch_decode_attention(da, nullptr);
    const std::vector<double> droped = to_doubles(rope_out.download());
    const std::vector<uint8_t> kb = kc.download(), vb = vc.download();

    // What each writer was given: K (rotated where the kernel rotates) and V rows.
    struct Written {
      const char* who;
      int64_t seq, first_pos;
      Matrix k, v;
    };
    std::vector<Written> w(3);
    w[0] = {"attention_prologue", 0, 0, Matrix(t, kv), Matrix(t, kv)};
    w[1] = {"kv_cache_write", 1, 0, k1, v1};
    w[2] = {"decode_attention", 1, 40, Matrix(td, kv), Matrix(td, kv)};
    for (int64_t i = 0; i < t; ++i)
      for (int64_t e = 0; e < kv; ++e) {
        w[0].k(i, e) = rotated[static_cast<size_t>(i * qkv_w + heads * d + e)];
        w[0].v(i, e) = qkv(i, heads * d + kv + e);
      }
    for (int64_t i = 0; i < td; ++i)
      for (int64_t e = 0; e < kv; ++e) {
        w[2].k(i, e) = droped[static_cast<size_t>(i * (heads + kv_heads) * d + heads * d + e)];
        w[2].v(i, e) = dq(i, heads * d + kv + e);
      }
    int64_t compared = 0, ties = 0;
    for (const Written& x : w) {
      SCOPED_TRACE(x.who);
      for (const KvWhich which : {KvWhich::kKey, KvWhich::kValue}) {
        const Matrix& in = which == KvWhich::kKey ? x.k : x.v;
        const reference::QuantizedMatrix ref = m->store(which, in);
        const std::vector<uint8_t>& cache = which == KvWhich::kKey ? kb : vb;
        int64_t bad = 0;
        for (int64_t i = 0; i < in.rows; ++i)
          for (int64_t e = 0; e < kv; ++e) {
            const uint8_t b = cache[static_cast<size_t>(
                cache_at(table, max_blocks, block, kv_heads, d, x.seq, x.first_pos + i, e))];
            const double got = byte_value(c, b), want = ref_value(c, ref, i, e);
            ++compared;
            if (!(got == want) && bad++ < 5)
              ADD_FAILURE() << to_string(which) << " row " << i << " channel " << e << ": x "
                            << in(i, e) << " stored " << got << ", the reference " << want;
            if (c.scheme == "kv-int8") {  // a tie of x * (1/s) + o, when it is exactly one
              const double r = static_cast<double>(
                  1.0f /
                  static_cast<float>(static_cast<const reference::KvInt8CacheMethod&>(*m).scales(
                      which)[static_cast<size_t>(e)]));
              const double y = static_cast<double>(static_cast<float>(
                  static_cast<float>(in(i, e) * r) +
                  static_cast<float>(static_cast<const reference::KvInt8CacheMethod&>(*m).offsets(
                      which)[static_cast<size_t>(e)])));
              ties += std::fabs(y - std::floor(y) - 0.5) == 0.0;
            }
          }
        EXPECT_EQ(bad, 0);
      }
    }
    if (c.scheme == "kv-int8") {
      EXPECT_GT(ties, 0) << "the power-of-two scales must hit ties";
    }
    std::cout << c.name << ": " << compared << " codes equal the reference's";
    if (c.scheme == "kv-int8") std::cout << " (" << ties << " ties)";
    std::cout << "\n";

    // Read back (the capture points): bf16(fp32 read) exactly, near the fp64 read.
    DeviceBuffer<Bf16> rk(static_cast<size_t>(t * kv)), rv(rk.size());
    rk.poison(), rv.poison();
    gpu::launch_kv_cache_read({.k_cache = kc.get(),
                               .v_cache = vc.get(),
                               .k = rk.get(),
                               .v = rv.get(),
                               .k_stride = kv,
                               .v_stride = kv,
                               .block_table = dt.get(),
                               .seq = ds1.get(),
                               .pos = dp.get(),
                               .tokens = t,
                               .num_kv_heads = kv_heads,
                               .head_dim = d,
                               .block_size = block,
                               .max_blocks_per_seq = max_blocks,
                               .kv = g.quant},
                              nullptr);
    for (const KvWhich which : {KvWhich::kKey, KvWhich::kValue}) {
      const std::vector<double> got =
          to_doubles(which == KvWhich::kKey ? rk.download() : rv.download());
      const Matrix fp64 = m->round_trip(which, which == KvWhich::kKey ? k1 : v1);
      const reference::QuantizedMatrix codes = m->store(which, which == KvWhich::kKey ? k1 : v1);
      int64_t bad = 0;
      double worst = 0;
      for (int64_t i = 0; i < t; ++i)
        for (int64_t e = 0; e < kv; ++e) {
          float f;
          if (c.scheme == "kv-int8") {
            const auto& mi = static_cast<const reference::KvInt8CacheMethod&>(*m);
            f = (static_cast<float>(codes.code(i, e)) -
                 static_cast<float>(mi.offsets(which)[static_cast<size_t>(e)])) *
                static_cast<float>(mi.scales(which)[static_cast<size_t>(e)]);
          } else {
            f = static_cast<float>(ref_value(c, codes, i, e)) *
                static_cast<float>(
                    static_cast<const reference::KvFp8CacheMethod&>(*m).scale(which));
          }
          const double want = codec::bf16_to_double(codec::double_to_bf16(f));
          const double g2 = got[static_cast<size_t>(i * kv + e)];
          if (!(g2 == want) && bad++ < 5)
            ADD_FAILURE() << "read back row " << i << " channel " << e << ": " << g2 << " vs "
                          << want;
          if (fp64(i, e) != 0)
            worst = std::max(worst, std::fabs(g2 - fp64(i, e)) / std::fabs(fp64(i, e)));
        }
      EXPECT_EQ(bad, 0) << to_string(which);
      // Half a bf16 ULP is at most 2^-8 of the value (at the bottom of a binade).
      EXPECT_LE(worst, 0x1p-8) << "the capture is the fp64 read rounded once to bf16";
    }
  }
  // SGLang's unclamped cast: beyond 464 the GPU stores NaN (the reference refuses the input).
  {
    const KvCase c = cases()[3];
    const auto m = make_method(c, kv_heads, d, rng);
    const gpu::GpuKvCache g = gpu::upload_kv_cache(*m, d);
    std::vector<Bf16> hk(static_cast<size_t>(kv), test::to_bf16(0.0)), hv = hk;
    hk[3] = test::to_bf16(470.0 * g.quant.k_scale);  // x/s beyond 464
    hk[5] = test::to_bf16(450.0 * g.quant.k_scale);  // in (448, 464]: 448
    DeviceBuffer<Bf16> dk(hk), dv(hv);
    DeviceBuffer<uint8_t> kc(static_cast<size_t>(block * kv)), vc(kc.size());
    DeviceBuffer<int32_t> z(std::vector<int32_t>{0}), zt(std::vector<int32_t>{0});
    gpu::launch_kv_cache_write({.k = dk.get(),
                                .v = dv.get(),
                                .k_stride = kv,
                                .v_stride = kv,
                                .k_cache = kc.get(),
                                .v_cache = vc.get(),
                                .block_table = zt.get(),
                                .seq = z.get(),
                                .pos = z.get(),
                                .tokens = 1,
                                .num_kv_heads = kv_heads,
                                .head_dim = d,
                                .block_size = block,
                                .max_blocks_per_seq = 1,
                                .num_blocks = 1,
                                .kv = g.quant},
                               nullptr);
    const std::vector<uint8_t> b = kc.download();
    EXPECT_TRUE(std::isnan(codec::e4m3fn_to_double(b[3]))) << "byte " << int(b[3]);
    EXPECT_EQ(codec::e4m3fn_to_double(b[5]), 448.0);
  }
}

// fp64 attention of `q` rows (positions pos, one sequence each) over K and V rows 0..pos.
Matrix reference_attention(const Matrix& q, const std::vector<Matrix>& k,
                           const std::vector<Matrix>& v, const std::vector<int32_t>& seq,
                           const std::vector<int32_t>& pos, int64_t heads, int64_t kv_heads,
                           int64_t d) {
  Matrix out(q.rows, q.cols);
  for (int64_t i = 0; i < q.rows; ++i) {
    const Matrix& ks = k[static_cast<size_t>(seq[static_cast<size_t>(i)])];
    const Matrix& vs = v[static_cast<size_t>(seq[static_cast<size_t>(i)])];
    const int64_t n = pos[static_cast<size_t>(i)] + 1;
    Matrix qi(1, q.cols), kn(n, ks.cols), vn(n, vs.cols);
    std::copy_n(q.data.begin() + i * q.cols, q.cols, qi.data.begin());
    std::copy_n(ks.data.begin(), n * ks.cols, kn.data.begin());
    std::copy_n(vs.data.begin(), n * vs.cols, vn.data.begin());
    std::vector<int64_t> qp = {n - 1}, kp(static_cast<size_t>(n));
    std::iota(kp.begin(), kp.end(), 0);
    const Matrix o = reference::causal_attention(qi, kn, vn, qp, kp, heads, kv_heads, d,
                                                 1.0 / std::sqrt(static_cast<double>(d)));
    std::copy(o.data.begin(), o.data.end(), out.data.begin() + i * q.cols);
  }
  return out;
}

// The paged (per-token) and the tiled prefill kernel over a cache written by kv_cache_write,
// against fp64 attention over the reference's round trip (coarse scales: the cache's own error
// is then ~10x the bf16 read's, so attending to unquantized values would fail).
TEST_F(GpuKvCache, AttentionKernelsReadWhatTheCacheHolds) {
  for (const int64_t d : {64, 128}) {
    const int64_t kv = kv_heads * d;
    const std::vector<int64_t> lens = {1, 70, 200};
    const int64_t nseq = static_cast<int64_t>(lens.size()), num_blocks = nseq * max_blocks;
    std::vector<int32_t> table(static_cast<size_t>(num_blocks));
    std::iota(table.begin(), table.end(), 0);
    std::shuffle(table.begin(), table.end(), rng);
    DeviceBuffer<int32_t> dt(table);
    for (const KvCase& c : cases(8.0)) {
      SCOPED_TRACE(c.name + ", head_dim " + std::to_string(d));
      const auto m = make_method(c, kv_heads, d, rng);
      const gpu::GpuKvCache g = gpu::upload_kv_cache(*m, d);
      const size_t bytes = static_cast<size_t>(num_blocks * block * kv);
      DeviceBuffer<uint8_t> kc(bytes), vc(bytes);
      std::vector<Matrix> k, v, kq, vq;
      for (int64_t s = 0; s < nseq; ++s) {
        const int64_t n = lens[static_cast<size_t>(s)];
        std::vector<Bf16> hk, hv;
        k.push_back(kv_values(rng, n, kv, hk));
        v.push_back(kv_values(rng, n, kv, hv));
        kq.push_back(m->round_trip(KvWhich::kKey, k.back()));
        vq.push_back(m->round_trip(KvWhich::kValue, v.back()));
        DeviceBuffer<Bf16> dk(hk), dv(hv);
        std::vector<int32_t> p(static_cast<size_t>(n)), sq(p.size(), static_cast<int32_t>(s));
        std::iota(p.begin(), p.end(), 0);
        DeviceBuffer<int32_t> dp(p), dsq(sq);
        gpu::launch_kv_cache_write({.k = dk.get(),
                                    .v = dv.get(),
                                    .k_stride = kv,
                                    .v_stride = kv,
                                    .k_cache = kc.get(),
                                    .v_cache = vc.get(),
                                    .block_table = dt.get(),
                                    .seq = dsq.get(),
                                    .pos = dp.get(),
                                    .tokens = n,
                                    .num_kv_heads = kv_heads,
                                    .head_dim = d,
                                    .block_size = block,
                                    .max_blocks_per_seq = max_blocks,
                                    .num_blocks = num_blocks,
                                    .kv = g.quant},
                                   nullptr);
      }
      // Queries: the last position of each sequence (paged), and sequence 2's last 20 rows
      // beside sequence 1's last (tiled).
      std::vector<int32_t> seq = {0, 1, 2}, pos = {0, 69, 199};
      for (int32_t p = 180; p < 199; ++p)
        seq.push_back(2), pos.push_back(p);
      const int64_t t = static_cast<int64_t>(seq.size());
      std::vector<Bf16> hq;
      const Matrix q = random_bf16(rng, t, heads * d, 1.0, hq);
      const Matrix want = reference_attention(q, kq, vq, seq, pos, heads, kv_heads, d);
      const Matrix plain = reference_attention(q, k, v, seq, pos, heads, kv_heads, d);
      DeviceBuffer<Bf16> dq(hq), out(static_cast<size_t>(t * heads * d));
      DeviceBuffer<int32_t> ds(seq), dp(pos);
      const float scale = 1.f / std::sqrt(static_cast<float>(d));
      for (const bool tiled : {false, true}) {
        SCOPED_TRACE(tiled ? "prefill_attention" : "paged_attention");
        out.poison();
        if (tiled && !g.quant.read_bf16) {
          gpu::PrefillAttentionParams pa;
          pa.q = dq.get(), pa.q_stride = heads * d, pa.k_cache = kc.get(), pa.v_cache = vc.get();
          pa.kv = g.quant, pa.block_table = dt.get(), pa.seq = ds.get(), pa.pos = dp.get();
          pa.tiles = ds.get(), pa.max_tiles = 1, pa.out = out.get(), pa.out_stride = heads * d;
          pa.num_heads = heads, pa.num_kv_heads = kv_heads, pa.head_dim = d, pa.block_size = block;
          pa.max_blocks_per_seq = max_blocks, pa.scale = scale;
          EXPECT_THROW(gpu::launch_prefill_attention(pa, nullptr), Error)
              << "a cache read in fp32 has no bf16 tensor-core path";
          continue;
        }
        if (tiled) {
          const std::vector<int32_t> tiles = gpu::plan_prefill_tiles(seq);
          DeviceBuffer<int32_t> dtiles(tiles);
          gpu::PrefillAttentionParams pa;
          pa.q = dq.get(), pa.q_stride = heads * d, pa.k_cache = kc.get(), pa.v_cache = vc.get();
          pa.kv = g.quant, pa.block_table = dt.get(), pa.seq = ds.get(), pa.pos = dp.get();
          pa.tiles = dtiles.get(), pa.max_tiles = tiles[0], pa.out = out.get();
          pa.out_stride = heads * d, pa.num_heads = heads, pa.num_kv_heads = kv_heads;
          pa.head_dim = d, pa.block_size = block, pa.max_blocks_per_seq = max_blocks;
          pa.scale = scale;
          gpu::launch_prefill_attention(pa, nullptr);
        } else {
          gpu::PagedAttentionParams pa;
          pa.q = dq.get(), pa.q_stride = heads * d, pa.k_cache = kc.get(), pa.v_cache = vc.get();
          pa.kv = g.quant, pa.block_table = dt.get(), pa.seq = ds.get(), pa.pos = dp.get();
          pa.out = out.get(), pa.out_stride = heads * d, pa.tokens = t, pa.num_heads = heads;
          pa.num_kv_heads = kv_heads, pa.head_dim = d, pa.block_size = block;
          pa.max_blocks_per_seq = max_blocks, pa.scale = scale, pa.chunk = 256, pa.max_chunks = 1;
          gpu::launch_paged_attention(pa, nullptr);
        }
        const std::vector<double> got = to_doubles(out.download());
        const double e = rel_l2(got, want.data), e_plain = rel_l2(got, plain.data);
        EXPECT_LE(e, 4e-3) << "vs attention over the cache's round trip";
        EXPECT_GT(e_plain, 5 * e) << "the kernel must attend to the quantized values";
        std::cout << c.name << " head_dim " << d << (tiled ? " prefill" : " paged") << ": rel_l2 "
                  << e << " vs the round trip, " << e_plain << " vs unquantized K/V\n";
      }
    }
  }
}

// The fused decode attention against attention_prologue + paged_attention on the same quantized
// cache and inputs: the same codes stored, outputs within the flip bound.
TEST_F(GpuKvCache, DecodeAttentionEqualsPrologueThenPagedOnAQuantizedCache) {
  const int64_t d = 128, kv = kv_heads * d, qkv_w = (heads + 2 * kv_heads) * d, nseq = 3;
  const int64_t num_blocks = nseq * max_blocks, chunk = 64, max_chunks = max_blocks * block / chunk;
  std::vector<int32_t> table(static_cast<size_t>(num_blocks));
  std::iota(table.begin(), table.end(), 0);
  std::shuffle(table.begin(), table.end(), rng);
  DeviceBuffer<int32_t> dt(table);
  ModelConfig rc;
  rc.head_dim = d;
  rc.rope_theta = 1000000.0;
  const reference::Rope rope(rc);
  DeviceBuffer<double> di(rope.inv_freq());
  const std::vector<int32_t> seq = {0, 1, 2, 2}, pos = {5, 100, 130, 131};
  const int64_t t = static_cast<int64_t>(seq.size());
  DeviceBuffer<int32_t> ds(seq), dp(pos);
  for (const KvCase& c : cases()) {
    SCOPED_TRACE(c.name);
    const auto m = make_method(c, kv_heads, d, rng);
    const gpu::GpuKvCache g = gpu::upload_kv_cache(*m, d);
    const size_t bytes = static_cast<size_t>(num_blocks * block * kv);
    // A cache of valid codes: written from random rows at every position.
    DeviceBuffer<uint8_t> kc_a(bytes), vc_a(bytes);
    {
      const int64_t n = max_blocks * block;
      for (int32_t s = 0; s < nseq; ++s) {
        std::vector<Bf16> hk, hv;
        kv_values(rng, n, kv, hk);
        kv_values(rng, n, kv, hv);
        DeviceBuffer<Bf16> dk(hk), dv(hv);
        std::vector<int32_t> p(static_cast<size_t>(n)), sq(p.size(), s);
        std::iota(p.begin(), p.end(), 0);
        DeviceBuffer<int32_t> dpp(p), dsq(sq);
        gpu::launch_kv_cache_write({.k = dk.get(),
                                    .v = dv.get(),
                                    .k_stride = kv,
                                    .v_stride = kv,
                                    .k_cache = kc_a.get(),
                                    .v_cache = vc_a.get(),
                                    .block_table = dt.get(),
                                    .seq = dsq.get(),
                                    .pos = dpp.get(),
                                    .tokens = n,
                                    .num_kv_heads = kv_heads,
                                    .head_dim = d,
                                    .block_size = block,
                                    .max_blocks_per_seq = max_blocks,
                                    .num_blocks = num_blocks,
                                    .kv = g.quant},
                                   nullptr);
      }
    }
    DeviceBuffer<uint8_t> kc_b(bytes), vc_b(bytes);
    QPARITY_CUDA_CHECK(cudaMemcpy(kc_b.get(), kc_a.get(), bytes, cudaMemcpyDeviceToDevice));
    QPARITY_CUDA_CHECK(cudaMemcpy(vc_b.get(), vc_a.get(), bytes, cudaMemcpyDeviceToDevice));
    std::vector<Bf16> hqkv;
    kv_values(rng, t, qkv_w, hqkv);
    DeviceBuffer<Bf16> raw(hqkv), roped(hqkv), out_a(static_cast<size_t>(t * heads * d)),
        out_b(out_a.size());
    out_a.poison(), out_b.poison();
    const gpu::AttentionScratchSize sz = gpu::paged_attention_scratch(t, heads, d, max_chunks);
    DeviceBuffer<float> pacc(static_cast<size_t>(sz.acc)), pml(static_cast<size_t>(sz.ml));
    DeviceBuffer<uint32_t> done(std::vector<uint32_t>(static_cast<size_t>(sz.counters), 0u));
    const float scale = 1.f / std::sqrt(static_cast<float>(d));
    gpu::AttentionPrologueParams pro;
    pro.qkv = roped.get(), pro.row_stride = qkv_w, pro.positions = dp.get(),
    pro.inv_freq = di.get();
    pro.k_cache = kc_a.get(), pro.v_cache = vc_a.get(), pro.kv = g.quant,
    pro.block_table = dt.get();
    pro.seq = ds.get(), pro.tokens = t, pro.num_heads = heads, pro.num_kv_heads = kv_heads;
    pro.head_dim = d, pro.block_size = block, pro.max_blocks_per_seq = max_blocks;
    gpu::launch_attention_prologue(pro, nullptr);
    gpu::PagedAttentionParams pa;
    pa.q = roped.get(), pa.q_stride = qkv_w, pa.k_cache = kc_a.get(), pa.v_cache = vc_a.get();
    pa.kv = g.quant, pa.block_table = dt.get(), pa.seq = ds.get(), pa.pos = dp.get();
    pa.out = out_a.get(), pa.out_stride = heads * d, pa.tokens = t, pa.num_heads = heads;
    pa.num_kv_heads = kv_heads, pa.head_dim = d, pa.block_size = block;
    pa.max_blocks_per_seq = max_blocks, pa.scale = scale, pa.chunk = 256, pa.max_chunks = 1;
    gpu::launch_paged_attention(pa, nullptr);
    gpu::DecodeAttentionParams da;
    da.qkv = raw.get(), da.qkv_stride = qkv_w, da.positions = dp.get(), da.seq = ds.get();
    da.inv_freq = di.get(), da.k_cache = kc_b.get(), da.v_cache = vc_b.get(), da.kv = g.quant;
    da.block_table = dt.get(), da.block_size = block, da.max_blocks_per_seq = max_blocks;
    da.out = out_b.get(), da.out_stride = heads * d, da.tokens = t, da.num_heads = heads;
    da.num_kv_heads = kv_heads, da.head_dim = d, da.scale = scale, da.chunk = chunk;
    da.max_chunks = max_chunks, da.partial_acc = pacc.get(), da.partial_ml = pml.get();
    da.chunks_done = done.get();
    gpu::launch_decode_attention(da, nullptr);
    EXPECT_TRUE(kc_a.download() == kc_b.download()) << "K codes";
    EXPECT_TRUE(vc_a.download() == vc_b.download()) << "V codes";
    const double e = rel_l2(to_doubles(out_b.download()), to_doubles(out_a.download()));
    EXPECT_LE(e, test::kFlipBound) << "attention output";
  }
}

// No device needed: the launchers refuse an int8 cache without its channels, fp8 without scales.
TEST(GpuKvCacheChecks, LaunchersRefuseAQuantizedCacheWithoutItsParameters) {
  gpu::KvQuant q;
  q.format = gpu::KvCacheFormat::kInt8;
  EXPECT_THROW(gpu::require_kv_quant("k", q, 2, 64), Error);
  q.format = gpu::KvCacheFormat::kFp8E4m3;
  q.k_scale = 0.f;
  EXPECT_THROW(gpu::require_kv_quant("k", q, 2, 64), Error);
  q.k_scale = 1.f;
  EXPECT_NO_THROW(gpu::require_kv_quant("k", q, 2, 64));
  EXPECT_EQ(gpu::kv_element_bytes(gpu::KvCacheFormat::kInt8), 1u);
  EXPECT_EQ(gpu::kv_element_bytes(gpu::KvCacheFormat::kBf16), 2u);
}

}  // namespace
}  // namespace qparity
