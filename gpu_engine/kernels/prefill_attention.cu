#include <cmath>
#include <cstdint>

#include "gpu_engine/kernels/kv_quant.cuh"
#include "gpu_engine/kernels/launch_check.h"
#include "gpu_engine/kernels/mma_sync.cuh"
#include "gpu_engine/kernels/paged_attention.h"
#include "gpu_engine/kernels/pdl.h"
#include "gpu_engine/kernels/prefill_attention.h"

namespace qparity::gpu {

namespace {

constexpr int kChunk = 32;  // keys staged in shared memory per step
static_assert(kPrefillTileRows == 16, "a tile is one m16 row block of the tensor-core products");

__device__ __forceinline__ void mma_tf32_1688(float (&c)[4], const uint32_t (&a)[4], uint32_t b0,
                                              uint32_t b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k8.row.col.f32.tf32.tf32.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, "
      "{%8,%9}, {%0,%1,%2,%3};\n"
      : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

__device__ __forceinline__ void ldmatrix_x4(uint32_t (&r)[4], const void* smem_row) {
  const uint32_t a = static_cast<uint32_t>(__cvta_generic_to_shared(smem_row));
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(a));
}

// fp32 -> tf32, round to nearest (ties away), as an fp32 bit pattern with the low 13 bits zero.
__device__ __forceinline__ float round_tf32(float x) {
  uint32_t r;
  asm("cvt.rna.tf32.f32 %0, %1;\n" : "=r"(r) : "f"(x));
  return __uint_as_float(r);
}

__device__ __forceinline__ uint32_t bf16_bits_as_f32(__nv_bfloat16 v) {
  return static_cast<uint32_t>(__bfloat16_as_ushort(v)) << 16;  // exact
}

// One block per (tile, W query heads of one KV head); warp w takes head blockIdx.y * W + w over
// the tile's rows (at most 16: one m16 tile). Per 32-key chunk, staged once in shared memory for
// the block's warps: S = Q K^T on bf16 tensor cores (mma m16n8k16; Q fragments from global
// memory once, K through ldmatrix), masked and scaled in fp32, the online softmax in fp32 per row
// (quad shuffles), P V on tf32 tensor cores (mma m16n8k8, V read as exact tf32 from the bf16
// cache, P split into two tf32 terms), fp32 accumulation throughout.
// A quantized cache (kv_quant.h) is staged synchronously instead: each thread loads 8 codes and
// stores their 8 dequantized bf16 values, so the products run on exactly what a read gives.
template <int D, KvCacheFormat F>
__global__ void __launch_bounds__(128, 3)
    prefill_attention_kernel(PrefillAttentionParams p, int w) {
  constexpr int kPitch = D + 8;  // halves a staged row: 16-byte aligned, ldmatrix conflict-free
  constexpr int kSteps = D / 16, kOut = D / 8;
  // Two chunks in flight: the next one's cp.async copies overlap this one's products.
  __shared__ __align__(16) __nv_bfloat16 k_stage[2][kChunk * kPitch];
  __shared__ __align__(16) __nv_bfloat16 v_stage[2][kChunk * kPitch];
  pdl_launch_dependents();
  pdl_wait();
  // Tiles in reverse: a sequence's last tiles see the most keys, and starting them first keeps
  // them out of the grid's tail (which tile a block takes changes nothing it computes).
  if (static_cast<int>(blockIdx.x) >= p.tiles[0]) return;
  const int tile = p.tiles[0] - 1 - static_cast<int>(blockIdx.x);
  const int64_t r0 = p.tiles[1 + 2 * tile];
  const int rows = p.tiles[2 + 2 * tile];
  const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32, g = lane / 4, t = lane % 4;
  const int64_t h = static_cast<int64_t>(blockIdx.y) * w + warp;
  const int64_t kv_h = h / (p.num_heads / p.num_kv_heads);
  const int32_t s = p.seq[r0];
  int64_t max_pos = 0;
  for (int r = 0; r < rows; ++r)
    max_pos = p.pos[r0 + r] > max_pos ? p.pos[r0 + r] : max_pos;
  // This thread's two rows: g and g + 8 of the tile (-1: padding, no keys).
  const int64_t pos_lo = g < rows ? p.pos[r0 + g] : -1,
                pos_hi = g + 8 < rows ? p.pos[r0 + g + 8] : -1;
  uint32_t qa[kSteps][4];
  {
    const __nv_bfloat16* q_lo = p.q + (r0 + g) * p.q_stride + h * D;
    const __nv_bfloat16* q_hi = p.q + (r0 + g + 8) * p.q_stride + h * D;
#pragma unroll
    for (int kk = 0; kk < kSteps; ++kk) {
      const int c = 16 * kk + 2 * t;
      qa[kk][0] = pos_lo >= 0 ? *reinterpret_cast<const uint32_t*>(q_lo + c) : 0u;
      qa[kk][1] = pos_hi >= 0 ? *reinterpret_cast<const uint32_t*>(q_hi + c) : 0u;
      qa[kk][2] = pos_lo >= 0 ? *reinterpret_cast<const uint32_t*>(q_lo + c + 8) : 0u;
      qa[kk][3] = pos_hi >= 0 ? *reinterpret_cast<const uint32_t*>(q_hi + c + 8) : 0u;
    }
  }
  float o[kOut][4];
#pragma unroll
  for (int n = 0; n < kOut; ++n)
    o[n][0] = o[n][1] = o[n][2] = o[n][3] = 0.f;
  float m_lo = -INFINITY, m_hi = -INFINITY, l_lo = 0.f, l_hi = 0.f;
  const int32_t bs = static_cast<int32_t>(p.block_size);
  const int32_t* table = p.block_table + static_cast<int64_t>(s) * p.max_blocks_per_seq;
  const int threads = 32 * w;
  // Stages chunk c0's K and V rows into buffer b (keys past max_pos: zeros).
  const auto stage = [&](int64_t c0, int b) {
    for (int u = tid; u < kChunk * (D / 8); u += threads) {
      const int j = u / (D / 8), c8 = u % (D / 8);
      const int64_t key = c0 + j;
      int64_t at = 0;
      if (key <= max_pos) {
        const int32_t kb = static_cast<int32_t>(key) / bs;
        at = ((static_cast<int64_t>(table[kb]) * bs + (static_cast<int32_t>(key) - kb * bs)) *
                  p.num_kv_heads +
              kv_h) *
                 D +
             c8 * 8;
      }
      if constexpr (F == KvCacheFormat::kBf16) {
        const int bytes = key <= max_pos ? 16 : 0;
        cp_async_16(&k_stage[b][j * kPitch + c8 * 8],
                    static_cast<const __nv_bfloat16*>(p.k_cache) + at, bytes);
        cp_async_16(&v_stage[b][j * kPitch + c8 * 8],
                    static_cast<const __nv_bfloat16*>(p.v_cache) + at, bytes);
      } else {
        uint4 kz = make_uint4(0u, 0u, 0u, 0u), vz = kz;  // keys past max_pos: zeros
        if (key <= max_pos) {
          const int64_t ch0 = kv_h * D + c8 * 8;
          kz = kv_dequantize8<F>(
              *reinterpret_cast<const uint2*>(static_cast<const uint8_t*>(p.k_cache) + at), p.kv, 0,
              ch0);
          vz = kv_dequantize8<F>(
              *reinterpret_cast<const uint2*>(static_cast<const uint8_t*>(p.v_cache) + at), p.kv, 1,
              ch0);
        }
        *reinterpret_cast<uint4*>(&k_stage[b][j * kPitch + c8 * 8]) = kz;
        *reinterpret_cast<uint4*>(&v_stage[b][j * kPitch + c8 * 8]) = vz;
      }
    }
    cp_async_commit();
  };
  stage(0, 0);
  for (int64_t c0 = 0, it = 0; c0 <= max_pos; c0 += kChunk, ++it) {
    const int b = static_cast<int>(it & 1);
    // The buffer the next chunk goes to was last read in the previous iteration, which every
    // warp finished before its closing barrier.
    if (c0 + kChunk <= max_pos) {
      stage(c0 + kChunk, 1 - b);
      cp_async_wait<1>();  // this chunk's group is complete; the next may still be in flight
    } else {
      cp_async_wait<0>();
    }
    __syncthreads();
    const __nv_bfloat16* ks = k_stage[b];
    const __nv_bfloat16* vs = v_stage[b];
    // S [16 rows x 32 keys] as four n8 blocks: sc[j] holds (g, 8j+2t..+1) and (g+8, 8j+2t..+1).
    float sc[4][4];
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      sc[j][0] = sc[j][1] = sc[j][2] = sc[j][3] = 0.f;
#pragma unroll
      for (int kk = 0; kk < kSteps; kk += 2) {
        uint32_t b[4];  // b0, b1 of step kk, then of step kk + 1
        ldmatrix_x4(b, &ks[(8 * j + lane % 8) * kPitch + 16 * kk + 8 * (lane / 8)]);
        mma_bf16_16816(sc[j], qa[kk], b[0], b[1]);
        mma_bf16_16816(sc[j], qa[kk + 1], b[2], b[3]);
      }
    }
    // Mask, scale, online softmax in fp32.
    float mx_lo = -INFINITY, mx_hi = -INFINITY;
#pragma unroll
    for (int j = 0; j < 4; ++j)
#pragma unroll
      for (int e = 0; e < 2; ++e) {
        const int64_t key = c0 + 8 * j + 2 * t + e;
        sc[j][e] = key <= pos_lo ? sc[j][e] * p.scale : -INFINITY;
        sc[j][2 + e] = key <= pos_hi ? sc[j][2 + e] * p.scale : -INFINITY;
        mx_lo = fmaxf(mx_lo, sc[j][e]);
        mx_hi = fmaxf(mx_hi, sc[j][2 + e]);
      }
#pragma unroll
    for (int x = 1; x <= 2; x <<= 1) {
      mx_lo = fmaxf(mx_lo, __shfl_xor_sync(0xffffffffu, mx_lo, x));
      mx_hi = fmaxf(mx_hi, __shfl_xor_sync(0xffffffffu, mx_hi, x));
    }
    const float mn_lo = fmaxf(m_lo, mx_lo), mn_hi = fmaxf(m_hi, mx_hi);
    // A row with no key yet keeps m = -inf: no correction, no probabilities.
    const float corr_lo = mn_lo == -INFINITY ? 1.f : expf(m_lo - mn_lo);
    const float corr_hi = mn_hi == -INFINITY ? 1.f : expf(m_hi - mn_hi);
    float sum_lo = 0.f, sum_hi = 0.f;
#pragma unroll
    for (int j = 0; j < 4; ++j)
#pragma unroll
      for (int e = 0; e < 2; ++e) {
        sc[j][e] = sc[j][e] == -INFINITY ? 0.f : expf(sc[j][e] - mn_lo);
        sc[j][2 + e] = sc[j][2 + e] == -INFINITY ? 0.f : expf(sc[j][2 + e] - mn_hi);
        sum_lo += sc[j][e];
        sum_hi += sc[j][2 + e];
      }
#pragma unroll
    for (int x = 1; x <= 2; x <<= 1) {
      sum_lo += __shfl_xor_sync(0xffffffffu, sum_lo, x);
      sum_hi += __shfl_xor_sync(0xffffffffu, sum_hi, x);
    }
    l_lo = l_lo * corr_lo + sum_lo;
    l_hi = l_hi * corr_hi + sum_hi;
    m_lo = mn_lo, m_hi = mn_hi;
#pragma unroll
    for (int n = 0; n < kOut; ++n) {
      o[n][0] *= corr_lo, o[n][1] *= corr_lo;
      o[n][2] *= corr_hi, o[n][3] *= corr_hi;
    }
    // P V: k-step j covers keys 8j..8j+7. The tf32 A fragment wants (g, t), (g+8, t), (g, t+4),
    // (g+8, t+4) of P; S's layout put column c at lane 4g + c/2, slot c % 2.
    const int src_a = 4 * g + t / 2, src_b = src_a + 2;
    const bool odd = t & 1;
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      const float x0 = __shfl_sync(0xffffffffu, sc[j][0], src_a);
      const float x1 = __shfl_sync(0xffffffffu, sc[j][1], src_a);
      const float y0 = __shfl_sync(0xffffffffu, sc[j][2], src_a);
      const float y1 = __shfl_sync(0xffffffffu, sc[j][3], src_a);
      const float u0 = __shfl_sync(0xffffffffu, sc[j][0], src_b);
      const float u1 = __shfl_sync(0xffffffffu, sc[j][1], src_b);
      const float z0 = __shfl_sync(0xffffffffu, sc[j][2], src_b);
      const float z1 = __shfl_sync(0xffffffffu, sc[j][3], src_b);
      // P = hi + lo, each a tf32 value: P V as two tf32 products carries P to ~2^-22 (V is
      // exact in tf32), so the probabilities are not rounded where the CUDA-core kernel kept fp32.
      const float pv[4] = {odd ? x1 : x0, odd ? y1 : y0, odd ? u1 : u0, odd ? z1 : z0};
      uint32_t a_hi[4], a_lo[4];
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const float hi = round_tf32(pv[e]);
        a_hi[e] = __float_as_uint(hi);
        a_lo[e] = __float_as_uint(round_tf32(pv[e] - hi));
      }
      const __nv_bfloat16* v_lo = &vs[(8 * j + t) * kPitch + g];
      const __nv_bfloat16* v_hi = &vs[(8 * j + t + 4) * kPitch + g];
#pragma unroll
      for (int n = 0; n < kOut; ++n) {
        const uint32_t b0 = bf16_bits_as_f32(v_lo[8 * n]), b1 = bf16_bits_as_f32(v_hi[8 * n]);
        mma_tf32_1688(o[n], a_lo, b0, b1);
        mma_tf32_1688(o[n], a_hi, b0, b1);
      }
    }
    __syncthreads();  // every warp is done with buffer b before it is staged again
  }
  // Rows g and g + 8: columns 8n + 2t, +1 of this head.
