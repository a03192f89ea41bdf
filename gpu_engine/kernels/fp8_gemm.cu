#include <cuda_fp8.h>

#include <cmath>

#include "gpu_engine/kernels/fp8_gemm.h"
#include "gpu_engine/kernels/launch_check.h"
#include "gpu_engine/kernels/pdl.h"
#include "gpu_engine/kernels/token_tiles.cuh"

namespace qparity::gpu {

namespace {

constexpr int kThreads = 128;

__device__ float fp8_scale_of(const QuantizeFp8Params& p, float amax) {
  if (p.amax_floor > 0) amax = fmaxf(amax, p.amax_floor);
  float s = __fdiv_rn(amax, 448.f);
  if (p.min_scale > 0) s = fmaxf(s, p.min_scale);
  return s;
}

// The E8M0 scale of an MX block (fp8_gemm.h): a power of two, built from its bits. emax: the
// element format's largest exponent (8 for e4m3fn, 2 for e2m1).
__device__ float mx_bump_scale(float amax, int emax) {
  int byte = 0;
  if (isinf(amax)) {
    byte = 254;
  } else if (amax > 0.f) {
    int e;
    const float f = frexpf(amax, &e);  // amax = f * 2^e, f in [0.5, 1): exact
    const int p = (e - 1) + (f >= 0.875f ? 1 : 0);
    byte = p > 127 ? 254 : min(max(p - emax + 127, 0), 254);
  }
  return byte > 0 ? __int_as_float(byte << 23) : __int_as_float(0x00400000);  // 2^-127
}

// t clamped to +-6 and rounded half to even on e2m1's grid (steps 0.5 below 2, 1 below 4, then
// 2).
__device__ float e2m1_value(float t) {
  const float a = fminf(fabsf(t), 6.f);  // NaN: fminf gives 6, as CUDA's e2m1 cast saturates
  const float r = a < 2.f ? rintf(a * 2.f) * 0.5f : a < 4.f ? rintf(a) : rintf(a * 0.5f) * 2.f;
  return signbit(t) ? -r : r;
}

// An e2m1 value as the e4m3fn byte of the same value (exact).
__device__ uint8_t e4m3_byte(float v) {
  return static_cast<uint8_t>(__nv_cvt_float_to_fp8(v, __NV_SATFINITE, __NV_E4M3));
}

__device__ uint8_t fp8_code(const QuantizeFp8Params& p, float x, float s, float inv) {
  if (s == 0.f) {
    if (!p.zero_saturates) return 0;
    return x < 0 ? 0xFE : 0x7E;  // -448 / +448
  }
  float t = p.multiply_reciprocal ? __fmul_rn(x, inv) : __fdiv_rn(x, s);
  t = fmaxf(fminf(t, 448.f), -448.f);
  return static_cast<uint8_t>(__nv_cvt_float_to_fp8(t, __NV_SATFINITE, __NV_E4M3));
}

// max |x| over [begin, end) of one row, reduced over the block (every thread gets it).
__device__ float block_amax(const __nv_bfloat16* x, int64_t begin, int64_t end) {
  float a = 0.f;
  for (int64_t i = begin + threadIdx.x; i < end; i += kThreads)
    a = fmaxf(a, fabsf(__bfloat162float(x[i])));
  __shared__ float partial[kThreads / 32];
  for (int o = 16; o > 0; o >>= 1)
    a = fmaxf(a, __shfl_xor_sync(0xffffffffu, a, o));
  __syncthreads();  // partial may still be read by a previous call
  if (threadIdx.x % 32 == 0) partial[threadIdx.x / 32] = a;
  __syncthreads();
  a = 0.f;
  for (int w = 0; w < kThreads / 32; ++w)
    a = fmaxf(a, partial[w]);
  return a;
}

// Dynamic per-tensor: the amax of everything, as the bits of a non-negative float (ordered like
// unsigned integers), by atomicMax.
__global__ void tensor_amax_kernel(QuantizeFp8Params p) {
  const float a = block_amax(p.x + static_cast<int64_t>(blockIdx.x) * p.k, 0, p.k);
  if (threadIdx.x == 0)
    atomicMax(reinterpret_cast<unsigned int*>(p.tensor_amax), __float_as_uint(a));
}

// NVFP4's e4m3 block scale of a 16-group (fp8_gemm.h).
__device__ float nvfp4_block_scale(const QuantizeFp8Params& p, float amax) {
  const float v = p.nvfp4_divide ? __fmul_rn(p.nvfp4_global, __fdiv_rn(amax, 6.f))
                                 : __fmul_rn(p.nvfp4_global, __fmul_rn(amax, 1.f / 6.f));
  __nv_fp8_e4m3 e;
  e.__x = __nv_cvt_float_to_fp8(fminf(v, 448.f), __NV_SATFINITE, __NV_E4M3);
  const float s = static_cast<float>(e);
  return s == 0.f && p.nvfp4_divide ? 0.125f : s;
}

// NVFP4's element quotient of x in a block with scale s, before the e2m1 rounding (fp8_gemm.h).
__device__ float nvfp4_quotient(const QuantizeFp8Params& p, float x, float s) {
  float t;
  if (p.nvfp4_divide) {
    t = __fdiv_rn(x, __fdiv_rn(s, p.nvfp4_global));
  } else {
    const float m = __fmul_rn(s, __frcp_rn(p.nvfp4_global));
    t = __fmul_rn(x, m == 0.f ? 0.f : __frcp_rn(m));
  }
  return isnan(t) ? 0.f : t;
}

// The scale of one group with this amax, for the modes with per-group dynamic scales.
__device__ float group_scale(const QuantizeFp8Params& p, float amax) {
  if (p.nvfp4_global > 0.f) return nvfp4_block_scale(p, amax);
  if (p.mx_bump) return mx_bump_scale(amax, p.mx_e2m1 ? 2 : 8);
  return fp8_scale_of(p, amax);
}

// Stores element i's code (and its doubled e2m1 code when asked).
__device__ void store_code(const QuantizeFp8Params& p, int64_t i, float x, float s, float inv) {
  if (p.nvfp4_global > 0.f || p.mx_e2m1) {
    const float v = e2m1_value(p.nvfp4_global > 0.f ? nvfp4_quotient(p, x, s) : __fdiv_rn(x, s));
    p.q[i] = e4m3_byte(v);
    if (p.q_doubled) p.q_doubled[i] = static_cast<int8_t>(__float2int_rn(v * 2.f));
    return;
  }
  p.q[i] = fp8_code(p, x, s, inv);
}

// Groups of 16, 32, 64 or 128 that divide k: a thread per element, the group's amax by warp
// shuffles within the group's lanes, then (groups of 64, 128) over the group's warps through
// shared memory; grid (ceil(k / kThreads), m). The amax is block_amax's (a max is exact in any
// order), so the codes are the row kernel's.
// Launched with PDL (pdl.h): it waits for the kernel before it (x, and the workspace the previous
// GEMM may still read) and lets the GEMM after it start its weight loads early.
__global__ void quantize_small_groups_kernel(QuantizeFp8Params p) {
  pdl_wait();
  pdl_launch_dependents();
  const int64_t row = blockIdx.y;
  const int64_t i = static_cast<int64_t>(blockIdx.x) * kThreads + threadIdx.x;
  const bool in = i < p.k;
  const float x = in ? __bfloat162float(p.x[row * p.k + i]) : 0.f;
  float amax = fmaxf(0.f, fabsf(x));  // as block_amax: a NaN element does not become the max
  const int lanes = p.group < 32 ? static_cast<int>(p.group) : 32;
  for (int o = lanes / 2; o > 0; o >>= 1)
    amax = fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, o));
  if (p.group > 32) {  // uniform over the block: every thread reaches the barrier
    __shared__ float warp_amax[kThreads / 32];
    if (threadIdx.x % 32 == 0) warp_amax[threadIdx.x / 32] = amax;
    __syncthreads();
    const int per = static_cast<int>(p.group) / 32,
              first = static_cast<int>(threadIdx.x) / 32 / per * per;
    amax = 0.f;
    for (int w = 0; w < per; ++w)
      amax = fmaxf(amax, warp_amax[first + w]);
  }
  if (!in) return;
  const float s = group_scale(p, amax);
  const float inv = s == 0.f ? 0.f : __fdiv_rn(1.f, s);
  store_code(p, row * p.k + i, x, s, inv);
  if (i % p.group == 0) {
    const int64_t g = row * (p.k / p.group) + i / p.group;
    p.scales[g] = s;
    if (p.reported_scales) p.reported_scales[g] = __fdiv_rn(s, p.nvfp4_global);
    if (p.scales_group_major) p.scales_group_major[i / p.group * p.group_major_rows + row] = s;
  }
}

