#pragma once
// `nvfp4` (W4A4, compressed-tensors nvfp4-pack-quantized; schemes/fp4/nvfp4.h) on the
// GPU. Hopper emulation of a Blackwell format: sm_90 has no FP4 tensor-core MMA, so the e2m1
// weights stay packed in device memory, two codes a byte, with their e4m3 block-scale bytes s_w
// ([N, K/16]); activations are quantized on the fly per token and 16-group by the dialect's rule,
// bit for bit (kernels/fp8_gemm.h, nvfp4_global), and the packed fp4 GEMM (kernels/fp4_gemm.h)
// sums each 16 products exactly (e2m1 x e2m1 products are multiples of 1/4 below 36), multiplies
// by s_w and s_x (exact: two 4-bit significands), accumulates in fp32 and multiplies the sum by
// alpha = fl32(fl32(1/gs_in) * fl32(1/gs_w)), the `layer.alpha` of vLLM's current
// CompressedTensorsW4A4Fp4 (earlier versions computed 1 / fl32(gs_in * gs_w): at most an ulp
// apart); the reference applies the exact fp64 s_x/gs_in * s_w/gs_w per group. A native kernel
// (CUTLASS's block-scaled MMA) takes the same codes and scales inside the tensor core and
// accumulates in its own order. Dialects: vllm and sglang (the reciprocal arithmetic of vLLM's
// quantizer, global scales unified by max over fused partitions, MoE gate/up by shard 0's weight
// scale and the min input scale) and compressed-tensors (its divisions; one partition or equal
// global scales). A fused layer whose partitions keep different global scales (ideal,
// compressed-tensors on q/k/v) is refused by name. The weight-only preset NVFP4A16 takes bf16
// inputs into the same packed GEMM (fp32 sums of exact products per 16 columns, times s_w, then
// alpha = fl32(1/gs_w)) in any dialect whose fused partitions share one weight global scale (the
// same refusal otherwise); vLLM runs it through Marlin's fp4 dequantization instead (bf16 weights,
// its own order), which this does not imitate.
#include "gpu_engine/quant/fp8_gemm_runtime.h"
#include "gpu_engine/quant/gpu_linear_method.h"
#include "schemes/method/linear_method.h"

namespace qparity::gpu {

class Nvfp4LinearMethod final : public Fp8RuntimeMethod {
 public:
  // expert: -1 a dense layer, e >= 0 expert e of a stack (upload_util.h).
  explicit Nvfp4LinearMethod(const reference::LinearMethod& host, int64_t expert = -1);
};

}  // namespace qparity::gpu
