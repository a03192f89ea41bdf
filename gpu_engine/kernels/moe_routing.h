#pragma once
// MoE routing as Hugging Face's Qwen3-MoE computes it: softmax over the router logits (kept in
// fp32, as the reference stores them) in fp32,
// the top_k experts by probability, optionally renormalized to sum 1 (norm_topk_prob):
//   p_e = exp(l_e - max) / sum_e' exp(l_e' - max)     (fp32; the sum in a fixed lane/tree order)
//   ids  = the top_k p_e, highest first; ties go to the lower expert index (CUDA topk's rule,
//          reference_cpu/layers/moe_router.h)
//   w_j  = p_ids[j] (/ sum_j p_ids[j] with norm_topk_prob), fp32 - the caller rounds to the
//          model dtype where HF does (routing_weights.to(hidden_states.dtype)).
// A token with a NaN logit gets id -1 and weight NaN in every slot it cannot fill, so the fault
// is visible downstream instead of routing to an arbitrary expert.
#include <cuda_bf16.h>
#include <cuda_runtime_api.h>

#include <cstdint>

namespace qparity::gpu {

struct MoeRoutingParams {
  const float* logits = nullptr;  // [tokens, experts] (the router GEMM's fp32 output)
  int32_t* ids = nullptr;         // [tokens, top_k]
  float* weights = nullptr;       // [tokens, top_k]
  int64_t tokens = 0, experts = 0, top_k = 0;
  bool norm_topk_prob = true;
};

// experts <= 1024, top_k <= min(experts, 32).
void launch_moe_routing(const MoeRoutingParams& p, cudaStream_t stream);

}  // namespace qparity::gpu
