#include <mutex>

#include "gpu_engine/kernels/launch_check.h"
#include "gpu_engine/kernels/mma_sync.cuh"
#include "gpu_engine/kernels/weight_only_mma.h"
#include "gpu_engine/kernels/weight_only_mma_codes.cuh"
#include "gpu_engine/kernels/weight_only_mma_tiled.h"

namespace qparity::gpu {

namespace {

constexpr int kMaxSplit = 8;  // warps a block, each every split-th chunk of k

// Chunks a warp has in flight (cp.async stages): fewer for more token tiles, whose inputs take
// more of each stage (the block's shared memory stays under ~200 KB).
template <int kT>
__host__ __device__ constexpr int ring_depth() {
  return kT == 1 ? 8 : kT == 2 ? 6 : kT == 4 ? 4 : 2;
}

// One ring stage: a chunk's codes for the warp's two row tiles, the scales (and zeros) of every
// group the chunk touches (at most one a 16-column step), [tile][group - first][16 rows], then
// the inputs of the block's tokens at the chunk's columns, one row of kXStride bytes a token
// (the padding spreads the 8 rows a fragment load reads over distinct banks).
template <MmaCodes kC, typename S, bool kZeros>
struct RingStage {
  static constexpr int kChunk = kC == MmaCodes::kInt4 ? 64 : 32;  // weight_only_mma_chunk
  static constexpr int kGroups = kChunk / 16;
  static constexpr int kScales = 1024;
  static constexpr int kZerosAt = kScales + 2 * kGroups * 16 * static_cast<int>(sizeof(S));
  static constexpr int kInputsAt = kZerosAt + (kZeros ? 2 * kGroups * 16 : 0);
  static constexpr int kXStride = kChunk * 2 + 32;
  // With the inputs of `tokens` tokens (16-byte multiples throughout).
  __host__ __device__ static constexpr int bytes(int tokens) {
    return kInputsAt + tokens * kXStride;
  }
};

// Tokens whose inputs a block stages: its token tiles, fewer when m is smaller.
template <int kT>
__host__ __device__ constexpr int staged_tokens(int64_t m) {
  return m < 8 * kT ? static_cast<int>(m) : 8 * kT;
}

// Block: `split` warps over the same 32 rows (two row tiles), warp w taking chunks w, w + split,
// ...; grid (rows / 32, ceil(m / (8 kT))). kT token tiles of 8 per block. Each warp streams its
// chunks (codes, scales, zeros and the tokens' inputs) through its own ring of stages with
// cp.async, so that a decode-sized GEMM has the bytes in flight that DRAM needs without holding
// them in registers, and no load waits in a chunk's arithmetic.
template <MmaCodes kC, typename S, bool kZeros, int kT>
__global__ void __launch_bounds__(kMaxSplit * 32) weight_only_mma_kernel(WeightOnlyMmaParams p) {
  // [split][ring_depth] stages; after the loop, [split][kT * 8 tokens][32 rows] fp32 partial sums.
  extern __shared__ __align__(16) uint8_t ring[];
  using Stage = RingStage<kC, S, kZeros>;
  constexpr int kRing = ring_depth<kT>();
  constexpr int kChunk = Stage::kChunk;
  constexpr int kSteps = kChunk / 16;
  constexpr int kUnitsPerRow = kChunk * 2 / 16;  // 16-byte input units a token a chunk
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  const int split = static_cast<int>(blockDim.x / 32);
  const int r = lane / 4, c = lane % 4;
  const int64_t tile0 = static_cast<int64_t>(blockIdx.x) * 2;
  const int64_t m0 = static_cast<int64_t>(blockIdx.y) * 8 * kT;
  const int64_t chunks = (p.k + kChunk - 1) / kChunk;
  const int64_t groups = p.k / p.group;
  const int xtok = staged_tokens<kT>(p.m);
  const int stage_bytes = Stage::bytes(xtok);
  const uint8_t* codes = static_cast<const uint8_t*>(p.w);
  uint8_t* mine = ring + static_cast<size_t>(warp) * kRing * stage_bytes;

  float acc[2][kT][4];
  zero_runs<kT>(acc);

  // The groups chunk q touches: [first, last] (the fault reads group + 1 where it exists).
  const auto first_group = [&](int64_t q) { return q * kChunk / p.group; };
  const auto last_group = [&](int64_t q) {
    const int64_t end = q * kChunk + kChunk < p.k ? q * kChunk + kChunk : p.k;
    return (end - 1) / p.group;
  };
  const int64_t mine_chunks = warp < chunks ? (chunks - warp + split - 1) / split : 0;
  const auto issue = [&](int64_t i) {
    if (i < mine_chunks) {
      const int64_t q = warp + i * split;
      uint8_t* stage = mine + (i % kRing) * stage_bytes;
#pragma unroll
      for (int t = 0; t < 2; ++t)
        cp_async_16(stage + t * 512 + lane * 16,
                    codes + (((tile0 + t) * chunks + q) * 32 + lane) * 16, 16);
      const int64_t g0 = first_group(q);
      const int count = static_cast<int>(last_group(q) - g0 + 1);
      // Scales: count * 16 values a tile, 16 bytes a copy; lane = tile * 16 + unit.
      constexpr int kUnitsPerGroup = static_cast<int>(sizeof(S));
      const int t = lane / 16, unit = lane % 16;
      if (unit < count * kUnitsPerGroup) {
        int64_t g = g0 + unit / kUnitsPerGroup;
        if (p.fault_group_off_by_one && g + 1 < groups) ++g;
        cp_async_16(stage + Stage::kScales +
                        (t * Stage::kGroups * 16 + unit / kUnitsPerGroup * 16) * sizeof(S) +
                        unit % kUnitsPerGroup * 16,
                    static_cast<const uint8_t*>(p.scales) +
                        (((tile0 + t) * groups + g) * 16) * sizeof(S) + unit % kUnitsPerGroup * 16,
                    16);
      }
      if constexpr (kZeros) {
        if (unit < count) {
          int64_t g = g0 + unit;
          if (p.fault_group_off_by_one && g + 1 < groups) ++g;
          cp_async_16(stage + Stage::kZerosAt + (t * Stage::kGroups + unit) * 16,
                      p.zeros + ((tile0 + t) * groups + g) * 16, 16);
        }
      }
      // Inputs: the staged tokens' columns of this chunk (zeros past m and past k).
      for (int u = lane; u < xtok * kUnitsPerRow; u += 32) {
        const int tok = u / kUnitsPerRow, unit_x = u % kUnitsPerRow;
        const int64_t token = m0 + tok, col = q * kChunk + unit_x * 8;
        const bool ok = token < p.m && col < p.k;
        cp_async_16(stage + Stage::kInputsAt + tok * Stage::kXStride + unit_x * 16,
                    p.x + (ok ? token * p.k + col : 0), ok ? 16 : 0);
      }
    }
    cp_async_commit();
  };
  for (int i = 0; i < kRing - 1; ++i)
    issue(i);
  for (int64_t i = 0; i < mine_chunks; ++i) {
    issue(i + kRing - 1);
    cp_async_wait<kRing - 1>();
    __syncwarp();
    const int64_t q = warp + i * split;
    const uint8_t* stage = mine + (i % kRing) * stage_bytes;
    const S* scales = reinterpret_cast<const S*>(stage + Stage::kScales);
    const int8_t* zeros = reinterpret_cast<const int8_t*>(stage + Stage::kZerosAt);
    const uint8_t* inputs = stage + Stage::kInputsAt;
    const uint4 chunk[2] = {reinterpret_cast<const uint4*>(stage)[lane],
                            reinterpret_cast<const uint4*>(stage + 512)[lane]};
    const int64_t g0 = first_group(q);
    GroupTerms gt;
    int64_t gt_group = -1;
    // The run of steps in one group: summed in the tensor core's fp32 C, then times the group's
    // scale into acc.
    float run[2][kT][4];
#pragma unroll
    for (int s = 0; s < kSteps; ++s) {
      const int64_t k0 = q * kChunk + 16 * s;
      if (k0 >= p.k) break;
      const int64_t g = k0 / p.group;
      if (g != gt_group) {
        if (gt_group >= 0) fold_runs<kT>(run, gt.scale, acc);
        group_terms_from<kC, S, kZeros>(scales, zeros, Stage::kGroups, static_cast<int>(g - g0), r,
                                        gt);
        gt_group = g;
        zero_runs<kT>(run);
      }
      uint2 b[kT];
#pragma unroll
      for (int j = 0; j < kT; ++j) {
        const int tok = 8 * j + r;
        b[j] = tok < xtok ? *reinterpret_cast<const uint2*>(inputs + tok * Stage::kXStride +
                                                            (16 * s + 4 * c) * 2)
                          : make_uint2(0u, 0u);
      }
#pragma unroll
      for (int t = 0; t < 2; ++t) {
        uint32_t a[4];
        expand_step<kC>(chunk[t], kC == MmaCodes::kInt4 ? s : 2 * s, gt, t, a);
#pragma unroll
        for (int j = 0; j < kT; ++j)
          mma_bf16_acc(a, b[j], run[t][j]);
      }
    }
    if (gt_group >= 0) fold_runs<kT>(run, gt.scale, acc);
    __syncwarp();
  }
  cp_async_wait<0>();
  __syncthreads();  // every ring is read: the partial sums take its place
  float* partial_sums = reinterpret_cast<float*>(ring);
  float* own = partial_sums + static_cast<size_t>(warp) * kT * 8 * 32;
#pragma unroll
  for (int t = 0; t < 2; ++t)
#pragma unroll
    for (int j = 0; j < kT; ++j)
#pragma unroll
      for (int i = 0; i < 4; ++i) {
        const int row = 16 * t + r + 8 * (i / 2), tok = 8 * j + 2 * c + i % 2;
        own[tok * 32 + row] = acc[t][j][i];
      }
  __syncthreads();
  // The split warps' sums, added in warp order.
  for (int e = static_cast<int>(threadIdx.x); e < kT * 8 * 32; e += static_cast<int>(blockDim.x)) {
    const int row = e % 32, tok = e / 32;
    const int64_t n = tile0 * 16 + row, token = m0 + tok;
    if (n >= p.n || token >= p.m) continue;
    float sum = partial_sums[e];
    for (int w = 1; w < split; ++w)
      sum += partial_sums[static_cast<size_t>(w) * kT * 8 * 32 + e];
    if (p.bias) sum += p.bias[n];
    p.y[token * p.n + n] = __float2bfloat16_rn(sum);
  }
}

template <MmaCodes kC, typename S, bool kZeros, int kT>
void launch_tiles(const WeightOnlyMmaParams& p, int split, cudaStream_t stream) {
  auto* kernel = &weight_only_mma_kernel<kC, S, kZeros, kT>;
  const auto shared_for = [](int warps, int tokens) {
    const size_t rings = static_cast<size_t>(warps) * ring_depth<kT>() *
                         static_cast<size_t>(RingStage<kC, S, kZeros>::bytes(tokens));
    const size_t sums = static_cast<size_t>(warps) * kT * 8 * 32 * sizeof(float);
    return rings > sums ? rings : sums;
  };
  static std::once_flag attribute_set;
  std::call_once(attribute_set, [&] {
    cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                         static_cast<int>(shared_for(kMaxSplit, 8 * kT)));
  });
  const dim3 grid(static_cast<unsigned>(weight_only_mma_rows(p.n) / 32),
                  static_cast<unsigned>((p.m + 8 * kT - 1) / (8 * kT)));
  kernel<<<grid, dim3(static_cast<unsigned>(split * 32)), shared_for(split, staged_tokens<kT>(p.m)),
           stream>>>(p);
}

template <MmaCodes kC, typename S, bool kZeros>
void launch_for(const WeightOnlyMmaParams& p, int split, cudaStream_t stream) {
  // The token tile sets only how often the weights are read; a token's sums are the same in all.
  if (p.m <= 8)
    launch_tiles<kC, S, kZeros, 1>(p, split, stream);
  else if (p.m <= 16)
    launch_tiles<kC, S, kZeros, 2>(p, split, stream);
  else if (p.m <= 32)
    launch_tiles<kC, S, kZeros, 4>(p, split, stream);
  else
    launch_tiles<kC, S, kZeros, 8>(p, split, stream);
}

template <MmaCodes kC>
void launch_codes(const WeightOnlyMmaParams& p, int split, cudaStream_t stream) {
  const bool z = p.zeros != nullptr;
  if (p.scale_bf16)
    z ? launch_for<kC, __nv_bfloat16, true>(p, split, stream)
      : launch_for<kC, __nv_bfloat16, false>(p, split, stream);
  else
    z ? launch_for<kC, float, true>(p, split, stream)
      : launch_for<kC, float, false>(p, split, stream);
}

}  // namespace

