#include <cstdlib>
#include <cstring>

#include "gpu_engine/cuda_check.h"
#include "gpu_engine/kernels/pdl.h"
#include "gpu_engine/kernels/skinny_gemm_parts.cuh"
#include "gpu_engine/kernels/skinny_gemm_single_pass.h"

namespace qparity::gpu {

namespace {

using skinny::kMaxSmem;
using skinny::kThreads;
using skinny::kUnroll;
using skinny::kWarps;
using skinny::load_stream;
using skinny::pack8;
using skinny::unpack8;

// Chunk u of this lane, clamped into the row so that every load is issued unconditionally (a
// guarded load would be a branch the compiler does not hoist the next load above); `in` says
// whether the chunk exists.
struct LaneChunk {
  int at;
  bool in;
};
__device__ __forceinline__ LaneChunk lane_chunk(int first, int step, int u, int chunks) {
  const int c = first + step * u;
  return {c < chunks ? c : chunks - 1, c < chunks};
}

// The compiler takes v as defined here: nothing computed from it moves above this point. Without
// it the weights' bf16 -> fp32 unpacking went above the PDL wait, where each lane stalled on its
// weight loads before it could release the next kernel (and twice the registers held them).
__device__ __forceinline__ void opaque(uint4& v) {
  asm volatile("" : "+r"(v.x), "+r"(v.y), "+r"(v.z), "+r"(v.w));
}

// kNorm: the fused residual-add + RMSNorm prologue (K <= 2048). Block layout as
// skinny_gemm_kernel's: kWarps / ksplit row pairs a block, each split along K over ksplit warps.
// Every operand is a plain load into registers: weights before the wait (eight 16-byte chunks a
// lane), X after it, all of a lane's chunks at once. The prologue stages X as stage_x does, one
// chunk a thread: h = bf16(x + add) and its squares, a barrier for the block's sum, then the
// thread normalizes its own chunk into shared memory, and a second barrier. Normalizing once a
// block rather than in every warp that reads a chunk is the point: after the release the prologue
// GEMMs are bound by instruction issue (gate_up runs 3 blocks, 24 warps, an SM), and the per-warp
// normalization was half of each chunk's instructions (gate_up 3.93 -> 3.17 us after release,
// +2.3 % tokens/s, H100). Staging keeps the kernel at 64 registers (four blocks an SM, as
// skinny_gemm_kernel<1>): holding X and the residual term per lane took 96, two blocks an SM,
// and gate_up's 384 blocks then no longer fit beside the kernels before it (+2.7 us in the
// timeline). cp.async for X was slower still: 4.4 us a kernel against 2.2 with plain loads in
// bench_dependent_chain's attn pair, 16.7 against 2.7 in its mlp pair.
template <bool kNorm>
__global__ void __launch_bounds__(kThreads, 4)
    skinny_gemm_single_pass_kernel(SkinnyGemmParams p, int ksplit) {
  extern __shared__ uint4 staged[];
  __shared__ float partial[kWarps];
  probe_entry(p.probe);
  const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32;
  const int64_t k = p.k, n = p.n, half = n / 2;
  const int chunks = static_cast<int>(k / 8);  // the launcher bounds it by 32 * kWarps * kUnroll
  // kNorm: X normalized (bf16), chunk t stored by thread t as stage_x's second pass stores it.
  uint4* xs = staged;
  const int64_t pairs = skinny::row_pairs(p);
  const int slice = warp % ksplit;
  const int64_t g = static_cast<int64_t>(blockIdx.x) * (kWarps / ksplit) + warp / ksplit;
  const bool has_pair = g < pairs;
  const int first = slice * 32 + lane, step = 32 * ksplit;
  // The weights before the wait: never written during a forward.
  uint4 a[kUnroll], b[kUnroll];
  if (has_pair) {
    const int64_t r0 = p.silu_mul ? g : 2 * g;
    const int64_t r1 = p.silu_mul ? g + half : (2 * g + 1 < n ? 2 * g + 1 : n - 1);
    const uint4* w0 = reinterpret_cast<const uint4*>(p.w + r0 * k);
    const uint4* w1 = reinterpret_cast<const uint4*>(p.w + r1 * k);
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      const LaneChunk c = lane_chunk(first, step, u, chunks);
      if (c.in)
        a[u] = load_stream(w0 + c.at), b[u] = load_stream(w1 + c.at);
      else  // (never read: the products skip the chunk)
        a[u] = b[u] = make_uint4(0, 0, 0, 0);
    }
  }
  // The norm weight's chunk of this thread, in flight across the wait like the weights (stored
  // to shared memory before the wait, the store would hold the thread there until it arrived).
  uint4 nw = make_uint4(0, 0, 0, 0);
  if (kNorm && tid < chunks) nw = reinterpret_cast<const uint4*>(p.norm_weight)[tid];
  pdl_launch_dependents();
  pdl_wait();
  probe_release(p.probe);

