#include <cuda_fp8.h>

#include <algorithm>

#include "gpu_engine/kernels/fp4_gemm.h"
#include "gpu_engine/kernels/launch_check.h"
#include "gpu_engine/kernels/pdl.h"

namespace qparity::gpu {

namespace {

constexpr int kWarps = 4;

// Twice the e2m1 magnitudes {0, .5, 1, 1.5, 2, 3, 4, 6} as int8 bytes, and their negatives.
constexpr uint32_t kPos0 = 0x03020100u, kPos1 = 0x0C080604u;
constexpr uint32_t kNeg0 = 0xFDFEFF00u, kNeg1 = 0xF4F8FAFCu;

// Four doubled codes (int8 x 4) of the nibbles of u's low (high = false) or high 16 bits. The
// selector's nibbles are the codes' magnitudes (bit 3 cleared: it would switch prmt to sign
// replication); the sign mask replicates each code's sign bit, found at a byte's msb of u (odd
// elements) or of u << 4 (even elements).
// PTX prmt in its generic mode: a selector nibble with bit 3 set replicates the selected byte's
// sign (CUDA's __byte_perm documents only the low 3 bits, so it is not used for the mask).
__device__ __forceinline__ uint32_t prmt(uint32_t a, uint32_t b, uint32_t sel) {
  uint32_t r;
  asm("prmt.b32 %0, %1, %2, %3;" : "=r"(r) : "r"(a), "r"(b), "r"(sel));
  return r;
}

__device__ __forceinline__ int e2m1x4_doubled(uint32_t u, bool high) {
  const uint32_t sel = (high ? u >> 16 : u) & 0x7777u;
  const uint32_t pos = prmt(kPos0, kPos1, sel), neg = prmt(kNeg0, kNeg1, sel);
  const uint32_t mask = prmt(u, u << 4, high ? 0xBFAEu : 0x9D8Cu);
  return static_cast<int>((pos & ~mask) | (neg & mask));
}

__device__ __forceinline__ float block_scale(const Fp4GemmParams& p, uint32_t byte) {
  // e4m3fn byte -> fp32 (exact), or E8M0 2^(byte - 127) built from its bits.
  if (p.b_scale == Fp4BlockScale::kE4m3Group16) {
    __nv_fp8_e4m3 v;
    v.__x = static_cast<__nv_fp8_storage_t>(byte);
    return static_cast<float>(v);
  }
  return byte > 0 ? __int_as_float(static_cast<int>(byte << 23)) : __int_as_float(0x00400000);
}

// acc plus token row t's share of one 16-column chunk at column kk, whose weights are the doubled
// codes w[0..3] (int8 x 4) with block scale sb. W4A4: the exact int32 sum (dp4a) / 4, times sb,
// times the activation scale, fma'd in. W4A16 (p.x): the bf16 inputs times the doubled codes,
// fma'd in fp32 in ascending k, halved (exact), then times sb, fma'd in.
__device__ __forceinline__ float add_chunk(const Fp4GemmParams& p, int64_t t, int64_t kk,
                                           const int* w, float sb, float acc) {
  if (p.x) {
    const uint4* xr = reinterpret_cast<const uint4*>(p.x + t * p.k + kk);
    float sum = 0.f;
#pragma unroll
    for (int v = 0; v < 2; ++v) {
      const uint4 xv = xr[v];
      const __nv_bfloat162* h = reinterpret_cast<const __nv_bfloat162*>(&xv);
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const float2 f = __bfloat1622float2(h[e]);
        const int i = v * 8 + 2 * e;
        sum = fmaf(f.x, static_cast<float>(static_cast<int8_t>(w[i / 4] >> (8 * (i % 4)))), sum);
        sum =
            fmaf(f.y, static_cast<float>(static_cast<int8_t>(w[i / 4] >> (8 * (i % 4 + 1)))), sum);
      }
    }
    return fmaf(sum * 0.5f, sb, acc);
  }
  const int4 a = *reinterpret_cast<const int4*>(p.a + t * p.k + kk);
  int sum = __dp4a(a.x, w[0], 0);
  sum = __dp4a(a.y, w[1], sum);
  sum = __dp4a(a.z, w[2], sum);
  sum = __dp4a(a.w, w[3], sum);
  const float chunk = static_cast<float>(sum) * 0.25f;  // exact: |sum| <= 16 * 144
  return fmaf(__fmul_rn(chunk, sb), p.a_scales[t * (p.k / p.a_group) + kk / p.a_group], acc);
}

// One warp per kRows output rows. Each lane streams 16 bytes of codes (32 columns: two 16-groups,
// or one MX block) of every row per step, kUnroll steps of all kRows rows in flight before any is
// used (a decode-sized GEMV is bound by the bytes in flight), summing each row's 16-column chunks
// in ascending k.
template <int kTokens, int kRows>
__global__ void __launch_bounds__(kWarps * 32) fp4_gemm_kernel(Fp4GemmParams p) {
  constexpr int kUnroll = 4;
  const int lane = threadIdx.x % 32;
  const int64_t n0 = (static_cast<int64_t>(blockIdx.x) * kWarps + threadIdx.x / 32) * kRows;
  if (n0 >= p.n) return;
  const int64_t m0 = static_cast<int64_t>(blockIdx.y) * kTokens;
  const int mt = p.m - m0 < kTokens ? static_cast<int>(p.m - m0) : kTokens;
  const bool nv = p.b_scale == Fp4BlockScale::kE4m3Group16;
  const int64_t scale_cols = p.k / (nv ? 16 : 32);
  float acc[kRows][kTokens];
#pragma unroll
  for (int r = 0; r < kRows; ++r)
#pragma unroll
    for (int j = 0; j < kTokens; ++j)
      acc[r][j] = 0.f;
  for (int64_t k0 = static_cast<int64_t>(lane) * 32; k0 < p.k; k0 += 32 * 32 * kUnroll) {
    uint4 raw[kRows][kUnroll];
    uint32_t sbyte[kRows][kUnroll];
#pragma unroll
    for (int r = 0; r < kRows; ++r) {
      // Rows past n re-read the last row (never stored): no divergence in the loads.
      const int64_t n = min(n0 + r, p.n - 1);
#pragma unroll
      for (int u = 0; u < kUnroll; ++u) {
        const int64_t kk = k0 + static_cast<int64_t>(u) * 32 * 32;
        if (kk >= p.k) break;
        raw[r][u] = __ldg(reinterpret_cast<const uint4*>(p.b + n * (p.k / 2) + kk / 2));
        // NVFP4: the two 16-groups' bytes (an aligned pair); MX: the block's byte, twice.
        const uint8_t* srow = p.b_scales + n * scale_cols;
        sbyte[r][u] = nv ? __ldg(reinterpret_cast<const uint16_t*>(srow + kk / 16))
                         : __ldg(srow + kk / 32) * 0x101u;
      }
    }
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      const int64_t kk = k0 + static_cast<int64_t>(u) * 32 * 32;
      if (kk >= p.k) break;
#pragma unroll
      for (int r = 0; r < kRows; ++r) {
        const uint32_t words[4] = {raw[r][u].x, raw[r][u].y, raw[r][u].z, raw[r][u].w};
        int w[8];
#pragma unroll
        for (int i = 0; i < 8; ++i)
          w[i] = e2m1x4_doubled(words[i / 2], i % 2 == 1);
        const float sb[2] = {block_scale(p, sbyte[r][u] & 0xFFu), block_scale(p, sbyte[r][u] >> 8)};
#pragma unroll
        for (int j = 0; j < kTokens; ++j) {
          if (j >= mt) break;
#pragma unroll
          for (int h = 0; h < 2; ++h)
            acc[r][j] = add_chunk(p, m0 + j, kk + 16 * h, w + 4 * h, sb[h], acc[r][j]);
        }
      }
    }
  }
#pragma unroll
  for (int r = 0; r < kRows; ++r)
#pragma unroll
    for (int j = 0; j < kTokens; ++j) {
      float a = acc[r][j];
#pragma unroll
      for (int o = 16; o > 0; o >>= 1)
        a += __shfl_xor_sync(0xffffffffu, a, o);
      const int64_t n = n0 + r;
      if (lane == 0 && j < mt && n < p.n) {
        if (p.alpha != 1.f) a = __fmul_rn(a, p.alpha);
        if (p.bias) a = __fadd_rn(a, p.bias[n]);
        p.y[(m0 + j) * p.n + n] = __float2bfloat16_rn(a);
      }
    }
}

