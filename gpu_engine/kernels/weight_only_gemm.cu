#include "gpu_engine/kernels/e4m3_lattice.cuh"
#include "gpu_engine/kernels/launch_check.h"
#include "gpu_engine/kernels/scale_load.cuh"
#include "gpu_engine/kernels/token_tiles.cuh"
#include "gpu_engine/kernels/weight_only_gemm.h"

namespace qparity::gpu {

namespace {

constexpr int kWarps = 4;  // output rows per block, one warp each

// One warp per output row n, kTokens tokens per block row of the grid. Each lane streams 16
// bytes of codes per step (kCodes codes, all in one group), strided by the warp. kFp8: the bytes
// are e4m3fn codes (kBits 8).
template <int kBits, bool kFp8, typename S, int kTokens>
__global__ void __launch_bounds__(kWarps * 32) weight_only_gemm_kernel(WeightOnlyGemmParams p) {
  constexpr int kCodes = kBits == 8 ? 16 : 32;
  const int lane = threadIdx.x % 32;
  const int64_t n = static_cast<int64_t>(blockIdx.x) * kWarps + threadIdx.x / 32;
  if (n >= p.n) return;
  int32_t expert;
  int64_t row0, rows;
  if (!block_expert_rows(p.groups, p.m, &expert, &row0, &rows)) return;
  const int64_t m0 = static_cast<int64_t>(blockIdx.y) * kTokens;
  if (m0 >= rows) return;
  const int mt = rows - m0 < kTokens ? static_cast<int>(rows - m0) : kTokens;
  WeightOnlyExpert ex{p.w, p.scales, p.zeros_f32, p.zeros_i8, p.bias};
  if (p.groups.first) {
    ex = p.experts[expert];
    if (!p.has_zeros_f32) ex.zeros_f32 = nullptr;
    if (!p.has_zeros_i8) ex.zeros_i8 = nullptr;
  }
  const __nv_bfloat16* xbase = p.x + row0 * p.k;
  __nv_bfloat16* ybase = p.y + row0 * p.n;
  const int64_t groups = p.k / p.group;
  const int64_t row_bytes = p.k * kBits / 8;
  const uint8_t* wrow = static_cast<const uint8_t*>(ex.w) + n * row_bytes;
  float acc[kTokens];
#pragma unroll
  for (int j = 0; j < kTokens; ++j)
    acc[j] = 0.f;
  // kUnroll loads of 16 bytes in flight per lane before any is used (a decode-sized GEMV is
  // bound by how many bytes are in flight); each lane still sums its chunks in ascending k.
  constexpr int kUnroll = 4;
  for (int64_t k0 = static_cast<int64_t>(lane) * kCodes; k0 < p.k; k0 += 32 * kCodes * kUnroll) {
    uint4 raw[kUnroll];
    float s[kUnroll], z[kUnroll];
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      const int64_t kk = k0 + static_cast<int64_t>(u) * 32 * kCodes;
      if (kk >= p.k) break;
      raw[u] = __ldg(reinterpret_cast<const uint4*>(wrow + kk * kBits / 8));
      int64_t g = kk / p.group;
      if (p.fault_group_off_by_one && g + 1 < groups) ++g;
      s[u] = load_scale<S>(ex.scales, n * groups + g);
      z[u] = 0.f;
      if (ex.zeros_f32) z[u] = ex.zeros_f32[n * groups + g];
      if (ex.zeros_i8) z[u] = static_cast<float>(ex.zeros_i8[n * groups + g]);
      if constexpr (kBits == 4) z[u] += 8.f;  // stored u = q + 8
    }
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      const int64_t kk = k0 + static_cast<int64_t>(u) * 32 * kCodes;
      if (kk >= p.k) break;
      const uint32_t words[4] = {raw[u].x, raw[u].y, raw[u].z, raw[u].w};
      float w[kCodes];
#pragma unroll
      for (int i = 0; i < kCodes; ++i) {
        if constexpr (kFp8) {
          w[i] = e4m3_value((words[i / 4] >> (8 * (i % 4))) & 0xFF) * s[u];
        } else {
          int code;
          if constexpr (kBits == 8)
            code = static_cast<int8_t>((words[i / 4] >> (8 * (i % 4))) & 0xFF);
          else
            code = static_cast<int>((words[i / 8] >> (4 * (i % 8))) & 0xF);
          w[i] = (static_cast<float>(code) - z[u]) * s[u];
        }
      }
#pragma unroll
      for (int j = 0; j < kTokens; ++j) {
        if (j >= mt) break;
        const uint4* xr = reinterpret_cast<const uint4*>(xbase + (m0 + j) * p.k + kk);
#pragma unroll
        for (int v = 0; v < kCodes / 8; ++v) {
          const uint4 xv = xr[v];
          const __nv_bfloat162* h = reinterpret_cast<const __nv_bfloat162*>(&xv);
#pragma unroll
          for (int e = 0; e < 4; ++e) {
            const float2 f = __bfloat1622float2(h[e]);
            acc[j] = fmaf(f.x, w[v * 8 + 2 * e], acc[j]);
            acc[j] = fmaf(f.y, w[v * 8 + 2 * e + 1], acc[j]);
          }
        }
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
      if (ex.bias) a += ex.bias[n];
      ybase[(m0 + j) * p.n + n] = __float2bfloat16_rn(a);
    }
  }
}

template <int kBits, bool kFp8, typename S>
void launch_for(const WeightOnlyGemmParams& p, cudaStream_t stream) {
  launch_token_tiled(&weight_only_gemm_kernel<kBits, kFp8, S, 1>,
                     &weight_only_gemm_kernel<kBits, kFp8, S, 4>,
                     &weight_only_gemm_kernel<kBits, kFp8, S, 8>, p, p.m, p.n, kWarps, stream,
                     p.groups.on() ? p.groups.max_active : 1);
}

}  // namespace

