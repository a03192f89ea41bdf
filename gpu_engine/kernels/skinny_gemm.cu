#include <algorithm>

#include "gpu_engine/cuda_check.h"
#include "gpu_engine/kernels/launch_check.h"
#include "gpu_engine/kernels/pdl.h"
#include "gpu_engine/kernels/skinny_gemm.h"
#include "gpu_engine/kernels/skinny_gemm_parts.cuh"
#include "gpu_engine/kernels/skinny_gemm_single_pass.h"

namespace qparity::gpu {

namespace {

using skinny::kMaxSmem;
using skinny::kThreads;
using skinny::kUnroll;
using skinny::kWarps;
using skinny::load_stream;
using skinny::stage_x;
using skinny::unpack8;
using skinny::write_pair;

// Block layout: the kWarps warps take kWarps / ksplit row pairs at a time, each pair split along
// K over ksplit warps (lane l of slice s reads chunks (s * 32 + l) + 32 * ksplit * j); the
// slices' sums meet in shared memory, added in slice order. A pair is rows (2g, 2g + 1), or
// (g, g + N/2) with the SiLU-and-mul epilogue.
template <int M>
__global__ void __launch_bounds__(kThreads) skinny_gemm_kernel(SkinnyGemmParams p, int ksplit) {
  extern __shared__ uint4 smem[];
  __nv_bfloat16* xs = reinterpret_cast<__nv_bfloat16*>(smem);
  __shared__ float slice_sum[kWarps][M][2];
  probe_entry(p.probe);
  const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32;
  const int64_t k = p.k, n = p.n;
  // Grouped: this block's group, known only once the grouping kernel before it is done.
  const bool grouped = p.group_first != nullptr;
  const __nv_bfloat16* wbase = p.w;
  const __nv_bfloat16* xbase = p.x;
  int64_t row0 = 0;
  int rows = M;
  if (grouped) {
    pdl_launch_dependents();
    pdl_wait();
    probe_release(p.probe);
    if (blockIdx.y >= static_cast<unsigned>(p.group_active[0])) return;
    const int32_t e = p.group_active[1 + blockIdx.y];
    row0 = p.group_first[e];
    // At most M by construction (a token's experts are distinct); the clamp keeps shared memory
    // safe when they are not (router ids refused by the engine all land on expert 0).
    rows = min(p.group_first[e + 1] - p.group_first[e], M);
    wbase += e * p.w_group_stride;
    xbase += row0 * k;
  }
  const bool writer = blockIdx.x == 0;
  const int64_t half = n / 2;
  const int64_t pairs = skinny::row_pairs(p);
  const int per_block = kWarps / ksplit;
  const int64_t groups = (pairs + per_block - 1) / per_block;
  const int slice = warp % ksplit;
  const int64_t chunks = k / 8;
  const int64_t step = 32 * static_cast<int64_t>(ksplit);
  const auto rows_of = [&](int64_t g, const uint4*& w0, const uint4*& w1) {
    const int64_t r0 = p.silu_mul ? g : 2 * g;
    const int64_t r1 = p.silu_mul ? g + half : (2 * g + 1 < n ? 2 * g + 1 : n - 1);
    w0 = reinterpret_cast<const uint4*>(wbase + r0 * k);
    w1 = reinterpret_cast<const uint4*>(wbase + r1 * k);
  };
  const auto load = [&](const uint4* w0, const uint4* w1, int64_t c0, uint4(&a)[kUnroll],
                        uint4(&b)[kUnroll]) {
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      const int64_t c = c0 + step * u;
      if (c < chunks) {
        a[u] = load_stream(w0 + c);
        b[u] = load_stream(w1 + c);
      }
    }
  };
  // The first weight loads go out before the wait for the previous kernel: weights are never
  // written during a forward, and this overlaps their DRAM latency with that kernel's tail.
  uint4 a[kUnroll], b[kUnroll];
  const int64_t g_first = static_cast<int64_t>(blockIdx.x) * per_block + warp / ksplit;
  if (g_first < pairs) {  // (grouped: already waited, the group is known)
    const uint4 *w0, *w1;
    rows_of(g_first, w0, w1);
    load(w0, w1, slice * 32 + lane, a, b);
  }
  skinny::NormWeightChunks nw;  // the prologue's norm weight, for its second pass
  skinny::preload_norm_weight(p, nw);
  pdl_launch_dependents();
  pdl_wait();
  if (!grouped) probe_release(p.probe);

