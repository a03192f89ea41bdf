#pragma once
// The skinny GEMM's (skinny_gemm.h) prologue and epilogue pieces: X staged in shared memory with
// the fused residual-add + RMSNorm prologue, the per-pair epilogue (bf16 / fp32 / SiLU-and-mul, the
// fused argmax) and the block's argmax reduction. Device code only; included by the kernels'
// translation units.
#include <cuda_bf16.h>

#include <cstdint>

#include "gpu_engine/kernels/skinny_gemm.h"

namespace qparity::gpu::skinny {

constexpr int kWarps = 8, kThreads = kWarps * 32;

__device__ __forceinline__ void unpack8(const uint4& v, float (&f)[8]) {
  const __nv_bfloat162* h = reinterpret_cast<const __nv_bfloat162*>(&v);
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    const float2 t = __bfloat1622float2(h[i]);
    f[2 * i] = t.x;
    f[2 * i + 1] = t.y;
  }
}

// X (normalized or not) into shared memory xs [M, k]; ends with a block barrier. Without the
// prologue, rows beyond `rows` are zeros (their sums are computed and never stored). The
// writer block also stores the residual sum and the normalized rows (the capture points).
template <int M>
__device__ __forceinline__ void stage_x(const SkinnyGemmParams& p, const __nv_bfloat16* xbase,
                                        int rows, __nv_bfloat16* xs, bool writer) {
  __shared__ float partial[kWarps][M];
  __shared__ float rscale[M];
  const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32;
  const int64_t k = p.k;
  if (!p.norm_weight) {
    const uint4* src = reinterpret_cast<const uint4*>(xbase);
    uint4* dst = reinterpret_cast<uint4*>(xs);
    for (int64_t i = tid; i < M * k / 8; i += kThreads)
      dst[i] = i < rows * k / 8 ? src[i] : make_uint4(0, 0, 0, 0);
  } else {
    float sum[M];
#pragma unroll
    for (int m = 0; m < M; ++m)
      sum[m] = 0.f;
    for (int64_t i = tid; i < k; i += kThreads) {
#pragma unroll
      for (int m = 0; m < M; ++m) {
        float h = __bfloat162float(p.x[m * k + i]);
        if (p.add) {
          const __nv_bfloat16 hb = __float2bfloat16_rn(h + __bfloat162float(p.add[m * k + i]));
          if (writer && p.residual_out) p.residual_out[m * k + i] = hb;
          h = __bfloat162float(hb);
        }
        xs[m * k + i] = __float2bfloat16_rn(h);  // exact: h is a bf16 value
        sum[m] += h * h;
      }
    }
#pragma unroll
    for (int m = 0; m < M; ++m) {
      float s = sum[m];
      for (int o = 16; o > 0; o >>= 1)
        s += __shfl_xor_sync(0xffffffffu, s, o);
      if (lane == 0) partial[warp][m] = s;
    }
    __syncthreads();
    if (tid < M) {
      float total = 0.f;
      for (int w = 0; w < kWarps; ++w)
        total += partial[w][tid];
      rscale[tid] = rsqrtf(total / static_cast<float>(k) + p.eps);
    }
    __syncthreads();
    // Each thread rewrites the elements it wrote above: no barrier needed between the passes.
    for (int64_t i = tid; i < k; i += kThreads) {
      const float wi = __bfloat162float(p.norm_weight[i]);
#pragma unroll
      for (int m = 0; m < M; ++m) {
        const __nv_bfloat16 v =
            __float2bfloat16_rn(wi * (__bfloat162float(xs[m * k + i]) * rscale[m]));
        xs[m * k + i] = v;
        if (writer && p.normed_out) p.normed_out[m * k + i] = v;
      }
    }
  }
  __syncthreads();
}

// Token m's outputs of row pair g: rows (2g, 2g + 1), or with SiLU-and-mul (g, g + N/2), whose
// fp32 sums are a0 and a1. `best` collects the fused argmax's key (fp32 output).
__device__ __forceinline__ void write_pair(const SkinnyGemmParams& p, int64_t g, int64_t row0,
                                           int m, float a0, float a1, unsigned long long& best) {
  const int64_t n = p.n, half = n / 2;
  if (p.silu_mul) {
    const __nv_bfloat16 gb16 = __float2bfloat16_rn(a0), ub16 = __float2bfloat16_rn(a1);
    if (p.gate_up_out) {
      p.gate_up_out[(row0 + m) * n + g] = gb16;
      p.gate_up_out[(row0 + m) * n + g + half] = ub16;
    }
    const float gf = __bfloat162float(gb16), uf = __bfloat162float(ub16);
    static_cast<__nv_bfloat16*>(p.y)[(row0 + m) * half + g] =
        __float2bfloat16_rn(gf / (1.f + expf(-gf)) * uf);
  } else if (p.y_f32) {
    float* y = static_cast<float*>(p.y) + (row0 + m) * n;
    y[2 * g] = a0;
    if (2 * g + 1 < n) y[2 * g + 1] = a1;
    if (p.argmax_keys) {
      best = max(best, argmax_key(a0, static_cast<uint32_t>(2 * g)));
      if (2 * g + 1 < n) best = max(best, argmax_key(a1, static_cast<uint32_t>(2 * g + 1)));
    }
  } else {
    __nv_bfloat16* y = static_cast<__nv_bfloat16*>(p.y) + (row0 + m) * n;
    y[2 * g] = __float2bfloat16_rn(a0);
    if (2 * g + 1 < n) y[2 * g + 1] = __float2bfloat16_rn(a1);
  }
}

// The block's best argmax key per token (`holds`: this thread's `best` belongs to token `lane`),
// then one global atomicMax per token. Every thread of the block calls it.
template <int M>
__device__ __forceinline__ void block_argmax(const SkinnyGemmParams& p, unsigned long long best,
                                             bool holds, int lane, int64_t row0, int rows) {
  __shared__ unsigned long long block_best[M];
  if (threadIdx.x < M) block_best[threadIdx.x] = 0;
  __syncthreads();
  if (holds && best != 0) atomicMax(&block_best[lane], best);
  __syncthreads();
  if (static_cast<int>(threadIdx.x) < rows && block_best[threadIdx.x] != 0)
    atomicMax(p.argmax_keys + row0 + threadIdx.x, block_best[threadIdx.x]);
}

}  // namespace qparity::gpu::skinny