#pragma unroll
  for (int half = 0; half < 2; ++half) {
    const int r = g + 8 * half;
    if (r >= rows) continue;
    const float inv = 1.f / (half ? l_hi : l_lo);
    __nv_bfloat16* op = p.out + (r0 + r) * p.out_stride + h * D + 2 * t;
#pragma unroll
    for (int n = 0; n < kOut; ++n) {
      __nv_bfloat162 v;
      v.x = __float2bfloat16_rn(o[n][2 * half] * inv);
      v.y = __float2bfloat16_rn(o[n][2 * half + 1] * inv);
      *reinterpret_cast<__nv_bfloat162*>(op + 8 * n) = v;
    }
  }
}

}  // namespace

std::vector<int32_t> plan_prefill_tiles(const std::vector<int32_t>& seq) {
  std::vector<int32_t> t = {0};
  for (size_t i = 0; i < seq.size();) {
    size_t n = 1;
    while (i + n < seq.size() && seq[i + n] == seq[i] && n < kPrefillTileRows)
      ++n;
    t.push_back(static_cast<int32_t>(i));
    t.push_back(static_cast<int32_t>(n));
    ++t[0];
    i += n;
  }
  return t;
}

void launch_prefill_attention(const PrefillAttentionParams& p, cudaStream_t stream) {
  constexpr const char* k = "prefill_attention";
  require(p.q && p.k_cache && p.v_cache && p.block_table && p.seq && p.pos && p.tiles && p.out, k,
          "every pointer is required");
  require(p.head_dim == 64 || p.head_dim == 128, k,
          "head_dim " + std::to_string(p.head_dim) + " must be 64 or 128");
  require_attention_shapes(k, p.k_cache, p.v_cache, p.num_heads, p.num_kv_heads, p.head_dim,
                           p.block_size, p.max_blocks_per_seq, p.q_stride, p.out_stride, p.scale);
  require(p.max_tiles >= 0 && p.max_tiles <= (int64_t{1} << 31) - 1, k, "max_tiles in [0, 2^31)");
  if (p.max_tiles == 0) return;
  require(aligned(p.q, 4) && p.q_stride % 2 == 0 && aligned(p.out, 4) && p.out_stride % 2 == 0, k,
          "q and out rows must be 4-byte aligned (bf16 pairs are read and written whole)");
  // Warps per block: the query heads of one KV head that share the staged K / V chunk.
  const int64_t group = p.num_heads / p.num_kv_heads;
  const int w = group % 4 == 0 ? 4 : group % 2 == 0 ? 2 : 1;
  const dim3 grid(static_cast<unsigned>(p.max_tiles), static_cast<unsigned>(p.num_heads / w));
  require_kv_quant(k, p.kv, p.num_kv_heads, p.head_dim);
  require(p.kv.format == KvCacheFormat::kBf16 || p.kv.read_bf16, k,
          "a " + to_string(p.kv.format) +
              " cache read in fp32 (kv_quant.h): the tensor-core kernel takes bf16 operands; "
              "paged_attention reads it");
  with_kv_format(p.kv.format, [&](auto format) {
    constexpr KvCacheFormat F = decltype(format)::value;
    if (p.head_dim == 64)
      launch_pdl(k, prefill_attention_kernel<64, F>, grid, dim3(32 * w), 0, stream, p, w);
    else
      launch_pdl(k, prefill_attention_kernel<128, F>, grid, dim3(32 * w), 0, stream, p, w);
  });
}

}  // namespace qparity::gpu