// One block per token row.
__global__ void quantize_fp8_kernel(QuantizeFp8Params p) {
  const int64_t row = blockIdx.x;
  const __nv_bfloat16* x = p.x + row * p.k;
  const int64_t group = p.mode == Fp8ActMode::kDynamicGroup ? p.group : p.k;
  const int64_t groups = (p.k + group - 1) / group;
  for (int64_t g = 0; g < groups; ++g) {
    const int64_t begin = g * group, end = min(p.k, begin + group);
    float s;
    switch (p.mode) {
      case Fp8ActMode::kStatic:
        s = p.static_scale;
        break;
      case Fp8ActMode::kDynamicTensor:
        s = fp8_scale_of(p, *p.tensor_amax);
        break;
      case Fp8ActMode::kDynamicToken:
      case Fp8ActMode::kDynamicGroup: {
        s = group_scale(p, block_amax(x, begin, end));
        break;
      }
    }
    const float inv = s == 0.f ? 0.f : __fdiv_rn(1.f, s);
    if (threadIdx.x == 0) {
      p.scales[row * groups + g] = s;
      if (p.reported_scales) p.reported_scales[row * groups + g] = __fdiv_rn(s, p.nvfp4_global);
      if (p.scales_group_major) {
        const int64_t copies = groups == 1 ? p.group_major_repeat : 1;
        for (int64_t c = 0; c < copies; ++c)
          p.scales_group_major[(g + c) * p.group_major_rows + row] = s;
      }
    }
    for (int64_t i = begin + threadIdx.x; i < end; i += kThreads)
      store_code(p, row * p.k + i, __bfloat162float(x[i]), s, inv);
  }
}

