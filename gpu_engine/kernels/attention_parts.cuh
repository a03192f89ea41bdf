#pragma once
// What the attention kernels (paged_attention.cu, decode_attention.cu) share: a slice of a bf16
// head row held packed in registers, a warp's online-softmax step over a few keys, the block's
// merge of its warps, and the merge of a token's key chunks across blocks.
#include <cuda_bf16.h>
#include <cuda/atomic>

#include <cstdint>
#include <type_traits>
#include <utility>

#include "gpu_engine/kernels/kernel_probe.h"

namespace qparity::gpu {

// The launchers' dispatch to a kernel instantiated per head_dim / 32 (kPerLane, 1..8; head_dim is
// checked before): f(std::integral_constant<int, kPerLane>{}) (device code is C++17: no
// template lambdas).
template <typename F, int... N>
void with_per_lane_impl(int64_t per_lane, F& f, std::integer_sequence<int, N...>) {
  ((per_lane == N + 1 ? (f(std::integral_constant<int, N + 1>{}), 0) : 0), ...);
}
template <typename F>
void with_per_lane(int64_t head_dim, F&& f) {
  with_per_lane_impl(head_dim / 32, f, std::make_integer_sequence<int, 8>{});
}

// kN consecutive bf16 of a head row (lane l holds elements l*kN .. l*kN+kN-1), kept packed: half
// the registers of fp32, so eight keys' K and V stay in flight without spills or lost occupancy.
template <int kN>
struct PackedRow {
  uint32_t w[(kN + 1) / 2];
  __device__ __forceinline__ void load(const __nv_bfloat16* src) {
    if constexpr (kN % 8 == 0) {  // 16-byte loads (rows are 16-byte aligned: offsets are kN*lane)
#pragma unroll
      for (int i = 0; i < kN / 8; ++i) {
        const uint4 v = reinterpret_cast<const uint4*>(src)[i];
        w[4 * i] = v.x, w[4 * i + 1] = v.y, w[4 * i + 2] = v.z, w[4 * i + 3] = v.w;
      }
    } else if constexpr (kN % 4 == 0) {
#pragma unroll
      for (int i = 0; i < kN / 4; ++i) {
        const uint2 v = reinterpret_cast<const uint2*>(src)[i];
        w[2 * i] = v.x, w[2 * i + 1] = v.y;
      }
    } else if constexpr (kN % 2 == 0) {
#pragma unroll
      for (int i = 0; i < kN / 2; ++i)
        w[i] = reinterpret_cast<const uint32_t*>(src)[i];
    } else {  // odd widths: 2-byte loads
      const uint16_t* h = reinterpret_cast<const uint16_t*>(src);
#pragma unroll
      for (int i = 0; i < (kN + 1) / 2; ++i)
        w[i] = static_cast<uint32_t>(h[2 * i]) |
               (2 * i + 1 < kN ? static_cast<uint32_t>(h[2 * i + 1]) << 16 : 0u);
    }
  }
  __device__ __forceinline__ void zero() {
#pragma unroll
    for (int i = 0; i < (kN + 1) / 2; ++i)
      w[i] = 0u;
  }
  __device__ __forceinline__ void set(int j, __nv_bfloat16 v) {
    const uint32_t b = __bfloat16_as_ushort(v);
    w[j / 2] = (j & 1) ? ((w[j / 2] & 0xffffu) | (b << 16)) : ((w[j / 2] & 0xffff0000u) | b);
  }
  __device__ __forceinline__ __nv_bfloat16 bf16_at(int j) const {
    return __ushort_as_bfloat16(static_cast<unsigned short>((j & 1) ? (w[j / 2] >> 16) : w[j / 2]));
  }
  // bf16 -> fp32 is exact: the bf16 bits are the high half of the float.
  __device__ __forceinline__ float at(int j) const {
    return __uint_as_float((j & 1) ? (w[j / 2] & 0xffff0000u) : (w[j / 2] << 16));
  }
};

// One warp step of flash attention over keys [base, base + kKeys) of which those below `end`
// count: q.k in fp32 (each lane's partial dot, then xor shuffles: every lane holds the sum), the
// running max m, sum l and accumulator acc updated online (rescaled by exp(m_old - m_new)).
// q is pre-scaled; masked keys weigh 0.
// k_at(row, j) / v_at(row, j): element j of a key's / value's row as fp32 (a PackedRow's at(),
// or a quantized cache's codes read as kv_quant.cuh reads them, so no dequantized copy of the
// step's rows needs registers). dot_bias is subtracted from every summed q.k (kv_quant.cuh's
// factored int8 read).
template <int kPerLane, int kKeys, class KRow, class VRow, class KAt, class VAt>
__device__ __forceinline__ void online_softmax_step_with(const float (&q)[kPerLane],
                                                         const KRow (&kv)[kKeys],
                                                         const VRow (&vv)[kKeys], int64_t base,
                                                         int64_t end, float& m, float& l,
                                                         float (&acc)[kPerLane], KAt k_at,
                                                         VAt v_at, float dot_bias = 0.f) {
  float dot[kKeys];
#pragma unroll
  for (int u = 0; u < kKeys; ++u) {
    dot[u] = 0.f;
#pragma unroll
    for (int j = 0; j < kPerLane; ++j)
      dot[u] += q[j] * k_at(kv[u], j);
  }
#pragma unroll
  for (int off = 16; off > 0; off >>= 1)
#pragma unroll
    for (int u = 0; u < kKeys; ++u)
      dot[u] += __shfl_xor_sync(0xffffffffu, dot[u], off);
#pragma unroll
  for (int u = 0; u < kKeys; ++u)
    dot[u] -= dot_bias;
  float m_new = m;
#pragma unroll
  for (int u = 0; u < kKeys; ++u)
    if (base + u < end) m_new = fmaxf(m_new, dot[u]);
  const float corr = expf(m - m_new);  // exp(-inf) = 0 before the first key
  float e[kKeys];
#pragma unroll
  for (int u = 0; u < kKeys; ++u)
    e[u] = base + u < end ? expf(dot[u] - m_new) : 0.f;
  l *= corr;
#pragma unroll
  for (int u = 0; u < kKeys; ++u)
    l += e[u];
#pragma unroll
  for (int j = 0; j < kPerLane; ++j) {
    float a = acc[j] * corr;
#pragma unroll
    for (int u = 0; u < kKeys; ++u)
      a += e[u] * v_at(vv[u], j);
    acc[j] = a;
  }
  m = m_new;
}

template <int kPerLane, int kKeys>
__device__ __forceinline__ void online_softmax_step(const float (&q)[kPerLane],
                                                    const PackedRow<kPerLane> (&kv)[kKeys],
                                                    const PackedRow<kPerLane> (&vv)[kKeys],
                                                    int64_t base, int64_t end, float& m, float& l,
                                                    float (&acc)[kPerLane]) {
  const auto at = [](const PackedRow<kPerLane>& r, int j) { return r.at(j); };
  online_softmax_step_with(q, kv, vv, base, end, m, l, acc, at, at);
}

// The block's warps' softmax states (m, l, acc) into shared memory (sm, sl, sacc, then one
// barrier), and their max mm and weight ll, summed in warp order. Every thread calls it.
template <int kWarps, int kPerLane, int kRow>
__device__ __forceinline__ void gather_warp_states(float m, float l, const float (&acc)[kPerLane],
                                                   int warp, int lane, float (&sm)[kWarps],
                                                   float (&sl)[kWarps], float (&sacc)[kWarps][kRow],
                                                   float& mm, float& ll) {
  if (lane == 0) {
    sm[warp] = m;
    sl[warp] = l;
  }
#pragma unroll
  for (int j = 0; j < kPerLane; ++j)
    sacc[warp][lane * kPerLane + j] = acc[j];
  __syncthreads();
  mm = -INFINITY;
  for (int w = 0; w < kWarps; ++w)
    mm = fmaxf(mm, sm[w]);
  ll = 0.f;
  for (int w = 0; w < kWarps; ++w)
    if (sl[w] > 0.f) ll += sl[w] * expf(sm[w] - mm);
}

// The end of a (token, head, chunk) block, after gather_warp_states: with one chunk, the output
// row `op`; with several, this chunk's state (its unnormalized accumulator and mm, ll) into the
// scratch at slot th * max_chunks + c, counted on chunks_done[th], and the token's last block to
// count merges every chunk's state in chunk order into `op`. Every thread of the block calls it.
// The count is a release of this block's state (ordered before it by the barrier) and, for the
// last block, an acquire of every other chunk's: one acq_rel atomic, no full fences. The merge is
// online (a running max), so every chunk's loads are independent and go out together: one round
// trip, not one for the maxima and another for the rest. The counter is left at zero.
template <int kWarps, int kRow>
__device__ __forceinline__ void finish_chunk(const float (&sm)[kWarps], const float (&sl)[kWarps],
                                             const float (&sacc)[kWarps][kRow], float mm, float ll,
                                             int64_t th, int64_t c, int64_t chunks,
                                             int64_t max_chunks, int64_t d, float* partial_acc,
                                             float* partial_ml, uint32_t* chunks_done,
                                             __nv_bfloat16* op,
                                             unsigned long long* stamp_count = nullptr) {
  __shared__ bool merge_chunks;
  float* pacc = chunks == 1 ? nullptr : partial_acc + (th * max_chunks + c) * d;
  for (int64_t e = threadIdx.x; e < d; e += blockDim.x) {
    float v = 0.f;
    for (int w = 0; w < kWarps; ++w)
      if (sl[w] > 0.f) v += sacc[w][e] * expf(sm[w] - mm);
    if (chunks == 1)
      op[e] = __float2bfloat16_rn(v / ll);
    else
      pacc[e] = v;
  }
  if (chunks == 1) return;
  if (threadIdx.x == 0) {
    partial_ml[(th * max_chunks + c) * 2] = mm;
    partial_ml[(th * max_chunks + c) * 2 + 1] = ll;
  }
  __syncthreads();
  if (threadIdx.x == 0) {
    cuda::atomic_ref<uint32_t, cuda::thread_scope_device> count(chunks_done[th]);
    const uint32_t done = count.fetch_add(1u, cuda::memory_order_acq_rel);
    merge_chunks = done == static_cast<uint32_t>(chunks - 1);
    if (merge_chunks) count.store(0u, cuda::memory_order_relaxed);  // ready for the next launch
    if (stamp_count) *stamp_count = probe_now();  // decode_attention's stage stamps
  }
  __syncthreads();
  if (!merge_chunks) return;
  const float* ml = partial_ml + th * max_chunks * 2;
  const float* acc0 = partial_acc + th * max_chunks * d;
  for (int64_t e = threadIdx.x; e < d; e += blockDim.x) {
    float gm = -INFINITY, gl = 0.f, v = 0.f;
#pragma unroll 4
    for (int64_t k = 0; k < chunks; ++k) {
      const float mk = __ldcg(ml + 2 * k), lk = __ldcg(ml + 2 * k + 1),
                  ak = __ldcg(acc0 + k * d + e);
      const float m_new = fmaxf(gm, mk);
      const float old = expf(gm - m_new), mine = expf(mk - m_new);  // exp(-inf) = 0 at first
      gl = gl * old + lk * mine;
      v = v * old + ak * mine;
      gm = m_new;
    }
    op[e] = __float2bfloat16_rn(v / gl);
  }
}

}  // namespace qparity::gpu