// One token (decode): each warp walks rows n = w, w + W, ... (W warps in the grid, a few per SM
// slot), each row in steps of kStepUnits 32-column units a lane, and loads the next step (of this
// row or the next) before it computes the current one, so a warp always has loads in flight while
// it decodes. Same sums as fp4_gemm_kernel<1, 1>: each row's 16-column chunks in ascending k per
// lane, the lanes added by the same shuffles. Launched with PDL: the first weights are requested
// while the activation quantizer still runs.
constexpr int kStepUnits = 2;
constexpr int64_t kStepCols = 32 * 32 * kStepUnits;

struct GemvStep {
  uint4 raw[kStepUnits];
  uint32_t sbyte[kStepUnits];
};

__device__ __forceinline__ void load_step(const Fp4GemmParams& p, bool nv, int64_t n, int64_t k0,
                                          GemvStep& st) {
  const uint8_t* srow = p.b_scales + n * (p.k / (nv ? 16 : 32));
#pragma unroll
  for (int u = 0; u < kStepUnits; ++u) {
    const int64_t kk = k0 + static_cast<int64_t>(u) * 32 * 32;
    if (kk >= p.k) break;
    st.raw[u] = __ldg(reinterpret_cast<const uint4*>(p.b + n * (p.k / 2) + kk / 2));
    st.sbyte[u] = nv ? __ldg(reinterpret_cast<const uint16_t*>(srow + kk / 16))
                     : __ldg(srow + kk / 32) * 0x101u;
  }
}

