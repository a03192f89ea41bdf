#pragma once
// The launch shape the per-output-row GEMM kernels share (weight-only, int8, fp8): one warp per
// output row, `warps` rows a block, and the tokens in one tile of 1, one of up to 4, or tiles of 8
// over the grid's y (grouped experts, expert_groups.h: one expert per z). The tile only sets how
// often a weight row is re-read: a token's sums are the same in every tile size (batch
// invariance). `m` bounds the rows of one launch, or of one expert when grouped.
#include <cuda_runtime_api.h>

#include <cstdint>

namespace qparity::gpu {

template <typename Params>
void launch_token_tiled(void (*one)(Params), void (*four)(Params), void (*eight)(Params),
                        const Params& p, int64_t m, int64_t n, int warps, cudaStream_t stream,
                        int64_t experts = 1) {
  const dim3 block(static_cast<unsigned>(warps * 32));
  const unsigned z = static_cast<unsigned>(experts);
  const unsigned rows = static_cast<unsigned>((n + warps - 1) / warps);
  if (m == 1)
    one<<<dim3(rows, 1, z), block, 0, stream>>>(p);
  else if (m <= 4)
    four<<<dim3(rows, 1, z), block, 0, stream>>>(p);
  else
    eight<<<dim3(rows, static_cast<unsigned>((m + 7) / 8), z), block, 0, stream>>>(p);
}

}  // namespace qparity::gpu
