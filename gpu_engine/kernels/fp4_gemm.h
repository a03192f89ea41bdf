#pragma once
// The packed-e2m1 scaled GEMM of `nvfp4` and `mxfp4` on Hopper (no FP4 tensor cores on sm_90):
// weights stay packed in device memory, two e2m1 codes a byte (element 2j in the low nibble, bit 3
// the sign, as compressed-tensors packs them), with one scale byte per block (e4m3 per 16 columns
// for NVFP4, E8M0 per 32 for MX): 0.5625 and 0.53 bytes an element where bf16 takes 2.
//
// Arithmetic (the same values as fp8_gemm.h's on e2m1 bytes): e2m1 values are multiples of 1/2
// below 6, so twice a value is an int8 in [-12, 12]; the activations come as those doubled codes
// (quantize_fp8's q_doubled), each weight nibble becomes its doubled code by byte permutes, and
// each 16 products are summed by dp4a in int32 (exact), then chunk = sum / 4 (exact),
// acc = fma(chunk * s_b, s_a, acc) in fp32 (chunk * s_b exact: 12 x 4 significant bits), the
// lanes' partial sums added by shuffles, times alpha when it is not 1, plus the fp32 bias, one
// rounding to bf16. Batch-invariant and deterministic (a token's sums do not depend on the tile).
// Weight-only (x set: NVFP4A16, MXFP4A16): each 16-column chunk sums the bf16 inputs times the
// doubled codes in fp32 (fma, ascending k; the products are exact, the sums round), halves it
// (exact), then acc = fma(chunk, s_b, acc); the same epilogue.
// Constraints (checked): k a multiple of 32 (a lane streams 16 bytes of codes at a time),
// activation scale groups of 16 or 32, 16-byte-aligned a and b, 2-byte-aligned b_scales.
#include <cuda_bf16.h>
#include <cuda_runtime_api.h>

#include <cstdint>

namespace qparity::gpu {

enum class Fp4BlockScale : uint8_t {
  kE4m3Group16,  // NVFP4: an e4m3fn byte per 16 columns
  kE8m0Group32,  // MX: an E8M0 byte (2^(byte - 127); 0 is 2^-127) per 32 columns
};

struct Fp4GemmParams {
  const __nv_bfloat16* x = nullptr;  // W4A16 (NVFP4A16, MXFP4A16): [m, k] bf16 inputs, else null
  const int8_t* a = nullptr;         // W4A4: [m, k] twice the e2m1 activation values
  const float* a_scales = nullptr;   // [m, k / a_group]
  int64_t a_group = 16;
  const uint8_t* b = nullptr;         // [n, k / 2] packed e2m1 codes
  const uint8_t* b_scales = nullptr;  // [n, k / 16] or [n, k / 32] scale bytes
  Fp4BlockScale b_scale = Fp4BlockScale::kE4m3Group16;
  const float* bias = nullptr;  // optional [n]
  float alpha = 1.f;
  __nv_bfloat16* y = nullptr;  // [m, n]
  int64_t m = 0, n = 0, k = 0;
};

void launch_fp4_scaled_gemm(const Fp4GemmParams& p, cudaStream_t stream);

}  // namespace qparity::gpu
