#pragma once
// Where a decode step's time goes (EngineOptions::kernel_timeline, bench_engine --timeline): the
// decode-sized forward hands each main kernel a KernelProbe (kernels/kernel_probe.h) labelled by
// the kernel's name; read() turns the stamps into per-kernel times. A graph replays the labels of
// its capture, so the labels are kept per batch size.
#include <cuda_runtime_api.h>

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "gpu_engine/device_buffer.h"
#include "gpu_engine/kernels/kernel_probe.h"

namespace qparity::gpu {

// One probed kernel of a decode-sized forward, times in microseconds from the forward's first
// probed start: its first block's start, its first block's release from pdl_wait() and its last
// block's end.
struct TimelineEntry {
  std::string kernel;
  double start_us = 0, release_us = 0, end_us = 0;
  // The last block's start and release (a block that exits without waiting stamps no release).
  double last_start_us = 0, last_release_us = 0;
};

class KernelTimeline {
 public:
  // Off: probe() always returns null. On: room for `max_probes` probed launches a forward.
  KernelTimeline(bool on, int64_t max_probes);

  // A forward of t tokens starts labelling (decode-sized forwards only; others run unprobed).
  void begin(int64_t t, cudaStream_t stream);
  // The forward ended, or threw: nothing labels until the next begin().
  void end() { labelling_ = nullptr; }
  // The probe for the next kernel, labelled `kernel`; null when not labelling.
  KernelProbe* probe(const char* kernel);
  // The last probed forward's kernels in launch order (empty when off). Synchronizes `stream`.
  std::vector<TimelineEntry> read(cudaStream_t stream) const;

 private:
  bool on_ = false;
  DeviceBuffer<KernelProbe> probes_;
  std::map<int64_t, std::vector<std::string>> labels_;
  std::vector<std::string>* labelling_ = nullptr;
  int64_t probed_t_ = 0;
};

}  // namespace qparity::gpu
