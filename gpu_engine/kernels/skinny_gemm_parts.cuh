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

// 16-byte weight chunks per row a lane loads before it uses any: with two rows per warp, eight
// loads (128 bytes) in flight per lane, 32 KiB per block: enough to cover DRAM latency at full
// bandwidth with one block per SM.
constexpr int kUnroll = 4;

// The dynamic shared-memory opt-in of every skinny GEMM kernel (X staged for up to kSkinnyMaxM
// rows), set alike so that they leave the SM's carveout where a decode step's other kernels want
// it.
constexpr size_t kMaxSmem = 160 * 1024;

// Row pairs of the product: (2g, 2g + 1), the last one (n - 1, n - 1) for odd n; with silu_mul
// (g, g + n/2), the gate and up rows whose outputs meet in the epilogue.
__host__ __device__ inline int64_t row_pairs(const SkinnyGemmParams& p) {
  return p.silu_mul ? p.n / 2 : (p.n + 1) / 2;
}

// Warps along K per row pair (a power of two up to kWarps): split while the row pairs alone would
// leave SMs idle (small N), as long as each lane keeps at least one full unrolled step of its own
// - or while a lane would need a second unrolled step, whose loads could only go out after the
// PDL wait (0.6B's down, K = 3072: six chunks a lane at ksplit 2, three at 4). The sums' order
// follows from it, so every kernel computing the same product must take the same value.
inline int choose_ksplit(int64_t pairs, int64_t chunks, int sms) {
  int ksplit = 1;
  while (ksplit < kWarps && (pairs * ksplit + kWarps - 1) / kWarps < 2 * sms &&
         (chunks >= 2 * ksplit * 32 * kUnroll || chunks > ksplit * 32 * kUnroll))
    ksplit *= 2;
  return ksplit;
}

// Weights are read once per forward: do not let them evict X or anything else from L1. Volatile:
// a plain asm has no memory effect for the compiler, so nothing would keep it above pdl_wait(),
// where its point is (the weight stream overlapping the kernel before). What the single-pass
// kernel did meet was the opposite move, the loads' unpacking hoisted above the wait; its opaque()
// stops that.
__device__ __forceinline__ uint4 load_stream(const uint4* p) {
  uint4 v;
  asm volatile("ld.global.nc.L1::no_allocate.v4.u32 {%0, %1, %2, %3}, [%4];"
               : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
               : "l"(p));
  return v;
}

__device__ __forceinline__ void unpack8(const uint4& v, float (&f)[8]) {
  const __nv_bfloat162* h = reinterpret_cast<const __nv_bfloat162*>(&v);
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    const float2 t = __bfloat1622float2(h[i]);
    f[2 * i] = t.x;
    f[2 * i + 1] = t.y;
  }
}

// 16-byte chunks of a row per thread and staging step: thread t takes chunks t + kThreads * b
// (b < the step's count) of every row, then the next step's. All of a step's global loads go out
// before any of its stores: the compiler may not move a load above a store that could alias it,
// and the scalar loop this replaced paid one L2 round trip (~0.6 us after the PDL release) per
// element it staged. The plain copy takes two chunks a step (K <= 4096 in one round trip), the
// normalizing prologue one (K <= 2048), which keeps the M = 1 kernel at 64 registers: four
// blocks an SM, or two beside an attention block.
constexpr int kCopyChunks = 2, kNormChunks = 1;

__device__ __forceinline__ uint4 pack8(const float (&f)[8]) {
  uint4 v;
  __nv_bfloat162* h = reinterpret_cast<__nv_bfloat162*>(&v);
#pragma unroll
  for (int i = 0; i < 4; ++i)
    h[i] = __floats2bfloat162_rn(f[2 * i], f[2 * i + 1]);
  return v;
}

// The norm weight's chunks of this thread's first staging step, loaded before the PDL wait (a
// weight: no kernel of the forward writes it), so the prologue's second pass waits on nothing.
struct NormWeightChunks {
  uint4 c[kNormChunks];
};
__device__ __forceinline__ void preload_norm_weight(const SkinnyGemmParams& p,
                                                    NormWeightChunks& nw) {
  const int64_t kc = p.k / 8;
#pragma unroll
  for (int b = 0; b < kNormChunks; ++b) {
    const int64_t v = threadIdx.x + static_cast<int64_t>(kThreads) * b;
    nw.c[b] = p.norm_weight && v < kc ? reinterpret_cast<const uint4*>(p.norm_weight)[v]
                                      : make_uint4(0, 0, 0, 0);
  }
}

