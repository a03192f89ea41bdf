#pragma once
// `fp8-tensor`, `fp8-channel` and `fp8-block` on the GPU (reference_cpu/quant/fp8_common.h,
// fp8_tensor.h, fp8_channel.h, fp8_block.h): e4m3fn weights with their processed scale grid
// (per tensor, per output row, or 128 x 128 blocks, ragged at the edges; fused partitions already
// unified by the reference method as the dialect does it), activations quantized on the fly by
// the dialect's rule (static per tensor, dynamic per tensor, per token, or per 1 x 128 group),
// and the fp8 scaled GEMM (kernels/fp8_gemm.h).
//
// Dialects: vllm and sglang (fp32 rules, reproduced bit for bit); any other is refused by name,
// as is UE8M0 scale rounding.
#include "gpu_engine/quant/fp8_gemm_runtime.h"
#include "gpu_engine/quant/gpu_linear_method.h"
#include "reference_cpu/quant/linear_method.h"

namespace qparity::gpu {

class Fp8LinearMethod final : public Fp8RuntimeMethod {
 public:
  // expert: -1 a dense layer, e >= 0 expert e of a stack (upload_util.h).
  explicit Fp8LinearMethod(const reference::LinearMethod& host, int64_t expert = -1);
};

}  // namespace qparity::gpu
