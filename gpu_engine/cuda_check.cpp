#include "gpu_engine/cuda_check.h"
#include "gpu_engine/device_buffer.h"

#include "core/error.h"

namespace qparity::gpu {

void throw_cuda_error(cudaError_t err, const char* call, const char* file, int line) {
  throw Error(std::string(file) + ":" + std::to_string(line),
              std::string(call) + " failed: " + cudaGetErrorName(err) + " (" +
                  cudaGetErrorString(err) + ")");
}

void throw_buffer_size_mismatch(size_t have, size_t got) {
  throw Error("DeviceBuffer", "a copy of " + std::to_string(got) + " elements into a buffer of " +
                                  std::to_string(have));
}

}  // namespace qparity::gpu
