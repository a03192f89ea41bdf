#pragma once
// Step 3 of the KV-cache lifecycle on the device: a processed reference KvCacheMethod (the same
// tensors taken and checked by name as the reference takes them: kv_int8.h, kv_fp8.h) becomes the
// layer's KvQuant, the parameters the attention kernels quantize on write and dequantize on read
// with (kernels/kv_quant.h). What the GPU cannot reproduce bit for bit is refused by name: the
// codes the GPU writes are the reference's codes.
#include <cstdint>

#include "gpu_engine/device_buffer.h"
#include "gpu_engine/kernels/kv_quant.h"

namespace qparity::reference {
class KvCacheMethod;
}

namespace qparity::gpu {

struct GpuKvCache {
  KvQuant quant;  // quant.channels points into `channels`
  DeviceBuffer<float>
      channels;  // int8: [6, num_kv_heads * kernel_head_dim]; fp8 per head: [2, Hkv]
};

// `kernel_head_dim` >= the method's head_dim: the kernels' (zero-padded) head length; a padded
// channel gets scale 1, offset 0 (its values are zeros, stored and read back as zeros).
// Throws naming the attention prefix for a dialect whose store the GPU does not reproduce.
GpuKvCache upload_kv_cache(const reference::KvCacheMethod& host, int64_t kernel_head_dim);

}  // namespace qparity::gpu
