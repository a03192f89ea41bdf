#include "gpu_engine/kernels/e4m3_lattice.cuh"
#include "gpu_engine/kernels/int_group_gemm.h"
#include "gpu_engine/kernels/launch_check.h"
#include "gpu_engine/kernels/scale_load.cuh"
#include "gpu_engine/kernels/token_tiles.cuh"
#include "gpu_engine/kernels/weight_only_gemm.h"

namespace qparity::gpu {

namespace {

constexpr int kWarps = 4;  // output rows per block, one warp each

// One warp per output row n, kTokens tokens per block row of the grid; each lane streams 16 bytes
// of weight codes per step and the same columns of every token's codes.
template <int kBits, bool kFp8, typename S, int kTokens>
__global__ void __launch_bounds__(kWarps * 32) int_group_gemm_kernel(IntGroupGemmParams p) {
  constexpr int kCodes = kBits == 8 ? 16 : 32;
  const int lane = threadIdx.x % 32;
  const int64_t n = static_cast<int64_t>(blockIdx.x) * kWarps + threadIdx.x / 32;
  if (n >= p.n) return;
  const int64_t m0 = static_cast<int64_t>(blockIdx.y) * kTokens;
  if (m0 >= p.m) return;
  const int mt = p.m - m0 < kTokens ? static_cast<int>(p.m - m0) : kTokens;
  const int64_t groups = p.k / p.group;
  const uint8_t* wrow = p.w + n * (p.k * kBits / 8);
  double acc[kTokens];
#pragma unroll
  for (int j = 0; j < kTokens; ++j)
    acc[j] = 0.0;
  for (int64_t kk = static_cast<int64_t>(lane) * kCodes; kk < p.k; kk += 32 * kCodes) {
    const uint4 raw = __ldg(reinterpret_cast<const uint4*>(wrow + kk * kBits / 8));
    const int64_t g = kk / p.group;
    const double s = load_scale<S>(p.scales, n * groups + g);
    int z = p.zeros_i8 ? static_cast<int>(p.zeros_i8[n * groups + g]) : 0;
    if constexpr (kBits == 4) z += 8;  // stored u = q + 8
    const uint32_t words[4] = {raw.x, raw.y, raw.z, raw.w};
    int wq[kCodes];
#pragma unroll
    for (int i = 0; i < kCodes; ++i) {
      if constexpr (kBits == 8)
        wq[i] = static_cast<int8_t>((words[i / 4] >> (8 * (i % 4))) & 0xFF) - z;
      else
        wq[i] = static_cast<int>((words[i / 8] >> (4 * (i % 8))) & 0xF) - z;
    }
#pragma unroll
    for (int j = 0; j < kTokens; ++j) {
      if (j >= mt) break;
      const uint4* ar = reinterpret_cast<const uint4*>(p.a + (m0 + j) * p.k + kk);
      int32_t sum = 0;
#pragma unroll
      for (int v = 0; v < kCodes / 16; ++v) {
        const uint4 av = ar[v];
        const uint32_t aw[4] = {av.x, av.y, av.z, av.w};
#pragma unroll
        for (int i = 0; i < 16; ++i) {
          const uint32_t b = (aw[i / 4] >> (8 * (i % 4))) & 0xFF;
          const int a = kFp8 ? e4m3_lattice(b) : static_cast<int>(static_cast<int8_t>(b));
          sum += a * wq[v * 16 + i];
        }
      }
      acc[j] = fma(static_cast<double>(sum), s, acc[j]);  // the product is exact
    }
  }
#pragma unroll
  for (int j = 0; j < kTokens; ++j) {
    double a = acc[j];
#pragma unroll
    for (int o = 16; o > 0; o >>= 1)
      a += __shfl_xor_sync(0xffffffffu, a, o);
    if (lane == 0 && j < mt) {
      if constexpr (kFp8) a *= 0x1p-9;
      a *= static_cast<double>(p.a_scales[m0 + j]);
      if (p.bias) a += static_cast<double>(p.bias[n]);
      p.y[(m0 + j) * p.n + n] = __double2bfloat16(a);  // one rounding, as the reference's
    }
  }
}

template <int kBits, bool kFp8, typename S>
void launch_for(const IntGroupGemmParams& p, cudaStream_t stream) {
  launch_token_tiled(&int_group_gemm_kernel<kBits, kFp8, S, 1>,
                     &int_group_gemm_kernel<kBits, kFp8, S, 4>,
                     &int_group_gemm_kernel<kBits, kFp8, S, 8>, p, p.m, p.n, kWarps, stream);
}

template <int kBits>
void launch_bits(const IntGroupGemmParams& p, cudaStream_t stream) {
  if (p.a_fp8)
    p.scale_bf16 ? launch_for<kBits, true, __nv_bfloat16>(p, stream)
                 : launch_for<kBits, true, float>(p, stream);
  else
    p.scale_bf16 ? launch_for<kBits, false, __nv_bfloat16>(p, stream)
                 : launch_for<kBits, false, float>(p, stream);
}

}  // namespace

void launch_int_group_gemm(const IntGroupGemmParams& p, cudaStream_t stream) {
  constexpr const char* kn = "int_group_gemm";
  require(p.bits == 4 || p.bits == 8, kn, "bits must be 4 or 8, got " + std::to_string(p.bits));
  require(p.a && p.a_scales && p.w && p.scales && p.y, kn,
          "a, a_scales, w, scales and y are required");
  require(aligned(p.a, 16) && aligned(p.w, 16), kn, "a and w must be 16-byte aligned");
  require(p.m >= 0 && p.n > 0 && p.k > 0 && p.group > 0, kn, "m >= 0, n > 0, k > 0, group > 0");
  require_int_weight_layout(kn, p.bits, p.k, p.group);
  require(p.m <= 65535LL * 8, kn, "m too large for one launch");
  if (p.m == 0) return;
  p.bits == 8 ? launch_bits<8>(p, stream) : launch_bits<4>(p, stream);
  check_launch(kn);
}

}  // namespace qparity::gpu
