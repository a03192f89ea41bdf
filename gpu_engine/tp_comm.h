#pragma once
// What one tensor-parallel rank's decoder needs of its communicator (the NCCL implementation is
// tensor_parallel.h's; the engine itself does not depend on NCCL). Every call is enqueued on the
// rank's stream, so it orders with the kernels around it and is captured into CUDA graphs.
#include <cuda_bf16.h>
#include <cuda_runtime_api.h>

#include <cstddef>

namespace qparity::gpu {

class TpComm {
 public:
  virtual ~TpComm() = default;
  virtual int rank() const = 0;
  virtual int size() const = 0;
  // recv (size() * count) = send of rank 0 | rank 1 | ... on every rank. (The decoder sums a
  // row-parallel layer's gathered partials itself, kernels/rank_sum.h, in one fixed order.)
  virtual void all_gather_bf16(const __nv_bfloat16* send, __nv_bfloat16* recv, size_t count,
                               cudaStream_t stream) = 0;
  virtual void all_gather_f32(const float* send, float* recv, size_t count,
                              cudaStream_t stream) = 0;
};

}  // namespace qparity::gpu
