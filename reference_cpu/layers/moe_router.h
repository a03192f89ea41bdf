#pragma once
// The Qwen3-MoE router (HF Qwen3MoeSparseMoeBlock.forward), in fp64 (HF runs this softmax in
// float32, dtype=torch.float; the fp64 peer run has to patch that too):
//
//   routing_weights = softmax(router_logits, dim=-1)
//   routing_weights, selected_experts = torch.topk(routing_weights, top_k, dim=-1)
//   if norm_topk_prob: routing_weights /= routing_weights.sum(dim=-1, keepdim=True)
//
// Per token row of E logits:
//   m    = max_e logit_e
//   x_e  = std::exp(logit_e - m)
//   Z    = sum_{e ascending} x_e
//   p_e  = x_e / Z                (a divide; torch's CPU kernel multiplies by 1/Z, <= 1 ulp apart)
//   ids  = the top_k experts by p, ordered by p descending; equal p are ordered by expert index
//          ascending, and at the top_k boundary the lower indices are the ones kept
//   w_i  = p_{ids[i]}; with norm_topk_prob: S = sum_{i = 0..top_k-1} w_i (in ids order), w_i /= S
//
// Ties. Ranking is on the probabilities, as HF's topk is (distinct logits can round to equal
// probabilities). torch.topk itself does not fix the order of equal values on CPU: aten's
// TopKImpl.h (topk_impl_loop) uses std::partial_sort (k * 64 <= E) or std::nth_element + std::sort
// with a comparator on the value only, none of them stable, so which of two equal experts comes
// first (and which one survives at the boundary) is left to the standard library. On CUDA
// (TensorTopK.cu gatherTopK) values strictly above the k-th are gathered first and values equal to
// it fill the rest in ascending index order ("the first seen set"). The reference therefore fixes
// the one deterministic rule that matches the CUDA selection: lower expert index first. Row order
// and reduction order are fixed; results are bit-identical whatever the thread count.
#include <cstdint>
#include <vector>

#include "schemes/math/matmul.h"

namespace qparity::reference {

struct Routing {
  std::vector<std::vector<int64_t>> ids;     // [T][top_k] expert ids, highest weight first
  std::vector<std::vector<double>> weights;  // [T][top_k] the matching routing weights
};

// softmax over each row of router_logits [T, E] in the order the header states (the
// probabilities the top-k is taken over). Throws qparity::Error ("moe router") for E == 0 or a
// non-finite logit (named by row and expert).
Matrix router_softmax(const Matrix& router_logits);

// router_logits [T, E] -> top_k experts per token. Throws qparity::Error ("moe router") for
// top_k outside [1, E], E == 0 or a non-finite logit.
Routing route_topk(const Matrix& router_logits, int64_t top_k, bool norm_topk_prob);

// gpt-oss's router (HF GptOssTopKRouter.forward): the top_k logits per row, then a softmax over
// those k values only:
//   ids = the top_k experts by logit, descending; equal logits by expert index ascending
//   m = logit_{ids[0]},  x_i = std::exp(logit_{ids[i]} - m),  Z = sum_{i in ids order} x_i,
//   w_i = x_i / Z
// (equal in exact arithmetic to softmax, top-k and renormalising; the roundings differ).
// Throws qparity::Error ("moe router") for top_k outside [1, E], E == 0 or a non-finite logit.
Routing route_topk_softmax(const Matrix& router_logits, int64_t top_k);

}  // namespace qparity::reference
