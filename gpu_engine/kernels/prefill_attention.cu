#include <cmath>

#include "gpu_engine/kernels/launch_check.h"
#include "gpu_engine/kernels/paged_attention.h"
#include "gpu_engine/kernels/pdl.h"
#include "gpu_engine/kernels/prefill_attention.h"

namespace qparity::gpu {

namespace {

constexpr int kWarps = 4, kRowsPerWarp = kPrefillTileRows / kWarps, kChunk = 32;
static_assert(kRowsPerWarp * kWarps == kPrefillTileRows);

__device__ __forceinline__ float2 bf16x2_to_float2(uint32_t w) {
  // bf16 -> fp32 is exact: the bf16 bits are the high half of the float.
  return make_float2(__uint_as_float(w << 16), __uint_as_float(w & 0xffff0000u));
}

// One block per (tile, query head). Warp w serves tile rows 4w .. 4w+3. Per 32-key chunk: lane j
// scores key j against the warp's rows (K from shared memory, rows padded by one word so the 32
// lanes' rows fall in distinct banks), the rows' online softmax states update, then every lane
// accumulates p.V for its head_dim / 32 output elements (V from shared memory).
template <int D>
__global__ void __launch_bounds__(kWarps * 32) prefill_attention_kernel(PrefillAttentionParams p) {
  constexpr int kPerLane = D / 32, kWords = D / 2 + 1;
  __shared__ float qs[kPrefillTileRows][D];
  __shared__ uint32_t ks[kChunk * kWords];
  __shared__ __align__(16) __nv_bfloat16 vs[kChunk][D];
  pdl_launch_dependents();
  pdl_wait();
  const int tile = blockIdx.x, h = blockIdx.y;
  if (tile >= p.tiles[0]) return;
  const int64_t r0 = p.tiles[1 + 2 * tile];
  const int rows = p.tiles[2 + 2 * tile];
  const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32;
  const int32_t s = p.seq[r0];
  const int64_t kv_h = h / (p.num_heads / p.num_kv_heads);
  int64_t max_pos = 0;
  for (int r = 0; r < rows; ++r)
    max_pos = p.pos[r0 + r] > max_pos ? p.pos[r0 + r] : max_pos;
  int64_t row_pos[kRowsPerWarp];
#pragma unroll
  for (int i = 0; i < kRowsPerWarp; ++i) {
    const int r = warp * kRowsPerWarp + i;
    row_pos[i] = r < rows ? p.pos[r0 + r] : -1;  // -1: no keys, the row is padding
  }
  for (int e = tid; e < kPrefillTileRows * D; e += kWarps * 32) {
    const int r = e / D, d = e % D;
    qs[r][d] = r < rows ? __bfloat162float(p.q[(r0 + r) * p.q_stride + h * D + d]) * p.scale : 0.f;
  }
  float acc[kRowsPerWarp][kPerLane], m[kRowsPerWarp], l[kRowsPerWarp];
#pragma unroll
  for (int i = 0; i < kRowsPerWarp; ++i) {
    m[i] = -INFINITY;
    l[i] = 0.f;
#pragma unroll
    for (int e = 0; e < kPerLane; ++e)
      acc[i][e] = 0.f;
  }
  const int32_t bs = static_cast<int32_t>(p.block_size);
  const int32_t* table = p.block_table + static_cast<int64_t>(s) * p.max_blocks_per_seq;
  for (int64_t c0 = 0; c0 <= max_pos; c0 += kChunk) {
    __syncthreads();  // the previous chunk is consumed (and qs is written, the first time)
    for (int u = tid; u < kChunk * (D / 8); u += kWarps * 32) {
      const int j = u / (D / 8), c8 = u % (D / 8);
      const int64_t key = c0 + j;
      uint4 kv = make_uint4(0, 0, 0, 0), vv = kv;
      if (key <= max_pos) {
        const int32_t kb = static_cast<int32_t>(key) / bs;
        const int64_t o =
            ((static_cast<int64_t>(table[kb]) * bs + (static_cast<int32_t>(key) - kb * bs)) *
                 p.num_kv_heads +
             kv_h) *
                D +
            c8 * 8;
        kv = *reinterpret_cast<const uint4*>(p.k_cache + o);
        vv = *reinterpret_cast<const uint4*>(p.v_cache + o);
      }
      uint32_t* kd = ks + j * kWords + c8 * 4;
      kd[0] = kv.x, kd[1] = kv.y, kd[2] = kv.z, kd[3] = kv.w;
      *reinterpret_cast<uint4*>(&vs[j][c8 * 8]) = vv;
    }
    __syncthreads();
    // Scores: lane j against key c0 + j.
    float sc[kRowsPerWarp];
#pragma unroll
    for (int i = 0; i < kRowsPerWarp; ++i)
      sc[i] = 0.f;
    const uint32_t* kr = ks + lane * kWords;
#pragma unroll 8
    for (int d2 = 0; d2 < D / 2; ++d2) {
      const float2 k2 = bf16x2_to_float2(kr[d2]);
#pragma unroll
      for (int i = 0; i < kRowsPerWarp; ++i) {
        const float2 q2 = *reinterpret_cast<const float2*>(&qs[warp * kRowsPerWarp + i][2 * d2]);
        sc[i] = fmaf(q2.x, k2.x, sc[i]);
        sc[i] = fmaf(q2.y, k2.y, sc[i]);
      }
    }
    const int64_t key = c0 + lane;
    float pr[kRowsPerWarp];
#pragma unroll
    for (int i = 0; i < kRowsPerWarp; ++i) {
      const float v = key <= row_pos[i] ? sc[i] : -INFINITY;
      float cm = v;
#pragma unroll
      for (int o = 16; o > 0; o >>= 1)
        cm = fmaxf(cm, __shfl_xor_sync(0xffffffffu, cm, o));
      const float m_new = fmaxf(m[i], cm);
      // A row with no key yet keeps m = -inf: no correction, no probabilities.
      const float corr = m_new == -INFINITY ? 1.f : expf(m[i] - m_new);
      pr[i] = v == -INFINITY ? 0.f : expf(v - m_new);
      float ps = pr[i];
#pragma unroll
      for (int o = 16; o > 0; o >>= 1)
        ps += __shfl_xor_sync(0xffffffffu, ps, o);
      l[i] = l[i] * corr + ps;
      m[i] = m_new;
#pragma unroll
      for (int e = 0; e < kPerLane; ++e)
        acc[i][e] *= corr;
    }
    // p.V: lane owns output elements lane * kPerLane ...
    const int keys = max_pos - c0 + 1 < kChunk ? static_cast<int>(max_pos - c0 + 1) : kChunk;
    for (int j = 0; j < keys; ++j) {
      float vf[kPerLane];
      const uint32_t* vw = reinterpret_cast<const uint32_t*>(&vs[j][lane * kPerLane]);
#pragma unroll
      for (int e = 0; e < kPerLane / 2; ++e) {
        const float2 f = bf16x2_to_float2(vw[e]);
        vf[2 * e] = f.x;
        vf[2 * e + 1] = f.y;
      }
#pragma unroll
      for (int i = 0; i < kRowsPerWarp; ++i) {
        const float pj = __shfl_sync(0xffffffffu, pr[i], j);
#pragma unroll
        for (int e = 0; e < kPerLane; ++e)
          acc[i][e] = fmaf(pj, vf[e], acc[i][e]);
      }
    }
  }
#pragma unroll
  for (int i = 0; i < kRowsPerWarp; ++i) {
    const int r = warp * kRowsPerWarp + i;
    if (r >= rows) continue;
    __nv_bfloat16* op = p.out + (r0 + r) * p.out_stride + h * D + lane * kPerLane;
#pragma unroll
    for (int e = 0; e < kPerLane; ++e)
      op[e] = __float2bfloat16_rn(acc[i][e] / l[i]);
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
  const dim3 grid(static_cast<unsigned>(p.max_tiles), static_cast<unsigned>(p.num_heads));
  if (p.head_dim == 64)
    launch_pdl(k, prefill_attention_kernel<64>, grid, dim3(kWarps * 32), 0, stream, p);
  else
    launch_pdl(k, prefill_attention_kernel<128>, grid, dim3(kWarps * 32), 0, stream, p);
}

}  // namespace qparity::gpu
