#pragma once
// The prefill-sized tiling of the tensor-core weight-only GEMM (weight_only_mma.h chooses it): a
// block of 8 warps computes 128 rows x 128 tokens, the tokens' inputs staged in shared memory
// (cp.async, three stages of 64 columns, XOR-swizzled rows), each warp 32 rows x 64 tokens with
// its A fragments read straight from the packed tiles. Each element's sum runs over all of k in
// ascending 16-column steps in one fp32 accumulator: the same products, step sums and scale
// multiplications as the split-k tiling, added in another order. Launcher checks are the
// caller's (launch_weight_only_mma).
#include <cuda_runtime_api.h>

#include "gpu_engine/kernels/weight_only_mma.h"

namespace qparity::gpu {

void launch_weight_only_mma_tiled(const WeightOnlyMmaParams& p, cudaStream_t stream);

}  // namespace qparity::gpu
