#pragma once
// `mxfp8` and `mxfp4` on the GPU (schemes/fp8/mxfp8.h, mxfp4.h, mx_scale.h): Hopper has
// no MX tensor-core instructions (Blackwell's block-scaled MMA takes the E8M0 scales inside the
// product), so this is an emulation: activations quantized on the fly per token and 32-group by
// the dialect's E8M0 rule (bit for bit: kernels/fp8_gemm.h, mx_bump). mxfp8: e4m3fn weight codes
// with their E8M0 block scales as fp32 powers of two ([N, K/32]) in the fp8 scaled GEMM of the
// fp8 schemes: each 16 products summed exactly in fp32, then times the two block scales, fp32
// accumulation, one bf16 rounding. A native kernel would accumulate each 32-block inside the
// tensor core (its own order and width) and apply the scales there; the products and scales are
// the same values.
// mxfp4's weights stay packed in device memory, two e2m1 codes a byte with an E8M0 byte per
// 32-block, and run in the packed fp4 GEMM (kernels/fp4_gemm.h: the same products, summed 16 at a
// time exactly, by dp4a on doubled codes); its activation codes are kept as e4m3fn bytes of the
// same values (what the dumps hold) and as doubled int8 codes (what the GEMM reads).
// Dialects: vllm and sglang (the kBump exponent, half-even elements). The weight-only MXFP4A16
// takes bf16 inputs into the packed GEMM (any dialect: no activation rule, no global scale);
// MXFP8A16 is refused by name.
#include "gpu_engine/quant/fp8_gemm_runtime.h"
#include "gpu_engine/quant/gpu_linear_method.h"
#include "schemes/method/linear_method.h"

namespace qparity::gpu {

class MxLinearMethod final : public Fp8RuntimeMethod {
 public:
  // expert: -1 a dense layer, e >= 0 expert e of a stack (upload_util.h).
  explicit MxLinearMethod(const reference::LinearMethod& host, int64_t expert = -1);
};

}  // namespace qparity::gpu
