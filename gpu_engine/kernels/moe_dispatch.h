#pragma once
// Moving tokens to and from experts. The (token, slot) pairs are grouped by expert, in token order
// within an expert: on the device (launch_moe_group_by_expert, no host round trip: decode steps
// stay inside a CUDA graph) or on the host from the ids; then:
//   launch_gather_rows:   xe[i] = x[rows[i]]                         (bf16 rows, bit copies)
//   (GEMMs and SiLU-and-mul on xe)
//   launch_scatter_rows:  slots[dest[i]] = ye[i]                     (into [tokens * top_k, H])
// and once per layer:
//   launch_moe_combine:   out[t] = bf16(sum_j w[t, j] * slots[t * top_k + j]), the sum over a
//                         token's slots in ascending expert id (the reference's order: it loops
//                         over experts), fp32, one rounding.
#include <cuda_bf16.h>
#include <cuda_runtime_api.h>

#include <cstdint>

namespace qparity::gpu {

struct GatherRowsParams {
  const __nv_bfloat16* src = nullptr;
  const int32_t* rows = nullptr;  // [count] source row per destination row
  __nv_bfloat16* dst = nullptr;   // [count, width]
  int64_t count = 0, width = 0, src_rows = 0;
};

struct ScatterRowsParams {
  const __nv_bfloat16* src = nullptr;  // [count, width]
  const int32_t* dest = nullptr;       // [count] destination row per source row
  __nv_bfloat16* dst = nullptr;
  int64_t count = 0, width = 0, dst_rows = 0;
};

struct MoeCombineParams {
  const __nv_bfloat16* slots = nullptr;  // [tokens * top_k, hidden]
  const int32_t* ids = nullptr;          // [tokens, top_k]
  const float* weights = nullptr;        // [tokens, top_k]
  __nv_bfloat16* out = nullptr;          // [tokens, hidden]
  int64_t tokens = 0, top_k = 0, hidden = 0;
};

struct MoeGroupParams {
  const int32_t* ids = nullptr;  // [pairs] expert per (token, slot), row-major [tokens, top_k]
  int32_t* first = nullptr;      // [experts + 1] first sorted pair of each expert; first[e] = pairs
  int32_t* rows = nullptr;       // [pairs] source token of each sorted pair
  int32_t* dest = nullptr;       // [pairs] (token, slot) index of each sorted pair
  // [1 + min(experts, pairs)]: active[0] = how many experts have pairs, then their ids ascending
  int32_t* active = nullptr;
  // Incremented per id outside [0, experts) (the router's -1 for NaN logits). Such a pair is
  // placed with expert 0 so every index stays in range; the engine refuses the forward's result.
  int32_t* bad = nullptr;
  int64_t pairs = 0, experts = 0, top_k = 0;
};

// One block; stable (a thread per expert scans the pairs in order): deterministic.
void launch_moe_group_by_expert(const MoeGroupParams& p, cudaStream_t stream);
void launch_gather_rows(const GatherRowsParams& p, cudaStream_t stream);
void launch_scatter_rows(const ScatterRowsParams& p, cudaStream_t stream);
// top_k <= 32.
void launch_moe_combine(const MoeCombineParams& p, cudaStream_t stream);

}  // namespace qparity::gpu
