#pragma once
// What every kernel launcher checks before it launches: shapes, pointers, alignment. A failed
// check is a qparity::Error naming the kernel and the violated constraint; a launch failure is
// the CUDA error of cudaGetLastError, named the same way.
#include <cuda_runtime_api.h>

#include <cstdint>
#include <string>

namespace qparity::gpu {

[[noreturn]] void throw_launch_error(const char* kernel, const std::string& what);

inline void require(bool ok, const char* kernel, const std::string& what) {
  if (!ok) throw_launch_error(kernel, what);
}

inline bool aligned(const void* p, size_t bytes) {
  return reinterpret_cast<uintptr_t>(p) % bytes == 0;
}

// After a <<<>>> launch: a bad configuration or an earlier asynchronous fault surfaces here.
void check_launch(const char* kernel);

}  // namespace qparity::gpu