__device__ __forceinline__ float fp8_to_float(uint32_t byte) {
  __nv_fp8_e4m3 v;
  v.__x = static_cast<__nv_fp8_storage_t>(byte);
  return static_cast<float>(v);
}

constexpr int kWarps = 4;

template <int kTokens>
__global__ void __launch_bounds__(kWarps * 32) fp8_gemm_kernel(Fp8GemmParams p) {
  const int lane = threadIdx.x % 32;
  const int64_t n = static_cast<int64_t>(blockIdx.x) * kWarps + threadIdx.x / 32;
  if (n >= p.n) return;
  int32_t expert;
  int64_t row0, rows;
  if (!block_expert_rows(p.groups, p.m, &expert, &row0, &rows)) return;
  const int64_t m0 = static_cast<int64_t>(blockIdx.y) * kTokens;
  if (m0 >= rows) return;
  const int mt = rows - m0 < kTokens ? static_cast<int>(rows - m0) : kTokens;
  const Fp8Expert ex = p.groups.first ? p.experts[expert] : Fp8Expert{p.b, p.b_scales, p.bias};
  const int64_t a_cols = (p.k + p.a_group - 1) / p.a_group;
  const uint8_t* abase = p.a + row0 * p.k;
  const float* a_scales = p.a_scales + row0 * a_cols;
  __nv_bfloat16* ybase = p.y + row0 * p.n;
  const int64_t b_cols = (p.k + p.b_block_cols - 1) / p.b_block_cols;
  const float* b_scale_row = ex.b_scales + (n / p.b_block_rows) * b_cols;
  // One scale pair for the whole row when neither side's scale varies along K.
  const bool per_chunk = a_cols > 1 || b_cols > 1;
  float acc[kTokens];
#pragma unroll
  for (int j = 0; j < kTokens; ++j)
    acc[j] = 0.f;
  const uint8_t* brow = ex.b + n * p.k;
  // kUnroll weight loads of 16 bytes in flight per lane before any is used (a decode-sized GEMV
  // is bound by the bytes in flight); each lane still sums its chunks in ascending k.
  constexpr int kUnroll = 4;
  for (int64_t k1 = static_cast<int64_t>(lane) * 16; k1 < p.k; k1 += 32 * 16 * kUnroll) {
    uint4 wraws[kUnroll];
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      const int64_t kk = k1 + static_cast<int64_t>(u) * 32 * 16;
      if (kk < p.k) wraws[u] = __ldg(reinterpret_cast<const uint4*>(brow + kk));
    }
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      const int64_t k0 = k1 + static_cast<int64_t>(u) * 32 * 16;
      if (k0 >= p.k) break;
      const uint4 wraw = wraws[u];
      const uint32_t wv[4] = {wraw.x, wraw.y, wraw.z, wraw.w};
      float w[16];
#pragma unroll
      for (int i = 0; i < 16; ++i)
        w[i] = fp8_to_float((wv[i / 4] >> (8 * (i % 4))) & 0xFF);
      const float sb = per_chunk ? b_scale_row[k0 / p.b_block_cols] : 0.f;
#pragma unroll
      for (int j = 0; j < kTokens; ++j) {
        if (j >= mt) break;
        const uint4 araw = *reinterpret_cast<const uint4*>(abase + (m0 + j) * p.k + k0);
        const uint32_t av[4] = {araw.x, araw.y, araw.z, araw.w};
        float chunk = 0.f;
#pragma unroll
        for (int i = 0; i < 16; ++i)
          chunk = fmaf(fp8_to_float((av[i / 4] >> (8 * (i % 4))) & 0xFF), w[i], chunk);
        if (per_chunk)
          acc[j] = fmaf(__fmul_rn(chunk, sb), a_scales[(m0 + j) * a_cols + k0 / p.a_group], acc[j]);
        else
          acc[j] += chunk;
      }
    }
  }
