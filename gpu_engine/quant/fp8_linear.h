#pragma once
// `fp8-tensor`, `fp8-channel` and `fp8-block` on the GPU (schemes/fp8/fp8_common.h,
// fp8_tensor.h, fp8_channel.h, fp8_block.h): e4m3fn weights with their processed scale grid
// (per tensor, per output row, or 128 x 128 blocks, ragged at the edges; fused partitions already
// unified by the reference method as the dialect does it), activations quantized on the fly by
// the dialect's rule (static per tensor, dynamic per tensor, per token, or per 1 x 128 group),
// and the fp8 scaled GEMM (kernels/fp8_gemm.h).
//
// Dialects: vllm and sglang (fp32 rules, reproduced bit for bit); any other is refused by name,
// as is UE8M0 scale rounding.
#include <memory>

#include "gpu_engine/quant/fp8_gemm_runtime.h"
#include "gpu_engine/quant/gpu_linear_method.h"
#include "schemes/method/linear_method.h"

namespace qparity::gpu {

class Fp8LinearMethod final : public Fp8RuntimeMethod {
 public:
  // expert: -1 a dense layer, e >= 0 expert e of a stack (upload_util.h). tensor_cores: a dense
  // layer on cuBLASLt's fp8 tensor cores where its scales allow (GpuMethodOptions); experts run
  // grouped on the CUDA-core GEMM (grouped_experts.h), whose bits their own apply keeps.
  explicit Fp8LinearMethod(const reference::LinearMethod& host, int64_t expert = -1,
                           bool tensor_cores = false);
  // Benches only (random_model.h): an `fp8-block` layer as vLLM runs it (128 x 128 weight
  // blocks, activations in dynamic 1 x 128 groups by vLLM's rule), its e4m3fn codes those of
  // random N(0, 1) rows quantized per 128 columns, every block scale `block_scale`; made on the
  // device: real sizes without a checkpoint.
  static std::unique_ptr<Fp8LinearMethod> random_block(std::string prefix, int64_t out_features,
                                                       int64_t in_features, float block_scale,
                                                       uint64_t seed, bool tensor_cores = false);

 private:
  Fp8LinearMethod(std::string prefix, SchemeId scheme, int64_t n, int64_t k)
      : Fp8RuntimeMethod(std::move(prefix), std::move(scheme), n, k) {}
};

}  // namespace qparity::gpu