// X (normalized or not) into shared memory xs [M, k]; ends with a block barrier. Without the
// prologue, rows beyond `rows` are zeros (their sums are computed and never stored). The
// writer block also stores the residual sum and the normalized rows (the capture points).
// Thread t sums the squares of the same chunks of every row whatever M is (eight consecutive
// elements a chunk, chunks in order), so a token's norm does not depend on its batch.
template <int M>
__device__ __forceinline__ void stage_x(const SkinnyGemmParams& p, const __nv_bfloat16* xbase,
                                        int rows, __nv_bfloat16* xs, bool writer,
                                        const NormWeightChunks& nw) {
  __shared__ float partial[kWarps][M];
  __shared__ float rscale[M];
  const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32;
  const int64_t kc = p.k / 8;  // chunks per row
  const uint4* x = reinterpret_cast<const uint4*>(xbase);
  uint4* xsv = reinterpret_cast<uint4*>(xs);
  const auto chunk = [&](int64_t v0, int b) { return v0 + static_cast<int64_t>(kThreads) * b; };
  if (!p.norm_weight) {
    for (int64_t v0 = tid; v0 < kc; v0 += kThreads * kCopyChunks) {
      uint4 t[kCopyChunks][M];
#pragma unroll
      for (int b = 0; b < kCopyChunks; ++b)
#pragma unroll
        for (int m = 0; m < M; ++m)
          t[b][m] =
              chunk(v0, b) < kc && m < rows ? x[m * kc + chunk(v0, b)] : make_uint4(0, 0, 0, 0);
#pragma unroll
      for (int b = 0; b < kCopyChunks; ++b)
#pragma unroll
        for (int m = 0; m < M; ++m)
          if (chunk(v0, b) < kc) xsv[m * kc + chunk(v0, b)] = t[b][m];
    }
  } else {
    const uint4* add = reinterpret_cast<const uint4*>(p.add);
    uint4* residual_out = reinterpret_cast<uint4*>(p.residual_out);
    float sum[M];
#pragma unroll
    for (int m = 0; m < M; ++m)
      sum[m] = 0.f;
    for (int64_t v0 = tid; v0 < kc; v0 += kThreads * kNormChunks) {
      uint4 xv[kNormChunks][M], av[kNormChunks][M];
#pragma unroll
      for (int b = 0; b < kNormChunks; ++b)
#pragma unroll
        for (int m = 0; m < M; ++m) {
          const bool in = chunk(v0, b) < kc;
          xv[b][m] = in ? x[m * kc + chunk(v0, b)] : make_uint4(0, 0, 0, 0);
          av[b][m] = in && add ? add[m * kc + chunk(v0, b)] : make_uint4(0, 0, 0, 0);
        }
#pragma unroll
      for (int b = 0; b < kNormChunks; ++b)
#pragma unroll
        for (int m = 0; m < M; ++m) {
          const int64_t v = chunk(v0, b);
          if (v >= kc) continue;
          float h[8];
          unpack8(xv[b][m], h);
          if (add) {
            float a[8];
            unpack8(av[b][m], a);
#pragma unroll
            for (int j = 0; j < 8; ++j)  // h = bf16(x + add), exact in fp32 after the rounding
              h[j] = __bfloat162float(__float2bfloat16_rn(h[j] + a[j]));
            xv[b][m] = pack8(h);  // exact: every h is a bf16 value
            if (writer && residual_out) residual_out[m * kc + v] = xv[b][m];
          }
          xsv[m * kc + v] = xv[b][m];
#pragma unroll
          for (int j = 0; j < 8; ++j)
            sum[m] += h[j] * h[j];
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
      rscale[tid] = rsqrtf(total / static_cast<float>(p.k) + p.eps);
    }
    __syncthreads();
    // Each thread rewrites the chunks it wrote above: no barrier needed between the passes.
    uint4* normed_out = reinterpret_cast<uint4*>(p.normed_out);
    const uint4* norm_weight = reinterpret_cast<const uint4*>(p.norm_weight);
    for (int64_t v0 = tid; v0 < kc; v0 += kThreads * kNormChunks) {
      uint4 wv[kNormChunks];
#pragma unroll
      for (int b = 0; b < kNormChunks; ++b)
        wv[b] = v0 == tid
                    ? nw.c[b]
                    : (chunk(v0, b) < kc ? norm_weight[chunk(v0, b)] : make_uint4(0, 0, 0, 0));
#pragma unroll
      for (int b = 0; b < kNormChunks; ++b) {
        const int64_t v = chunk(v0, b);
        if (v >= kc) continue;
        float wf[8];
        unpack8(wv[b], wf);
#pragma unroll
        for (int m = 0; m < M; ++m) {
          float h[8];
          unpack8(xsv[m * kc + v], h);
#pragma unroll
          for (int j = 0; j < 8; ++j)
            h[j] = wf[j] * (h[j] * rscale[m]);
          const uint4 out = pack8(h);
          xsv[m * kc + v] = out;
          if (writer && normed_out) normed_out[m * kc + v] = out;
        }
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