#pragma unroll
  for (int j = 0; j < kTokens; ++j) {
    float a = acc[j];
#pragma unroll
    for (int o = 16; o > 0; o >>= 1)
      a += __shfl_xor_sync(0xffffffffu, a, o);
    if (lane == 0 && j < mt) {
      if (!per_chunk) a = __fmul_rn(__fmul_rn(a, b_scale_row[0]), a_scales[(m0 + j) * a_cols]);
      if (p.alpha != 1.f) a = __fmul_rn(a, p.alpha);
      if (ex.bias) a = __fadd_rn(a, ex.bias[n]);
      ybase[(m0 + j) * p.n + n] = __float2bfloat16_rn(a);
    }
  }
}

}  // namespace

int64_t fp8_act_scale_cols(Fp8ActMode mode, int64_t k, int64_t group) {
  return mode == Fp8ActMode::kDynamicGroup ? (k + group - 1) / group : 1;
}

void launch_quantize_fp8(const QuantizeFp8Params& p, cudaStream_t stream) {
  constexpr const char* kn = "quantize_fp8";
  require(p.x && p.q && p.scales, kn, "x, q and scales are required");
  require(p.m >= 0 && p.k > 0, kn, "m >= 0, k > 0");
  require(p.mode != Fp8ActMode::kDynamicGroup || p.group > 0, kn, "group must be > 0");
  require(p.mode != Fp8ActMode::kDynamicTensor || p.tensor_amax, kn,
          "a dynamic per-tensor scale needs tensor_amax scratch");
  require(p.mode != Fp8ActMode::kStatic || p.static_scale > 0, kn, "a static scale must be > 0");
  require(!p.mx_bump ||
              (p.mode == Fp8ActMode::kDynamicGroup && p.group == 32 && !p.multiply_reciprocal),
          kn, "MX scales need dynamic 32-element groups and a division");
  require(!p.mx_e2m1 || p.mx_bump, kn, "e2m1 elements come with MX scales");
  require(!(p.nvfp4_global > 0.f) ||
              (p.mode == Fp8ActMode::kDynamicGroup && p.group == 16 && !p.mx_bump),
          kn, "NVFP4 scales need dynamic 16-element groups");
  require(p.nvfp4_global == 0.f || (p.nvfp4_global > 0.f && std::isfinite(p.nvfp4_global)), kn,
          "the NVFP4 input global scale must be finite and > 0");
  require(!p.q_doubled || p.nvfp4_global > 0.f || p.mx_e2m1, kn, "doubled codes are e2m1's");
  require(!p.reported_scales || p.nvfp4_global > 0.f, kn,
          "reported scales are NVFP4's (s / global scale)");
  require(!p.scales_group_major || (p.group_major_rows >= p.m && p.group_major_repeat >= 1), kn,
          "group-major scales need a row stride of at least m and a repeat of at least 1");
  if (p.m == 0) return;
  if (p.mode == Fp8ActMode::kDynamicGroup &&
      (p.group == 16 || p.group == 32 || p.group == 64 || p.group == kThreads) &&
      p.k % p.group == 0 && p.m <= 65535) {  // tokens on the grid's y
    const dim3 grid(static_cast<unsigned>((p.k + kThreads - 1) / kThreads),
                    static_cast<unsigned>(p.m));
    launch_pdl(kn, quantize_small_groups_kernel, grid, dim3(kThreads), 0, stream, p);
    return;
  }
  if (p.mode == Fp8ActMode::kDynamicTensor) {
    if (cudaMemsetAsync(p.tensor_amax, 0, sizeof(float), stream) != cudaSuccess)
      throw_launch_error(kn, "memset of tensor_amax failed");
    tensor_amax_kernel<<<static_cast<unsigned>(p.m), kThreads, 0, stream>>>(p);
    check_launch(kn);
  }
  quantize_fp8_kernel<<<static_cast<unsigned>(p.m), kThreads, 0, stream>>>(p);
  check_launch(kn);
}

