#pragma once
// Programmatic dependent launch (sm_90): a kernel launched with launch_pdl may start while the
// kernel before it in the stream is still running. Decode runs ~200 small kernels per step, and
// without this each one pays the launch latency and its own DRAM latency ramp in series.
//
// The contract every kernel launched through launch_pdl keeps:
//   - pdl_wait() before it reads anything an earlier kernel writes, and before it writes
//     anything (an earlier kernel may still be reading it). It returns once the preceding grid
//     has completed and its memory is visible; completion is transitive down the stream.
//   - before pdl_wait() it may only read what no kernel of the forward writes: weights, and the
//     batch's tokens / positions / block table (copied in before the forward's first kernel,
//     which itself starts only after those copies). That is the point: the skinny GEMM issues
//     its first weight loads there, the attention prologue computes its RoPE angles.
//   - pdl_launch_dependents() lets the next kernel be scheduled early. The next kernel's blocks
//     only become resident once every block of this grid has issued it (or exited), so they
//     cannot starve this grid of SMs.
// On devices below sm_90 both are no-ops and the launch attribute is ignored. QPARITY_NO_PDL=1 in
// the environment launches everything normally (for A/B runs and for ruling PDL out).
#include <cuda_runtime.h>

#include <cstdlib>
#include <cstring>
#include <string>
#include <utility>

#include "gpu_engine/kernels/launch_check.h"

namespace qparity::gpu {

__device__ __forceinline__ void pdl_wait() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.wait;" ::: "memory");
#endif
}

__device__ __forceinline__ void pdl_launch_dependents() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
#endif
}

inline bool pdl_enabled() {
  static const bool on = [] {
    const char* v = std::getenv("QPARITY_NO_PDL");
    return !(v && std::strcmp(v, "1") == 0);
  }();
  return on;
}

template <typename... KernelArgs, typename... Args>
void launch_pdl(const char* name, void (*kernel)(KernelArgs...), dim3 grid, dim3 block, size_t smem,
                cudaStream_t stream, Args&&... args) {
  cudaLaunchAttribute attr[1];
  attr[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
  attr[0].val.programmaticStreamSerializationAllowed = 1;
  cudaLaunchConfig_t cfg{};
  cfg.gridDim = grid;
  cfg.blockDim = block;
  cfg.dynamicSmemBytes = smem;
  cfg.stream = stream;
  cfg.attrs = attr;
  cfg.numAttrs = pdl_enabled() ? 1 : 0;
  const cudaError_t e = cudaLaunchKernelEx(&cfg, kernel, std::forward<Args>(args)...);
  if (e != cudaSuccess)
    throw_launch_error(name, std::string("launch failed: ") + cudaGetErrorName(e) + " (" +
                                 cudaGetErrorString(e) + ")");
  check_launch(name);
}

}  // namespace qparity::gpu