void require_int_weight_layout(const char* kernel, int bits, int64_t k, int64_t group) {
  const int64_t c = weight_only_codes_per_load(bits);
  require(k % c == 0, kernel,
          "k " + std::to_string(k) + " must be a multiple of " + std::to_string(c) + " for int" +
              std::to_string(bits) + " weights");
  require(group % c == 0 && k % group == 0, kernel,
          "group " + std::to_string(group) + " must be a multiple of " + std::to_string(c) +
              " and divide k " + std::to_string(k));
}

void launch_weight_only_gemm(const WeightOnlyGemmParams& p, cudaStream_t stream) {
  constexpr const char* kn = "weight_only_gemm";
  require(p.bits == 4 || p.bits == 8, kn, "bits must be 4 or 8, got " + std::to_string(p.bits));
  if (p.groups.on()) {
    require(
        p.experts && p.groups.active && p.groups.max_active >= 1 && p.groups.max_active <= 65535,
        kn, "grouped: experts, active and max_active in [1, 65535] are required");
    require(!(p.has_zeros_f32 && p.has_zeros_i8), kn, "grouped: one zero kind");
    require(p.x && p.y && aligned(p.x, 16), kn, "x and y are required, x 16-byte aligned");
  } else {
    require(p.x && p.w && p.scales && p.y, kn, "x, w, scales and y are required");
    require(aligned(p.x, 16) && aligned(p.w, 16), kn, "x and w must be 16-byte aligned");
  }
  require(!(p.zeros_f32 && p.zeros_i8), kn, "zeros_f32 and zeros_i8 are exclusive");
  require(!p.fp8_codes || (p.bits == 8 && !p.zeros_f32 && !p.zeros_i8 && !p.has_zeros_f32 &&
                           !p.has_zeros_i8 && !p.fault_group_off_by_one),
          kn, "e4m3 codes are 8 bits wide and take no zero points");
  require(p.m >= 0 && p.n > 0 && p.k > 0 && p.group > 0, kn, "m >= 0, n > 0, k > 0, group > 0");
  require_int_weight_layout(kn, p.bits, p.k, p.group);
  require(p.m <= 65535LL * 8, kn, "m too large for one launch");
  if (p.m == 0) return;
  if (p.fp8_codes)
    p.scale_bf16 ? launch_for<8, true, __nv_bfloat16>(p, stream)
                 : launch_for<8, true, float>(p, stream);
  else if (p.bits == 8)
    p.scale_bf16 ? launch_for<8, false, __nv_bfloat16>(p, stream)
                 : launch_for<8, false, float>(p, stream);
  else
    p.scale_bf16 ? launch_for<4, false, __nv_bfloat16>(p, stream)
                 : launch_for<4, false, float>(p, stream);
  check_launch(kn);
}

}  // namespace qparity::gpu