  stage_x<M>(p, xbase, rows, xs, writer, nw);

  unsigned long long best = 0;  // fused argmax: lane m's best key for token m
  bool preloaded = true;        // a and b hold the first group's first step
  for (int64_t gb = blockIdx.x; gb < groups; gb += gridDim.x) {
    const int64_t g = gb * per_block + warp / ksplit;
    float acc[M][2];
#pragma unroll
    for (int m = 0; m < M; ++m)
      acc[m][0] = acc[m][1] = 0.f;
    if (g < pairs) {
      const uint4 *w0, *w1;
      rows_of(g, w0, w1);
      for (int64_t c0 = slice * 32 + lane; c0 < chunks; c0 += step * kUnroll) {
        if (!preloaded) load(w0, w1, c0, a, b);
        preloaded = false;
#pragma unroll
        for (int u = 0; u < kUnroll; ++u) {
          const int64_t c = c0 + step * u;
          if (c < chunks) {
            float fa[8], fb[8];
            unpack8(a[u], fa);
            unpack8(b[u], fb);
#pragma unroll
            for (int m = 0; m < M; ++m) {
              float fx[8];
              unpack8(reinterpret_cast<const uint4*>(xs + m * k)[c], fx);
#pragma unroll
              for (int j = 0; j < 8; ++j) {
                acc[m][0] = fmaf(fa[j], fx[j], acc[m][0]);
                acc[m][1] = fmaf(fb[j], fx[j], acc[m][1]);
              }
            }
          }
        }
      }
    }
    preloaded = false;
#pragma unroll
    for (int m = 0; m < M; ++m)
#pragma unroll
      for (int r = 0; r < 2; ++r)
        for (int o = 16; o > 0; o >>= 1)
          acc[m][r] += __shfl_xor_sync(0xffffffffu, acc[m][r], o);
    if (ksplit > 1) {
      if (lane == 0)
#pragma unroll
        for (int m = 0; m < M; ++m)
          slice_sum[warp][m][0] = acc[m][0], slice_sum[warp][m][1] = acc[m][1];
      __syncthreads();
      if (slice == 0)
#pragma unroll
        for (int m = 0; m < M; ++m)
#pragma unroll
          for (int r = 0; r < 2; ++r) {
            float s = slice_sum[warp][m][r];
            for (int q = 1; q < ksplit; ++q)
              s += slice_sum[warp + q][m][r];
            acc[m][r] = s;
          }
      __syncthreads();  // slice_sum is reused by the next group
    }
    if (slice != 0 || g >= pairs || lane >= rows) continue;
      // Lane m writes token m's outputs.
#pragma unroll
    for (int m = 0; m < M; ++m)
      if (m == lane) write_pair(p, g, row0, m, acc[m][0], acc[m][1], best);
  }
  if (p.argmax_keys) skinny::block_argmax<M>(p, best, slice == 0 && lane < rows, lane, row0, rows);
  probe_exit(p.probe);
}

template <int M>
void launch_m(const SkinnyGemmParams& p, cudaStream_t stream) {
  const size_t smem = static_cast<size_t>(M * p.k) * 2;
  int device = 0, sms = 0, per_sm = 0;
  QPARITY_CUDA_CHECK(cudaGetDevice(&device));
  QPARITY_CUDA_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device));
  const int64_t pairs = skinny::row_pairs(p), chunks = p.k / 8;
  const int ksplit = skinny::choose_ksplit(pairs, chunks, sms);
  if (M == 1 && p.single_pass && launch_skinny_gemm_single_pass(p, ksplit, stream)) return;
  // The opt-in beyond 48 KiB of shared memory (static + dynamic), a per-device attribute.
  QPARITY_CUDA_CHECK(cudaFuncSetAttribute(skinny_gemm_kernel<M>,
                                          cudaFuncAttributeMaxDynamicSharedMemorySize,
                                          static_cast<int>(kMaxSmem)));
  QPARITY_CUDA_CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, skinny_gemm_kernel<M>,
                                                                   kThreads, smem));
  per_sm = std::max(per_sm, 1);
  const int64_t groups = (pairs + kWarps / ksplit - 1) / (kWarps / ksplit);
  // Grouped: the resident blocks shared among the groups that may have rows (grid y).
  const int64_t ny = p.group_first ? p.max_active : 1;
  const int64_t blocks =
      std::min<int64_t>(groups, std::max<int64_t>(1, static_cast<int64_t>(sms) * per_sm / ny));
  launch_pdl("skinny_gemm", skinny_gemm_kernel<M>,
             dim3(static_cast<unsigned>(blocks), static_cast<unsigned>(ny)), dim3(kThreads), smem,
             stream, p, ksplit);
}

}  // namespace

