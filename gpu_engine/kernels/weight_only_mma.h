#pragma once
// Weight-only GEMM on the tensor cores: y[m, n] = bf16( sum_k x[m, k] * w[n, k] + bias[n] ) with
//   w[n, k] = (q[n, k] - zero[n, g]) * scale[n, g],   g = k / group   (int4 / int8 codes), or
//   w[n, k] = e4m3(q[n, k]) * scale[n, g]                                (fp8 e4m3fn codes),
// for the dense weight-only layers of weight_only_gemm.h (compressed-tensors pack-quantized INT4 /
// INT8, msModelSlim W8A16 with integral offsets, FP8 weight-only per tensor / channel / block,
// MXFP8A16). The codes are repacked once at load (quant/weight_only_mma_layout.h) into tiles whose
// mma fragments a lane reads with one 16-byte load, and each code is expanded in registers.
//
// Precision: the scale is NOT applied before the product. Each code becomes the exact bf16 value
// (q - zero) (an integer of magnitude <= 255) or e4m3(q) (every e4m3 value is a bf16 value), so
// every product with a bf16 input is exact in fp32. The tensor core (mma.sync m16n8k16, bf16 in,
// fp32 accumulate) sums the products of each run of 16-column steps that lies in one group and
// one tile chunk (64 columns int4, 32 int8 / fp8); each run's sum is multiplied by its fp32 scale
// and added to an fp32 accumulator (fmaf), chunk by chunk in ascending order; the `split` warps
// of a block, each holding every split-th chunk, are then added in warp order in fp32, the bias
// joins in fp32, and the result is rounded once to bf16. Which columns a sum holds depends on n
// and k only (split is chosen from them), never on m or on the other tokens: results are
// batch-invariant bit for bit and deterministic run to run, like weight_only_gemm.h's.
// From kWeightOnlyMmaTiledFrom tokens on (prefill), the tiled kernel (weight_only_mma_tiled.h)
// runs instead: the same products, step sums and scale multiplications, added over all of k in
// one accumulator. Batch-invariant among m >= that bound and among m below it; a token's row can
// differ in the last bit between the two (both are deterministic).
//
// Layout (quant/weight_only_mma_layout.h writes it; `tiles` = ceil(n / 32) * 2 row tiles of 16):
//   codes  [tiles][chunks = ceil(k / chunk)][32 lanes][16 bytes]; lane l = 4 r + c of a tile
//          holds, for each 16-column step s of the chunk, the codes of rows r and r + 8 at the
//          columns 4c .. 4c + 3 of the step (the mma's k positions 2c, 2c+1, 2c+8, 2c+9 hold
//          memory columns 4c .. 4c+3, the same permutation on x, so a lane's four inputs are one
//          8-byte load). int4: one 32-bit word a step, nibble j and j + 4 the bf16 pair j of the
//          A fragment, stored u = q + 8. int8 / e4m3: two words a step, byte i of the pair.
//          Rows past n and columns past k are padding (code 0) and never reach y.
//   scales [tiles][k / group][16] fp32 or bf16 (exact values only; padding rows 0).
//   zeros  [tiles][k / group][16] int8, optional; int4 zeros must lie in [-8, 7] (so 136 + zero
//          is a bf16 integer), int8 ones in [-128, 127].
// Constraints (checked by the launcher): k a multiple of 16, group a multiple of 16 dividing k,
// x rows 16-byte aligned, codes 16-byte aligned.
#include <cuda_bf16.h>
#include <cuda_runtime_api.h>

#include <cstdint>

namespace qparity::gpu {

enum class MmaCodes { kInt4, kInt8, kE4m3 };

// Which tiling runs: by m (kAuto), or one of them at every m (tests and benches).
enum class MmaTiling { kAuto, kSplitK, kTiled };
constexpr int64_t kWeightOnlyMmaTiledFrom = 128;

struct WeightOnlyMmaParams {
  const __nv_bfloat16* x = nullptr;  // [m, k] row-major
  const void* w = nullptr;           // packed codes, layout above
  const void* scales = nullptr;      // packed, fp32 or bf16
  bool scale_bf16 = false;
  const int8_t* zeros = nullptr;  // packed, optional (not with e4m3)
  const float* bias = nullptr;    // optional, [n]
  __nv_bfloat16* y = nullptr;     // [m, n] row-major
  int64_t m = 0, n = 0, k = 0, group = 0;
  MmaCodes codes = MmaCodes::kInt4;
  MmaTiling tiling = MmaTiling::kAuto;
  // Test-only fault injection: the scale and zero of group g + 1 for group g (the last group reads
  // itself), as weight_only_gemm.h's. Never set outside tests.
  bool fault_group_off_by_one = false;
};

// Columns a tile chunk holds: 64 int4 codes or 32 int8 / e4m3 codes (16 bytes a lane).
__host__ __device__ constexpr int64_t weight_only_mma_chunk(MmaCodes c) {
  return c == MmaCodes::kInt4 ? 64 : 32;
}
// Rows the packed arrays hold: n rounded up to the 32 rows a warp computes.
__host__ __device__ constexpr int64_t weight_only_mma_rows(int64_t n) {
  return (n + 31) / 32 * 32;
}
// The packed arrays' sizes in elements (codes in bytes).
__host__ __device__ constexpr int64_t weight_only_mma_code_bytes(MmaCodes c, int64_t n, int64_t k) {
  const int64_t chunk = weight_only_mma_chunk(c);
  return weight_only_mma_rows(n) / 16 * ((k + chunk - 1) / chunk) * 512;
}
__host__ __device__ constexpr int64_t weight_only_mma_scale_count(int64_t n, int64_t k,
                                                                  int64_t group) {
  return weight_only_mma_rows(n) * (k / group);
}

void launch_weight_only_mma(const WeightOnlyMmaParams& p, cudaStream_t stream);

}  // namespace qparity::gpu