__global__ void __launch_bounds__(kWarps * 32, 8) fp4_gemv_kernel(Fp4GemmParams p) {
  const int lane = threadIdx.x % 32;
  const int64_t warp = static_cast<int64_t>(blockIdx.x) * kWarps + threadIdx.x / 32;
  const int64_t warps = static_cast<int64_t>(gridDim.x) * kWarps;
  const bool nv = p.b_scale == Fp4BlockScale::kE4m3Group16;
  const int64_t steps = (p.k + kStepCols - 1) / kStepCols;
  int64_t n = warp, step = 0;
  if (n >= p.n) return;
  GemvStep cur;
  load_step(p, nv, n, lane * 32, cur);  // weights only: before the wait (pdl.h)
  pdl_wait();
  pdl_launch_dependents();
  float acc = 0.f;
  while (true) {
    // The next step's loads, issued before this step's arithmetic.
    const bool row_ends = step + 1 == steps;
    const int64_t nn = row_ends ? n + warps : n, ns = row_ends ? 0 : step + 1;
    GemvStep next;
    if (nn < p.n) load_step(p, nv, nn, ns * kStepCols + lane * 32, next);
    const int64_t k0 = step * kStepCols + lane * 32;
#pragma unroll
    for (int u = 0; u < kStepUnits; ++u) {
      const int64_t kk = k0 + static_cast<int64_t>(u) * 32 * 32;
      if (kk >= p.k) break;
      const uint32_t words[4] = {cur.raw[u].x, cur.raw[u].y, cur.raw[u].z, cur.raw[u].w};
      const float sb[2] = {block_scale(p, cur.sbyte[u] & 0xFFu), block_scale(p, cur.sbyte[u] >> 8)};
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const int w[4] = {e2m1x4_doubled(words[2 * h], false), e2m1x4_doubled(words[2 * h], true),
                          e2m1x4_doubled(words[2 * h + 1], false),
                          e2m1x4_doubled(words[2 * h + 1], true)};
        acc = add_chunk(p, 0, kk + 16 * h, w, sb[h], acc);
      }
    }
    if (row_ends) {
      float a = acc;
#pragma unroll
      for (int o = 16; o > 0; o >>= 1)
        a += __shfl_xor_sync(0xffffffffu, a, o);
      if (lane == 0) {
        if (p.alpha != 1.f) a = __fmul_rn(a, p.alpha);
        if (p.bias) a = __fadd_rn(a, p.bias[n]);
        p.y[n] = __float2bfloat16_rn(a);
      }
      acc = 0.f;
    }
    if (nn >= p.n) break;
    n = nn;
    step = ns;
    cur = next;
  }
}

