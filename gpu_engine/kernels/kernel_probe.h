#pragma once
// Where a decode step's time goes, inside a CUDA graph (bench_engine --timeline): a kernel given a
// KernelProbe stamps the device's global nanosecond timer when its first and its last block
// start, when its first and its last block are released by pdl_wait() (the kernel before it has
// completed), and when its last block ends. Consecutive probes then give each kernel's
// launch-to-release gap, its run after the wait, and whether all of its blocks were resident
// (started) before the release or only became so after. No value changes; a null probe costs
// one predicated branch per stamp.
//
// Every field is reduced with atomicMin (the "last" stamps stored complemented), so a 0xFF
// memset resets a probe.
#include <cstdint>

namespace qparity::gpu {

struct KernelProbe {
  unsigned long long first_entry, first_release, last_exit_complement;
  unsigned long long last_entry_complement, last_release_complement;
};

#if defined(__CUDACC__)
__device__ __forceinline__ unsigned long long probe_now() {
  unsigned long long t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  return t;
}
__device__ __forceinline__ void probe_entry(KernelProbe* p) {
  if (p && threadIdx.x == 0) {
    const unsigned long long t = probe_now();
    atomicMin(&p->first_entry, t);
    atomicMin(&p->last_entry_complement, ~t);
  }
}
__device__ __forceinline__ void probe_release(KernelProbe* p) {
  if (p && threadIdx.x == 0) {
    const unsigned long long t = probe_now();
    atomicMin(&p->first_release, t);
    atomicMin(&p->last_release_complement, ~t);
  }
}
__device__ __forceinline__ void probe_exit(KernelProbe* p) {
  if (p && threadIdx.x == 0) atomicMin(&p->last_exit_complement, ~probe_now());
}
#endif

}  // namespace qparity::gpu
