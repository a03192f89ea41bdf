#pragma once
// CUDA runtime errors become qparity::Error naming the call and the source line.
#include <cuda_runtime_api.h>

#include <string>

namespace qparity::gpu {

[[noreturn]] void throw_cuda_error(cudaError_t err, const char* call, const char* file, int line);

}  // namespace qparity::gpu

#define QPARITY_CUDA_CHECK(call)                                                 \
  do {                                                                           \
    const cudaError_t qparity_err_ = (call);                                     \
    if (qparity_err_ != cudaSuccess)                                             \
      ::qparity::gpu::throw_cuda_error(qparity_err_, #call, __FILE__, __LINE__); \
  } while (0)
