#include "gpu_engine/kernel_timeline.h"

#include <algorithm>

#include "core/error.h"
#include "gpu_engine/cuda_check.h"

namespace qparity::gpu {

KernelTimeline::KernelTimeline(bool on, int64_t max_probes) : on_(on) {
  if (on_) probes_ = DeviceBuffer<KernelProbe>(static_cast<size_t>(max_probes));
}

void KernelTimeline::begin(int64_t t, cudaStream_t stream) {
  if (!on_) return;
  labelling_ = &labels_[t];
  labelling_->clear();
  probed_t_ = t;
  QPARITY_CUDA_CHECK(cudaMemsetAsync(probes_.get(), 0xFF, probes_.bytes(), stream));
}

KernelProbe* KernelTimeline::probe(const char* kernel) {
  if (!labelling_) return nullptr;
  const size_t i = labelling_->size();
  if (i >= probes_.size())
    throw Error("engine timeline",
                "more than " + std::to_string(probes_.size()) + " probed kernels in one forward");
  labelling_->push_back(kernel);
  return probes_.get() + i;
}

std::vector<TimelineEntry> KernelTimeline::read(cudaStream_t stream) const {
  std::vector<TimelineEntry> out;
  const auto it = labels_.find(probed_t_);
  if (!on_ || it == labels_.end()) return out;
  std::vector<KernelProbe> raw(it->second.size());
  QPARITY_CUDA_CHECK(cudaStreamSynchronize(stream));
  QPARITY_CUDA_CHECK(cudaMemcpy(raw.data(), probes_.get(), raw.size() * sizeof(KernelProbe),
                                cudaMemcpyDeviceToHost));
  unsigned long long t0 = ~0ull;
  for (const KernelProbe& p : raw)
    t0 = std::min(t0, p.first_entry);
  for (size_t i = 0; i < raw.size(); ++i) {
    const KernelProbe& p = raw[i];
    const auto us = [&](unsigned long long t) { return static_cast<double>(t - t0) * 1e-3; };
    if (p.first_entry == ~0ull || p.first_release == ~0ull || p.last_exit_complement == ~0ull)
      throw Error("engine timeline", "kernel " + std::to_string(i) + " (" + it->second[i] +
                                         ") left its probe unstamped");
    out.push_back({it->second[i], us(p.first_entry), us(p.first_release),
                   us(~p.last_exit_complement), us(~p.last_entry_complement),
                   us(~p.last_release_complement)});
  }
  return out;
}

}  // namespace qparity::gpu
