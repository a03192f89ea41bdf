#include "gpu_engine/kernels/gemm.h"
#include "gpu_engine/kernels/int8_gemm.h"
#include "gpu_engine/kernels/launch_check.h"
#include "gpu_engine/kernels/token_tiles.cuh"

namespace qparity::gpu {

namespace {

constexpr int kQuantThreads = 256;

__global__ void quantize_int8_kernel(QuantizeInt8Params p) {
  const int64_t row = blockIdx.x;
  const __nv_bfloat16* x = p.x + row * p.k;
  float amax = 0.f;
  for (int64_t i = threadIdx.x; i < p.k; i += kQuantThreads)
    amax = fmaxf(amax, fabsf(__bfloat162float(x[i])));
  __shared__ float partial[kQuantThreads / 32];
  for (int o = 16; o > 0; o >>= 1)
    amax = fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, o));
  if (threadIdx.x % 32 == 0) partial[threadIdx.x / 32] = amax;
  __syncthreads();
  amax = 0.f;
  for (int w = 0; w < kQuantThreads / 32; ++w)
    amax = fmaxf(amax, partial[w]);  // max is exact in any order
  int8_t* q = p.q + row * p.k;
  if (p.dialect == Int8ActDialect::kSglang) amax = fmaxf(amax, 1e-10f);
  if (amax == 0.f) {  // vllm: s = 0, q = 0
    if (threadIdx.x == 0) p.scales[row] = 0.f;
    for (int64_t i = threadIdx.x; i < p.k; i += kQuantThreads)
      q[i] = 0;
    return;
  }
  const float mul = __fdiv_rn(127.f, amax);
  if (threadIdx.x == 0)
    p.scales[row] =
        p.dialect == Int8ActDialect::kNpu ? __fdiv_rn(1.f, mul) : __fdiv_rn(amax, 127.f);
  for (int64_t i = threadIdx.x; i < p.k; i += kQuantThreads) {
    const float v = __fmul_rn(__bfloat162float(x[i]), mul);
    float r = p.dialect == Int8ActDialect::kSglang ? roundf(v) : rintf(v);
    r = fminf(fmaxf(r, -128.f), 127.f);
    q[i] = static_cast<int8_t>(r);
  }
}

__global__ void quantize_int8_static_kernel(QuantizeInt8StaticParams p) {
  const int64_t row = blockIdx.x;
  const __nv_bfloat16* x = p.x + row * p.k;
  int8_t* q = p.q + row * p.k;
  if (threadIdx.x == 0) p.scales[row] = p.scale;
  for (int64_t i = threadIdx.x; i < p.k; i += kQuantThreads) {
    const float xv = __bfloat162float(x[i]);
    const float v = p.divide ? __fdiv_rn(xv, p.scale) : __fmul_rn(xv, p.factor);
    // rintf(v) + offset is exact (an integer below 2^24 plus an int8) or saturates either way.
    const float r = fminf(
        fmaxf(p.offset_after_round ? rintf(v) + p.offset : rintf(__fadd_rn(v, p.offset)), -128.f),
        127.f);
    q[i] = static_cast<int8_t>(r);
  }
}

constexpr int kWarps = 4;

// One warp per output column n (a weight row), kTokens tokens per grid row; each lane takes 16
// codes a step (dp4a x 4), the int32 sums of the lanes added exactly.
template <int kTokens>
__global__ void __launch_bounds__(kWarps * 32) int8_gemm_kernel(Int8GemmParams p) {
  const int lane = threadIdx.x % 32;
  const int64_t n = static_cast<int64_t>(blockIdx.x) * kWarps + threadIdx.x / 32;
  if (n >= p.n) return;
  const int64_t m0 = static_cast<int64_t>(blockIdx.y) * kTokens;
  const int mt = p.m - m0 < kTokens ? static_cast<int>(p.m - m0) : kTokens;
  int acc[kTokens];
#pragma unroll
  for (int j = 0; j < kTokens; ++j)
    acc[j] = 0;
  const int8_t* brow = p.b + n * p.k;
  for (int64_t k0 = static_cast<int64_t>(lane) * 16; k0 < p.k; k0 += 32 * 16) {
    const int4 w = *reinterpret_cast<const int4*>(brow + k0);
#pragma unroll
    for (int j = 0; j < kTokens; ++j) {
      if (j >= mt) break;
      const int4 a = *reinterpret_cast<const int4*>(p.a + (m0 + j) * p.k + k0);
      acc[j] = __dp4a(a.x, w.x, acc[j]);
      acc[j] = __dp4a(a.y, w.y, acc[j]);
      acc[j] = __dp4a(a.z, w.z, acc[j]);
      acc[j] = __dp4a(a.w, w.w, acc[j]);
    }
  }
#pragma unroll
  for (int j = 0; j < kTokens; ++j) {
    int a = acc[j];
#pragma unroll
    for (int o = 16; o > 0; o >>= 1)
      a += __shfl_xor_sync(0xffffffffu, a, o);
    if (lane == 0 && j < mt) {
      if (p.acc_bias) a += p.acc_bias[n];
      float v = __fmul_rn(p.b_scales[n], static_cast<float>(a));
      if (p.a_scales) v = __fmul_rn(p.a_scales[m0 + j], v);
      if (p.bias) v = __fadd_rn(v, p.bias[n]);
      p.y[(m0 + j) * p.n + n] = __float2bfloat16_rn(v);
    }
  }
}

