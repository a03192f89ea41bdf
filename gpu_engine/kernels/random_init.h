#pragma once
// Deterministic pseudo-random bf16 fill for benches and synthetic models: element i gets
// mean + std * z, z ~ approximately N(0, 1) (sum of four uniforms from a 64-bit hash of
// (seed, i), rescaled), so a model of any size fills in one pass with no host data.
#include <cuda_bf16.h>
#include <cuda_runtime_api.h>

#include <cstdint>

namespace qparity::gpu {

void launch_fill_random_bf16(__nv_bfloat16* out, int64_t n, float mean, float std, uint64_t seed,
                             cudaStream_t stream);

}  // namespace qparity::gpu
