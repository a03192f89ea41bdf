#include "gpu_engine/gpu_model.h"

#include "reference_cpu/layers/rope.h"

namespace qparity::gpu {

void attach_rope(GpuModel& m) {
  const reference::Rope rope(m.cfg);
  m.inv_freq = DeviceBuffer<double>(rope.inv_freq());
  m.rope_scaling = rope.attention_scaling();
}

}  // namespace qparity::gpu