// The epilogue alone, on cuBLASLt's exact int32 product: the same arithmetic as the dp4a
// kernel's.
__global__ void int8_epilogue_kernel(Int8GemmParams p, const int32_t* acc) {
  const int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= p.m * p.n) return;
  const int64_t m = i / p.n, n = i % p.n;
  int a = acc[i];
  if (p.acc_bias) a += p.acc_bias[n];
  float v = __fmul_rn(p.b_scales[n], static_cast<float>(a));
  if (p.a_scales) v = __fmul_rn(p.a_scales[m], v);
  if (p.bias) v = __fadd_rn(v, p.bias[n]);
  p.y[i] = __float2bfloat16_rn(v);
}

// One cuBLASLt handle (and its workspace) for every int8 layer of the process, made on first
// use: a prefill-sized batch never runs inside a CUDA graph capture.
BlasLtGemm& int8_blas() {
  static BlasLtGemm gemm;
  return gemm;
}

}  // namespace

size_t int8_gemm_scratch_bytes(int64_t m, int64_t n) {
  return m > kInt8BlasMinTokens ? static_cast<size_t>(m * n) * sizeof(int32_t) : 0;
}

void int8_scaled_gemm(const Int8GemmParams& p, int32_t* acc_scratch, cudaStream_t stream) {
  if (p.m > kInt8BlasMinTokens && acc_scratch &&
      int8_blas().nt_i8(p.a, p.b, acc_scratch, p.m, p.n, p.k, stream)) {
    constexpr int kThreads = 256;
    const int64_t total = p.m * p.n;
    int8_epilogue_kernel<<<static_cast<unsigned>((total + kThreads - 1) / kThreads), kThreads, 0,
                           stream>>>(p, acc_scratch);
    check_launch("int8_epilogue");
    return;
  }
  launch_int8_scaled_gemm(p, stream);
}

void launch_quantize_int8_per_token(const QuantizeInt8Params& p, cudaStream_t stream) {
  constexpr const char* kn = "quantize_int8_per_token";
  require(p.x && p.q && p.scales, kn, "x, q and scales are required");
  require(p.m >= 0 && p.k > 0, kn, "m >= 0, k > 0");
  if (p.m == 0) return;
  quantize_int8_kernel<<<static_cast<unsigned>(p.m), kQuantThreads, 0, stream>>>(p);
  check_launch(kn);
}

void launch_quantize_int8_static(const QuantizeInt8StaticParams& p, cudaStream_t stream) {
  constexpr const char* kn = "quantize_int8_static";
  require(p.x && p.q && p.scales, kn, "x, q and scales are required");
  require(p.m >= 0 && p.k > 0, kn, "m >= 0, k > 0");
  require(p.scale > 0 && (p.divide || p.factor > 0), kn, "scale (and factor) must be > 0");
  if (p.m == 0) return;
  quantize_int8_static_kernel<<<static_cast<unsigned>(p.m), kQuantThreads, 0, stream>>>(p);
  check_launch(kn);
}

void launch_int8_scaled_gemm(const Int8GemmParams& p, cudaStream_t stream) {
  constexpr const char* kn = "int8_scaled_gemm";
  require(p.a && p.b && p.b_scales && p.y, kn, "a, b, b_scales and y are required");
  require(p.m >= 0 && p.n > 0 && p.k > 0, kn, "m >= 0, n > 0, k > 0");
  require(p.k % 16 == 0, kn, "k " + std::to_string(p.k) + " must be a multiple of 16");
  require(aligned(p.a, 16) && aligned(p.b, 16), kn, "a and b must be 16-byte aligned");
  require(p.m <= 65535LL * 8, kn, "m too large for one launch");
  if (p.m == 0) return;
  launch_token_tiled(&int8_gemm_kernel<1>, &int8_gemm_kernel<4>, &int8_gemm_kernel<8>, p, p.m, p.n,
                     kWarps, stream);
  check_launch(kn);
}

}  // namespace qparity::gpu
