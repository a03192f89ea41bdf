#include "gpu_engine/kernels/attention_prologue.h"
#include "gpu_engine/kernels/kv_quant.cuh"
#include "gpu_engine/kernels/launch_check.h"
#include "gpu_engine/kernels/pdl.h"

namespace qparity::gpu {

namespace {

constexpr int kWarps = 4;  // heads per block: one warp per head, so a token's heads run in parallel
constexpr int kMaxHeadDim = 256;

// Block (t, b) takes heads b * kWarps + w of token t's q | k | v row, one per warp. A q or k head
// goes through a per-warp shared-memory vector so RoPE can pair element i with i + head_dim/2.
// Before pdl_wait the kernel reads only what no kernel of the forward writes (positions, the
// block table, weights) and computes the RoPE angles: that overlaps the previous kernel's tail.
__global__ void __launch_bounds__(kWarps * 32)
    attention_prologue_kernel(AttentionPrologueParams p) {
  __shared__ float vec[kWarps][kMaxHeadDim];
  const int64_t t = blockIdx.x;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int64_t d = p.head_dim, half = d / 2, nq = p.num_heads, nkv = p.num_kv_heads;
  const int64_t hh = static_cast<int64_t>(blockIdx.y) * kWarps + warp;
  const int32_t pos = p.positions[t];
  const int32_t bs = static_cast<int32_t>(p.block_size);
  const int32_t jb = pos / bs;
  const int64_t block = p.block_table[static_cast<int64_t>(p.seq[t]) * p.max_blocks_per_seq + jb];
  const int64_t cache_row = (block * bs + (pos - jb * bs)) * nkv;  // in heads
  const bool is_v = hh >= nq + nkv, is_q = hh < nq;
  double c[kMaxHeadDim / 64], sn[kMaxHeadDim / 64];  // lane's pairs i = lane + 32 j
  float nw[kMaxHeadDim / 32];                        // lane's norm weights i = lane + 32 j
  const __nv_bfloat16* w = is_q ? p.q_norm : p.k_norm;
  if (hh < nq + nkv) {
#pragma unroll
    for (int j = 0; j < kMaxHeadDim / 64; ++j) {
      const int64_t i = lane + 32 * j;
      if (i < half) {
        const int32_t at = p.mrope            ? p.mrope[p.mrope_rows[i] * p.tokens + t]
                           : p.rope_positions ? p.rope_positions[t]
                                              : pos;
        sincos(static_cast<double>(at) * p.inv_freq[i], &sn[j], &c[j]);
        c[j] *= p.rope_scaling;
        sn[j] *= p.rope_scaling;
      }
    }
#pragma unroll
    for (int j = 0; j < kMaxHeadDim / 32; ++j) {
      const int64_t i = lane + 32 * j;
      if (w && i < d) nw[j] = __bfloat162float(w[i]) + p.norm_offset;
    }
  }
  pdl_launch_dependents();
  pdl_wait();
  if (hh >= nq + 2 * nkv) return;
  __nv_bfloat16* head = p.qkv + t * p.row_stride + hh * d;
  if (is_v) {  // V: straight into the cache
    const int64_t o = (cache_row + (hh - nq - nkv)) * d, ch = (hh - nq - nkv) * d;
    for (int64_t i = lane; i < d; i += 32)
      kv_store(p.kv, p.v_cache, o + i, 1, ch + i, head[i]);
    return;
  }
  float* s = vec[warp];
  float sum = 0.f;
  for (int64_t i = lane; i < d; i += 32) {
    const float x = __bfloat162float(head[i]);
    s[i] = x;
    sum += x * x;
  }
  if (w) {
    for (int o = 16; o > 0; o >>= 1)
      sum += __shfl_xor_sync(0xffffffffu, sum, o);
    const float r = rsqrtf(sum / static_cast<float>(p.norm_dim > 0 ? p.norm_dim : d) + p.eps);
#pragma unroll
    for (int j = 0; j < kMaxHeadDim / 32; ++j) {
      const int64_t i = lane + 32 * j;
      if (i < d) {
        const __nv_bfloat16 v = __float2bfloat16_rn(nw[j] * (s[i] * r));
        s[i] = __bfloat162float(v);
        if (p.normed_out) p.normed_out[(t * (nq + nkv) + hh) * d + i] = v;
      }
    }
  }
  __syncwarp();
  // K: quantized on write; the qkv row keeps the rotated value (the rope_k point).
  const int64_t k_at = (cache_row + (hh - nq)) * d, k_ch = (hh - nq) * d;
#pragma unroll
  for (int j = 0; j < kMaxHeadDim / 64; ++j) {
    const int64_t i = lane + 32 * j;
    if (i < half) {
      const double x1 = s[i], x2 = s[i + half];
      const __nv_bfloat16 o1 = __double2bfloat16(x1 * c[j] - x2 * sn[j]),
                          o2 = __double2bfloat16(x2 * c[j] + x1 * sn[j]);
      head[i] = o1;
      head[i + half] = o2;
      if (!is_q) {
        kv_store(p.kv, p.k_cache, k_at + i, 0, k_ch + i, o1);
        kv_store(p.kv, p.k_cache, k_at + i + half, 0, k_ch + i + half, o2);
      }
    }
  }
}

}  // namespace

void launch_attention_prologue(const AttentionPrologueParams& p, cudaStream_t stream) {
  constexpr const char* k = "attention_prologue";
  require(p.qkv && p.positions && p.inv_freq && p.k_cache && p.v_cache && p.block_table && p.seq, k,
          "qkv, positions, inv_freq, the caches, block_table and seq are required");
  require(!p.q_norm == !p.k_norm, k, "q_norm and k_norm come together");
  require(!p.mrope == !p.mrope_rows, k, "mrope and mrope_rows come together");
  require(p.head_dim > 0 && p.head_dim % 2 == 0 && p.head_dim <= kMaxHeadDim, k,
          "head_dim " + std::to_string(p.head_dim) + " must be even and in [2, 256]");
  require(p.tokens >= 0 && p.num_heads > 0 && p.num_kv_heads > 0, k,
          "tokens >= 0, num_heads > 0, num_kv_heads > 0");
  require(p.row_stride >= (p.num_heads + 2 * p.num_kv_heads) * p.head_dim, k,
          "row_stride < (num_heads + 2 * num_kv_heads) * head_dim");
  require(p.block_size > 0 && p.max_blocks_per_seq > 0, k, "positive block sizes");
  require(p.eps >= 0, k, "eps must be >= 0");
  require(p.norm_dim >= 0 && p.norm_dim <= p.head_dim, k, "norm_dim in [0, head_dim]");
  require_kv_quant(k, p.kv, p.num_kv_heads, p.head_dim);
  if (p.tokens == 0) return;
  const int64_t heads = p.num_heads + 2 * p.num_kv_heads;
  launch_pdl(
      k, attention_prologue_kernel,
      dim3(static_cast<unsigned>(p.tokens), static_cast<unsigned>((heads + kWarps - 1) / kWarps)),
      dim3(kWarps * 32), 0, stream, p);
}

}  // namespace qparity::gpu
