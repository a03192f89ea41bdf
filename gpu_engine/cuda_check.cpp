#include "gpu_engine/cuda_check.h"

#include "core/error.h"

namespace qparity::gpu {

void throw_cuda_error(cudaError_t err, const char* call, const char* file, int line) {
  throw Error(std::string(file) + ":" + std::to_string(line),
              std::string(call) + " failed: " + cudaGetErrorName(err) + " (" +
                  cudaGetErrorString(err) + ")");
}

}  // namespace qparity::gpu