void launch_weight_only_mma(const WeightOnlyMmaParams& p, cudaStream_t stream) {
  constexpr const char* kn = "weight_only_mma";
  require(p.x && p.w && p.scales && p.y, kn, "x, w, scales and y are required");
  require(aligned(p.x, 16) && aligned(p.w, 16), kn, "x and w must be 16-byte aligned");
  require(p.m >= 0 && p.n > 0 && p.k > 0 && p.group > 0, kn, "m >= 0, n > 0, k > 0, group > 0");
  require(p.k % 16 == 0, kn, "k " + std::to_string(p.k) + " must be a multiple of 16");
  require(p.group % 16 == 0 && p.k % p.group == 0, kn,
          "group " + std::to_string(p.group) + " must be a multiple of 16 and divide k " +
              std::to_string(p.k));
  require(!(p.zeros && p.codes == MmaCodes::kE4m3), kn, "e4m3 codes take no zero points");
  require(weight_only_mma_rows(p.n) / 32 <= 0x7FFFFFFF && (p.m + 63) / 64 <= 65535, kn,
          "m or n too large for one launch");
  if (p.m == 0) return;
  const bool tiled = p.tiling == MmaTiling::kTiled ||
                     (p.tiling == MmaTiling::kAuto && p.m >= kWeightOnlyMmaTiledFrom);
  if (tiled) {
    launch_weight_only_mma_tiled(p, stream);
    check_launch(kn);
    return;
  }
  // Warps splitting k: from k alone, so that a token's sums never depend on m.
  const int64_t chunks =
      (p.k + weight_only_mma_chunk(p.codes) - 1) / weight_only_mma_chunk(p.codes);
  const int split = chunks >= 16 ? kMaxSplit : chunks >= 8 ? 4 : chunks >= 4 ? 2 : 1;
  switch (p.codes) {
    case MmaCodes::kInt4:
      launch_codes<MmaCodes::kInt4>(p, split, stream);
      break;
    case MmaCodes::kInt8:
      launch_codes<MmaCodes::kInt8>(p, split, stream);
      break;
    case MmaCodes::kE4m3:
      launch_codes<MmaCodes::kE4m3>(p, split, stream);
      break;
  }
  check_launch(kn);
}

}  // namespace qparity::gpu