template <int kTokens, int kRows>
void launch_tile(const Fp4GemmParams& p, cudaStream_t stream) {
  const int64_t rows_per_block = int64_t{kWarps} * kRows;
  const dim3 grid(static_cast<unsigned>((p.n + rows_per_block - 1) / rows_per_block),
                  static_cast<unsigned>((p.m + kTokens - 1) / kTokens));
  fp4_gemm_kernel<kTokens, kRows><<<grid, kWarps * 32, 0, stream>>>(p);
}

}  // namespace

void launch_fp4_scaled_gemm(const Fp4GemmParams& p, cudaStream_t stream) {
  constexpr const char* kn = "fp4_scaled_gemm";
  require((p.x || (p.a && p.a_scales)) && p.b && p.b_scales && p.y, kn,
          "x (W4A16) or a and a_scales (W4A4), b, b_scales and y are required");
  require(p.m >= 0 && p.n > 0 && p.k > 0, kn, "m >= 0, n > 0, k > 0");
  require(p.k % 32 == 0, kn,
          "k " + std::to_string(p.k) + " must be a multiple of 32 (16 bytes of codes a lane)");
  require(p.x || ((p.a_group == 16 || p.a_group == 32) && p.k % p.a_group == 0), kn,
          "activation scale groups must be 16 or 32 columns dividing k");
  require(aligned(p.x ? static_cast<const void*>(p.x) : p.a, 16) && aligned(p.b, 16) &&
              aligned(p.b_scales, 2),
          kn, "x / a and b must be 16-byte aligned, b_scales 2-byte");
  require(p.m <= 65535LL * 8, kn, "m too large for one launch");
  if (p.m == 0) return;
  // One token: the pipelined GEMV. More: tiles as token_tiles.cuh's (up to 4, then 8 tokens), 2
  // rows a warp, each activation chunk read once for both.
  if (p.m == 1) {
    // Enough warps to fill every SM's slots (8 blocks of 4 warps at <= 64 registers), no more:
    // each then walks several rows with its loads pipelined.
    static const int sms = [] {
      int dev = 0, v = 0;
      cudaGetDevice(&dev);
      cudaDeviceGetAttribute(&v, cudaDevAttrMultiProcessorCount, dev);
      return v > 0 ? v : 132;
    }();
    const int64_t blocks = std::min<int64_t>((p.n + kWarps - 1) / kWarps, int64_t{sms} * 8);
    launch_pdl(kn, fp4_gemv_kernel, dim3(static_cast<unsigned>(blocks)), dim3(kWarps * 32), 0,
               stream, p);
    return;
  } else if (p.m <= 4) {
    launch_tile<4, 2>(p, stream);
  } else {
    launch_tile<8, 2>(p, stream);
  }
  check_launch(kn);
}

}  // namespace qparity::gpu