  uint4 xv[kUnroll];  // without the prologue: this lane's chunks of X
  if constexpr (kNorm) {
    // stage_x's thread t: chunk t, its h and the sum of its squares; the warps' partial sums.
    float h[8], s = 0.f;
    if (tid < chunks) {
      // Both loads before either is used: unpacking x ahead of the branch on p.add would hold
      // the add's load until x arrived (two round trips instead of one).
      const uint4 xr = reinterpret_cast<const uint4*>(p.x)[tid];
      const uint4 ar = p.add ? reinterpret_cast<const uint4*>(p.add)[tid] : make_uint4(0, 0, 0, 0);
      unpack8(xr, h);
      if (p.add) {
        float ad[8];
        unpack8(ar, ad);
#pragma unroll
        for (int j = 0; j < 8; ++j)  // exact in fp32 after the rounding
          h[j] = __bfloat162float(__float2bfloat16_rn(h[j] + ad[j]));
      }
      const uint4 hv = pack8(h);  // exact: every h is a bf16 value
      if (blockIdx.x == 0 && p.residual_out) reinterpret_cast<uint4*>(p.residual_out)[tid] = hv;
#pragma unroll
      for (int j = 0; j < 8; ++j)
        s += h[j] * h[j];
    }
    for (int o = 16; o > 0; o >>= 1)
      s += __shfl_xor_sync(0xffffffffu, s, o);
    if (lane == 0) partial[warp] = s;
    __syncthreads();
    if (tid < chunks) {   // chunk t normalized once for the block, as stage_x's second pass
      float total = 0.f;  // every such thread sums the partials in warp order: the same value
      for (int w = 0; w < kWarps; ++w)
        total += partial[w];
      const float rs = rsqrtf(total / static_cast<float>(k) + p.eps);
      float w8[8];
      unpack8(nw, w8);
#pragma unroll
      for (int j = 0; j < 8; ++j)
        h[j] = w8[j] * (h[j] * rs);
      const uint4 xn = pack8(h);
      xs[tid] = xn;
      if (blockIdx.x == 0 && p.normed_out) reinterpret_cast<uint4*>(p.normed_out)[tid] = xn;
    }
    __syncthreads();
  } else {  // all of this lane's chunks of X, issued together
#pragma unroll
    for (int u = 0; u < kUnroll; ++u)
      xv[u] = reinterpret_cast<const uint4*>(p.x)[lane_chunk(first, step, u, chunks).at];
  }
  if (has_pair)
#pragma unroll
    for (int u = 0; u < kUnroll; ++u)
      opaque(a[u]), opaque(b[u]);

  float acc0 = 0.f, acc1 = 0.f;
  if (has_pair) {
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      if (!lane_chunk(first, step, u, chunks).in) continue;
      float fa[8], fb[8], fx[8];
      unpack8(a[u], fa);
      unpack8(b[u], fb);
      if constexpr (kNorm)
        unpack8(xs[lane_chunk(first, step, u, chunks).at], fx);
      else
        unpack8(xv[u], fx);
#pragma unroll
      for (int j = 0; j < 8; ++j) {
        acc0 = fmaf(fa[j], fx[j], acc0);
        acc1 = fmaf(fb[j], fx[j], acc1);
      }
    }
  }
  for (int o = 16; o > 0; o >>= 1) {
    acc0 += __shfl_xor_sync(0xffffffffu, acc0, o);
    acc1 += __shfl_xor_sync(0xffffffffu, acc1, o);
  }
  if (ksplit > 1) {  // the slices' sums in slice order (one group a block: no reuse, one barrier)
    __shared__ float slice_sum[kWarps][2];
    if (lane == 0) slice_sum[warp][0] = acc0, slice_sum[warp][1] = acc1;
    __syncthreads();
    if (slice == 0 && lane == 0) {
      acc0 = slice_sum[warp][0], acc1 = slice_sum[warp][1];
      for (int q = 1; q < ksplit; ++q)
        acc0 += slice_sum[warp + q][0], acc1 += slice_sum[warp + q][1];
    }
  }
  if (slice == 0 && lane == 0 && has_pair) {
    unsigned long long unused = 0;  // no fused argmax on this path
    skinny::write_pair(p, g, 0, 0, acc0, acc1, unused);
  }
  probe_exit(p.probe);
}

}  // namespace

bool launch_skinny_gemm_single_pass(const SkinnyGemmParams& p, int ksplit, cudaStream_t stream) {
  const int64_t chunks = p.k / 8, pairs = skinny::row_pairs(p);
  if (p.m != 1 || p.group_first || p.argmax_keys || chunks > 32 * ksplit * kUnroll) return false;
  if (p.norm_weight && chunks > kThreads) return false;  // one chunk a thread in the prologue
  const int64_t groups = (pairs + kWarps / ksplit - 1) / (kWarps / ksplit);
  if (groups > 0x7fffffff) return false;
  const dim3 grid(static_cast<unsigned>(groups)), block(kThreads);
  // QPARITY_SKINNY_SINGLE_PASS=off in the environment leaves M = 1 to the generic kernel (A/B
  // runs), as QPARITY_NO_PDL=1 does for programmatic dependent launch.
  static const bool enabled = [] {
    const char* v = std::getenv("QPARITY_SKINNY_SINGLE_PASS");
    return !(v && std::strcmp(v, "off") == 0);
  }();
  if (!enabled) return false;
  // The same shared-memory opt-in as skinny_gemm_kernel (launch_m), so both leave the SM's
  // carveout where the other kernels of a decode step want it; set at each launch, as there,
  // because a function attribute belongs to the current device.
  const auto launch = [&](auto kernel, size_t smem) {
    QPARITY_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                            static_cast<int>(kMaxSmem)));
    launch_pdl("skinny_gemm", kernel, grid, block, smem, stream, p, ksplit);
  };
  if (p.norm_weight)
    launch(skinny_gemm_single_pass_kernel<true>, static_cast<size_t>(chunks) * 16);
  else
    launch(skinny_gemm_single_pass_kernel<false>, 0);
  return true;
}

}  // namespace qparity::gpu
