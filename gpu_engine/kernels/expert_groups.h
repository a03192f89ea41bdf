#pragma once
// All active experts of a MoE layer in one launch of a per-output-row GEMM (weight-only int, fp8):
// the MoE decode path of quantized experts, with no host round trip, so a decode step stays inside
// one CUDA graph. The rows were grouped by expert on the device (moe_dispatch.h's
// launch_moe_group_by_expert): expert e's rows are [first[e], first[e + 1]) of x and of y, and
// active lists the experts that have rows (count first). The grid's z runs over up to max_active
// experts; a block past the count, or past its expert's rows, exits. Each expert's weight comes
// from a device table the GEMM's parameters name. A row's sums are those of the ungrouped launch
// on that expert's rows alone (the kernels are batch-invariant), bit for bit.
#include <cstdint>

namespace qparity::gpu {

struct ExpertGroups {
  const int32_t* first = nullptr;   // [experts + 1]
  const int32_t* active = nullptr;  // [1 + max_active]
  int64_t max_active = 0;           // <= 65535 (the grid's z)
  bool on() const { return first != nullptr; }
};

#ifdef __CUDACC__
// This block's expert and its rows: false when the block has no work. Ungrouped: expert 0, rows
// [0, m).
__device__ __forceinline__ bool block_expert_rows(const ExpertGroups& g, int64_t m, int32_t* expert,
                                                  int64_t* row0, int64_t* rows) {
  if (!g.first) {
    *expert = 0, *row0 = 0, *rows = m;
    return true;
  }
  if (blockIdx.z >= static_cast<unsigned>(g.active[0])) return false;
  const int32_t e = g.active[1 + blockIdx.z];
  *expert = e;
  *row0 = g.first[e];
  *rows = g.first[e + 1] - g.first[e];
  return true;
}
#endif

}  // namespace qparity::gpu
