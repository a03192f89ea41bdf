#include "gpu_engine/device_info.h"

#include <cuda_runtime_api.h>

namespace qparity::gpu {

std::optional<DeviceInfo> query_device(int index, std::string* why_not) {
  int count = 0;
  const cudaError_t err = cudaGetDeviceCount(&count);
  if (err != cudaSuccess) {
    if (why_not) *why_not = std::string("no usable CUDA device: ") + cudaGetErrorString(err);
    return std::nullopt;
  }
  if (index < 0 || index >= count) {
    if (why_not)
      *why_not = "CUDA device " + std::to_string(index) + " not present (" + std::to_string(count) +
                 " found)";
    return std::nullopt;
  }
  cudaDeviceProp p{};
  if (cudaGetDeviceProperties(&p, index) != cudaSuccess) {
    if (why_not) *why_not = "cannot read the properties of CUDA device " + std::to_string(index);
    return std::nullopt;
  }
  DeviceInfo d;
  d.index = index;
  d.name = p.name;
  d.sm_major = p.major;
  d.sm_minor = p.minor;
  d.total_memory = p.totalGlobalMem;
  d.multiprocessors = p.multiProcessorCount;
  return d;
}

}  // namespace qparity::gpu
