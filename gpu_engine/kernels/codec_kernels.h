#pragma once
// Device-side numeric conversions through the CUDA intrinsics (on sm_90 the fp8 and bf16 ones
// compile to hardware cvt instructions). They are a peer for the core codecs and the first
// kernels every later quantization kernel relies on. Host API: plain vectors in and out; the
// launcher validates sizes and owns the device buffers. C++17: included from .cu files.
#include <cstdint>
#include <vector>

namespace qparity::gpu {

enum class GpuCodec { kBF16, kFP16, kE4M3, kE5M2, kE2M1, kUE8M0TowardZero, kUE8M0Up };

// Value of every code of the format (2^bits of them), decoded on the device, as float.
std::vector<float> gpu_decode_all_codes(GpuCodec codec);
// Encodes each float on the device; `saturate` selects __NV_SATFINITE where the intrinsic has
// the choice (fp8, e8m0). bf16 / fp16 use the round-to-nearest-even intrinsics.
std::vector<uint16_t> gpu_encode(GpuCodec codec, const std::vector<float>& values, bool saturate);

}  // namespace qparity::gpu
