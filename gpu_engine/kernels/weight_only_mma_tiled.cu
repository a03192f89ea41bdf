#include <mutex>

#include "gpu_engine/kernels/mma_sync.cuh"
#include "gpu_engine/kernels/weight_only_mma_codes.cuh"
#include "gpu_engine/kernels/weight_only_mma_tiled.h"

namespace qparity::gpu {

namespace {

constexpr int kRows = 128, kTokens = 128, kTileK = 64, kStages = 4;
constexpr int kThreads = 256;  // warps 4 (rows, 32 each) x 2 (tokens, 64 each)

// One pipeline stage of a 64-column step of k: the tokens' inputs [kTokens][64] bf16 (16-byte
// unit u of token row tok at u ^ (tok % 8)), the codes of the block's 8 row tiles
// [tile][chunk][32 lanes][16 bytes], the scales and zeros of the groups the step touches
// [tile][group - first][16 rows].
template <MmaCodes kC, typename S, bool kZeros>
struct TiledStage {
  static constexpr int kChunks = kTileK / (kC == MmaCodes::kInt4 ? 64 : 32);
  static constexpr int kGroups = kTileK / 16;
  static constexpr int kCodes = kTokens * kTileK * 2;
  static constexpr int kScales = kCodes + 8 * kChunks * 512;
  static constexpr int kZerosAt = kScales + 8 * kGroups * 16 * static_cast<int>(sizeof(S));
  static constexpr int kBytes = kZerosAt + (kZeros ? 8 * kGroups * 16 : 0);
};

template <MmaCodes kC, typename S, bool kZeros>
__global__ void __launch_bounds__(kThreads, 1) weight_only_mma_tiled_kernel(WeightOnlyMmaParams p) {
  extern __shared__ __align__(128) uint8_t staged[];  // [kStages] TiledStage
  using Stage = TiledStage<kC, S, kZeros>;
  constexpr int kChunk = kC == MmaCodes::kInt4 ? 64 : 32;  // weight_only_mma_chunk
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  const int r = lane / 4, c = lane % 4, wr = warp % 4, wc = warp / 4;
  const int tid = static_cast<int>(threadIdx.x);
  const int64_t tiles = weight_only_mma_rows(p.n) / 16;
  const int64_t block_tile = static_cast<int64_t>(blockIdx.x) * (kRows / 16);
  const int64_t tile0 = block_tile + 2 * wr;
  const bool rows_ok = tile0 < tiles;  // the last block may run past the padded rows
  const int64_t m0 = static_cast<int64_t>(blockIdx.y) * kTokens;
  const int64_t ktiles = (p.k + kTileK - 1) / kTileK;
  const int64_t chunks = (p.k + kChunk - 1) / kChunk;
  const int64_t groups = p.k / p.group;
  const uint8_t* codes = static_cast<const uint8_t*>(p.w);
  const uint8_t* scale_bytes = static_cast<const uint8_t*>(p.scales);

  const auto first_group = [&](int64_t kt) { return kt * kTileK / p.group; };
  const auto load_stage = [&](int64_t kt) {
    uint8_t* stage = staged + (kt % kStages) * Stage::kBytes;
    for (int i = tid; i < kTokens * 8; i += kThreads) {
      const int tok = i / 8, unit = i % 8;
      const int64_t token = m0 + tok, col = kt * kTileK + unit * 8;
      const bool ok = token < p.m && col < p.k;
      cp_async_16(stage + tok * 128 + ((unit ^ (tok % 8)) * 16), p.x + (ok ? token * p.k + col : 0),
                  ok ? 16 : 0);
    }
    for (int i = tid; i < 8 * Stage::kChunks * 32; i += kThreads) {
      const int t = i / (Stage::kChunks * 32), h = i / 32 % Stage::kChunks, l = i % 32;
      const int64_t q = kt * Stage::kChunks + h;
      const bool ok = block_tile + t < tiles && q < chunks;
      cp_async_16(stage + Stage::kCodes + ((t * Stage::kChunks + h) * 32 + l) * 16,
                  codes + (ok ? (((block_tile + t) * chunks + q) * 32 + l) * 16 : 0), ok ? 16 : 0);
    }
    const int64_t g0 = first_group(kt);
    const int64_t end = kt * kTileK + kTileK < p.k ? kt * kTileK + kTileK : p.k;
    const int count = static_cast<int>((end - 1) / p.group - g0 + 1);
    constexpr int kUnitsPerGroup = static_cast<int>(sizeof(S));  // 16 values, 16 bytes a unit
    if (tid < 8 * 16) {
      const int t = tid / 16, unit = tid % 16;
      if (unit < count * kUnitsPerGroup && block_tile + t < tiles) {
        int64_t g = g0 + unit / kUnitsPerGroup;
        if (p.fault_group_off_by_one && g + 1 < groups) ++g;
        cp_async_16(stage + Stage::kScales +
                        (t * Stage::kGroups * 16 + unit / kUnitsPerGroup * 16) * sizeof(S) +
                        unit % kUnitsPerGroup * 16,
                    scale_bytes + ((block_tile + t) * groups + g) * 16 * sizeof(S) +
                        unit % kUnitsPerGroup * 16,
                    16);
      }
    }
    if constexpr (kZeros) {
      if (tid < 8 * Stage::kGroups) {
        const int t = tid / Stage::kGroups, unit = tid % Stage::kGroups;
        if (unit < count && block_tile + t < tiles) {
          int64_t g = g0 + unit;
          if (p.fault_group_off_by_one && g + 1 < groups) ++g;
          cp_async_16(stage + Stage::kZerosAt + (t * Stage::kGroups + unit) * 16,
                      p.zeros + ((block_tile + t) * groups + g) * 16, 16);
        }
      }
    }
  };

  float acc[2][8][4];
  zero_runs<8>(acc);

#pragma unroll
  for (int s = 0; s < kStages - 1; ++s) {
    if (s < ktiles) load_stage(s);
    cp_async_commit();
  }
  for (int64_t kt = 0; kt < ktiles; ++kt) {
    cp_async_wait<kStages - 2>();
    __syncthreads();
    if (kt + kStages - 1 < ktiles) load_stage(kt + kStages - 1);
    cp_async_commit();
    if (!rows_ok) continue;
    const uint8_t* stage = staged + (kt % kStages) * Stage::kBytes;
    const S* scales =
        reinterpret_cast<const S*>(stage + Stage::kScales) + 2 * wr * Stage::kGroups * 16;
    const int8_t* zeros =
        reinterpret_cast<const int8_t*>(stage + Stage::kZerosAt) + 2 * wr * Stage::kGroups * 16;
    const uint4* warp_codes =
        reinterpret_cast<const uint4*>(stage + Stage::kCodes) + 2 * wr * Stage::kChunks * 32;
    const int64_t g0 = first_group(kt);
    GroupTerms gt;
    int64_t gt_group = -1;
    // The run of steps in one group (within this k-tile): summed in the tensor core's fp32 C,
    // then times the group's scale into acc.
    float run[2][8][4];
#pragma unroll
    for (int s = 0; s < kTileK / 16; ++s) {
      const int64_t k0 = kt * kTileK + 16 * s;
      if (k0 >= p.k) break;
      const int64_t g = k0 / p.group;
      if (g != gt_group) {
        if (gt_group >= 0) fold_runs<8>(run, gt.scale, acc);
        group_terms_from<kC, S, kZeros>(scales, zeros, Stage::kGroups, static_cast<int>(g - g0), r,
                                        gt);
        gt_group = g;
        zero_runs<8>(run);
      }
      uint32_t a[2][4];
#pragma unroll
      for (int t = 0; t < 2; ++t) {
        const int h = kC == MmaCodes::kInt4 ? 0 : s / 2;
        const uint4 chunk = warp_codes[(t * Stage::kChunks + h) * 32 + lane];
        expand_step<kC>(chunk, kC == MmaCodes::kInt4 ? s : 2 * (s % 2), gt, t, a[t]);
      }
      const int unit = 2 * s + c / 2;
#pragma unroll
      for (int j = 0; j < 8; ++j) {
        const int tok = wc * 64 + 8 * j + r;
        const uint2 b =
            *reinterpret_cast<const uint2*>(stage + tok * 128 + ((unit ^ r) * 16) + (c % 2) * 8);
#pragma unroll
        for (int t = 0; t < 2; ++t)
          mma_bf16_acc(a[t], b, run[t][j]);
      }
    }
    if (gt_group >= 0) fold_runs<8>(run, gt.scale, acc);
  }
  cp_async_wait<0>();
  if (!rows_ok) return;
#pragma unroll
  for (int t = 0; t < 2; ++t)
#pragma unroll
    for (int j = 0; j < 8; ++j)
#pragma unroll
      for (int i = 0; i < 4; ++i) {
        const int64_t n = (tile0 + t) * 16 + r + 8 * (i / 2);
        const int64_t token = m0 + wc * 64 + 8 * j + 2 * c + i % 2;
        if (n >= p.n || token >= p.m) continue;
        float v = acc[t][j][i];
        if (p.bias) v += p.bias[n];
        p.y[token * p.n + n] = __float2bfloat16_rn(v);
      }
}

template <MmaCodes kC, typename S, bool kZeros>
void launch_for(const WeightOnlyMmaParams& p, cudaStream_t stream) {
  auto* kernel = &weight_only_mma_tiled_kernel<kC, S, kZeros>;
  constexpr int kShared = kStages * TiledStage<kC, S, kZeros>::kBytes;
  static std::once_flag attribute_set;
  std::call_once(attribute_set, [&] {
    cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, kShared);
  });
  const dim3 grid(static_cast<unsigned>((weight_only_mma_rows(p.n) + kRows - 1) / kRows),
                  static_cast<unsigned>((p.m + kTokens - 1) / kTokens));
  kernel<<<grid, dim3(kThreads), kShared, stream>>>(p);
}

template <MmaCodes kC>
void launch_codes(const WeightOnlyMmaParams& p, cudaStream_t stream) {
  const bool z = p.zeros != nullptr;
  if (p.scale_bf16)
    z ? launch_for<kC, __nv_bfloat16, true>(p, stream)
      : launch_for<kC, __nv_bfloat16, false>(p, stream);
  else
    z ? launch_for<kC, float, true>(p, stream) : launch_for<kC, float, false>(p, stream);
}

}  // namespace

void launch_weight_only_mma_tiled(const WeightOnlyMmaParams& p, cudaStream_t stream) {
  switch (p.codes) {
    case MmaCodes::kInt4:
      launch_codes<MmaCodes::kInt4>(p, stream);
      break;
    case MmaCodes::kInt8:
      launch_codes<MmaCodes::kInt8>(p, stream);
      break;
    case MmaCodes::kE4m3:
      launch_codes<MmaCodes::kE4m3>(p, stream);
      break;
  }
}

}  // namespace qparity::gpu