bool skinny_gemm_fits(int64_t m, int64_t k) {
  return m >= 1 && m <= kSkinnyMaxM && k > 0 && static_cast<size_t>(m * k) * 2 <= kMaxSmem;
}

void launch_skinny_gemm(const SkinnyGemmParams& p, cudaStream_t stream) {
  constexpr const char* kName = "skinny_gemm";
  require(p.x && p.w && p.y, kName, "x, w and y are required");
  require(p.m >= 0 && p.n > 0 && p.k > 0, kName,
          "M >= 0, N > 0, K > 0 (got " + std::to_string(p.m) + ", " + std::to_string(p.n) + ", " +
              std::to_string(p.k) + ")");
  require(p.k % 8 == 0, kName, "K must be a multiple of 8 (got " + std::to_string(p.k) + ")");
  require(p.m == 0 || skinny_gemm_fits(p.m, p.k), kName,
          "M=" + std::to_string(p.m) + ", K=" + std::to_string(p.k) + ": needs M <= " +
              std::to_string(kSkinnyMaxM) + " and M*K*2 <= " + std::to_string(kMaxSmem) +
              " bytes of shared memory (use the cuBLASLt GEMM)");
  require(aligned(p.x, 16) && aligned(p.w, 16), kName, "x and w must be 16-byte aligned");
  require(aligned(p.norm_weight, 16) && aligned(p.add, 16) && aligned(p.residual_out, 16) &&
              aligned(p.normed_out, 16),
          kName, "norm_weight, add, residual_out and normed_out must be 16-byte aligned");
  require(!p.silu_mul || (p.n % 2 == 0 && !p.y_f32), kName,
          "SiLU-and-mul needs an even N (gate and up halves) and a bf16 output");
  require(!p.gate_up_out || p.silu_mul, kName, "gate_up_out without silu_mul");
  require(!p.add || (p.norm_weight && p.residual_out), kName,
          "the residual add needs norm_weight and residual_out");
  require(!p.residual_out || p.add, kName, "residual_out without add");
  require(!p.residual_out || (p.residual_out != p.x && p.residual_out != p.add), kName,
          "residual_out may not alias x or add: other blocks still read them");
  require((!p.residual_out && !p.normed_out) || p.norm_weight, kName,
          "residual_out / normed_out without norm_weight");
  require(p.eps >= 0, kName, "eps must be >= 0");
  require(!p.group_first == !p.group_active, kName, "group_first and group_active go together");
  require(!p.argmax_keys || (p.y_f32 && !p.group_first && p.n < (int64_t{1} << 32) - 1), kName,
          "argmax_keys needs an fp32 output, no groups and N < 2^32 - 1");
  require(!p.group_first || (!p.norm_weight && p.max_active >= 1 && p.max_active <= 65535 &&
                             p.w_group_stride >= p.n * p.k && p.w_group_stride % 8 == 0),
          kName,
          "grouped: no prologue, max_active in [1, 65535], w_group_stride >= N*K and a multiple "
          "of 8");
  if (p.m == 0) return;
  static_assert(kSkinnyMaxM == 4, "one instantiation per M up to kSkinnyMaxM");
  switch (p.m) {
    case 1:
      launch_m<1>(p, stream);
      break;
    case 2:
      launch_m<2>(p, stream);
      break;
    case 3:
      launch_m<3>(p, stream);
      break;
    default:  // the require above bounds m by kSkinnyMaxM = 4
      launch_m<4>(p, stream);
      break;
  }
  check_launch(kName);
}

}  // namespace qparity::gpu
