#include "gpu_engine/kernels/launch_check.h"

#include "core/error.h"

namespace qparity::gpu {

void throw_launch_error(const char* kernel, const std::string& what) {
  throw Error(kernel, what);
}

void check_launch(const char* kernel) {
  const cudaError_t e = cudaGetLastError();
  if (e != cudaSuccess)
    throw Error(kernel, std::string("launch failed: ") + cudaGetErrorName(e) + " (" +
                            cudaGetErrorString(e) + ")");
}

}  // namespace qparity::gpu