void launch_fp8_scaled_gemm(const Fp8GemmParams& p, cudaStream_t stream) {
  constexpr const char* kn = "fp8_scaled_gemm";
  if (p.groups.on())
    require(p.a && p.a_scales && p.y && p.experts && p.groups.active && p.groups.max_active >= 1 &&
                p.groups.max_active <= 65535,
            kn,
            "grouped: a, a_scales, y, experts, active and max_active in [1, 65535] are required");
  else
    require(p.a && p.a_scales && p.b && p.b_scales && p.y, kn,
            "a, a_scales, b, b_scales and y are required");
  require(p.m >= 0 && p.n > 0 && p.k > 0, kn, "m >= 0, n > 0, k > 0");
  require(p.k % 16 == 0, kn, "k " + std::to_string(p.k) + " must be a multiple of 16");
  require(p.a_group > 0 && (p.a_group % 16 == 0 || p.a_group >= p.k), kn,
          "activation groups must be multiples of 16 columns");
  require(p.b_block_rows > 0 && p.b_block_cols > 0 &&
              (p.b_block_cols % 16 == 0 || p.b_block_cols >= p.k),
          kn, "weight scale blocks must span multiples of 16 columns");
  require(aligned(p.a, 16) && (p.groups.on() || aligned(p.b, 16)), kn,
          "a and b must be 16-byte aligned");
  require(p.m <= 65535LL * 8, kn, "m too large for one launch");
  if (p.m == 0) return;
  launch_token_tiled(&fp8_gemm_kernel<1>, &fp8_gemm_kernel<4>, &fp8_gemm_kernel<8>, p, p.m, p.n,
                     kWarps, stream, p.groups.on() ? p.groups.max_active : 1);
  check_launch(kn);
}

}  // namespace qparity::gpu
