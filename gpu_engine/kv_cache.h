#pragma once
// Paged KV cache: per layer, K and V pools of num_blocks blocks of block_size positions
// ([num_blocks, block_size, num_kv_heads, head_dim] elements of the layer's format: bf16, or a
// quantized KV scheme's int8 / fp8 codes, kernels/kv_quant.h), and a block table mapping each
// sequence slot's positions to blocks (row s: block of positions [j * block_size, (j+1) *
// block_size)). Blocks come from one free list shared by all slots, so sequences of different
// lengths share the pool (continuous batching); release() returns a finished sequence's blocks.
// A Gated DeltaNet layer (Qwen3.5) has no K / V pools: its slot holds the recurrent state.
#include <cuda_bf16.h>
#include <cuda_runtime_api.h>

#include <cstdint>
#include <vector>

#include "core/config/model_config.h"
#include "gpu_engine/device_buffer.h"
#include "gpu_engine/kernels/kv_quant.h"

namespace qparity::gpu {

struct KvCacheShape {
  int64_t num_blocks = 0;
  int64_t block_size = 16;
  int64_t max_seqs = 0;
  int64_t max_blocks_per_seq = 0;
};

class PagedKvCache {
 public:
  // formats: one per layer (empty: every layer bf16).
  PagedKvCache(const ModelConfig& cfg, const KvCacheShape& shape,
               std::vector<KvCacheFormat> formats = {});

  // Slot s gets blocks for positions [0, length). Throws qparity::Error ("kv cache") naming the
  // slot when the pool or the slot's table row is exhausted.
  void reserve(int32_t slot, int64_t length);
  void release(int32_t slot);
  int64_t reserved(int32_t slot) const;  // positions slot s has blocks for
  int64_t free_blocks() const { return static_cast<int64_t>(free_.size()); }
  // Copies the host block table to the device when it changed (stream-ordered).
  void sync(cudaStream_t stream);

  // Qwen3.5's Gated DeltaNet layers hold no keys or values: per slot, the last K - 1 pre-conv
  // rows [max_seqs, K - 1, C] (bf16) and the delta rule's state [max_seqs, HV, dk, dv] (fp32)
  // (kernels/gated_delta_net.h); null for other layers. A recurrent state moves forward only:
  // a slot's next run of tokens starts where the last ended (consumed), or at 0 (a new
  // sequence); check_recurrent_run refuses anything else, naming the slot.
  __nv_bfloat16* conv_state(int64_t layer) const {
    return conv_state_[static_cast<size_t>(layer)].get();
  }
  float* ssm_state(int64_t layer) const { return ssm_state_[static_cast<size_t>(layer)].get(); }
  bool recurrent() const { return linear_; }
  void check_recurrent_run(int32_t slot, int64_t first) const;
  void advance_recurrent(int32_t slot, int64_t first, int64_t count);
  // After graph replays (the same tokens fed again): every slot must restart at 0.
  void invalidate_recurrent();
  void* k(int64_t layer) const { return k_[static_cast<size_t>(layer)].get(); }
  void* v(int64_t layer) const { return v_[static_cast<size_t>(layer)].get(); }
  KvCacheFormat format(int64_t layer) const { return formats_[static_cast<size_t>(layer)]; }
  const int32_t* block_table() const { return table_dev_.get(); }
  // Slot s's row of the host block table (max_blocks_per_seq entries, -1 past its blocks).
  const int32_t* host_row(int32_t slot) const {
    return table_.data() +
           static_cast<size_t>(slot) * static_cast<size_t>(shape_.max_blocks_per_seq);
  }
  const KvCacheShape& shape() const { return shape_; }
  size_t bytes() const { return bytes_; }

 private:
  KvCacheShape shape_;
  std::vector<KvCacheFormat> formats_;
  std::vector<DeviceBuffer<uint8_t>> k_, v_;  // bytes
  std::vector<DeviceBuffer<__nv_bfloat16>> conv_state_;
  std::vector<DeviceBuffer<float>> ssm_state_;
  bool linear_ = false;
  std::vector<int64_t> consumed_;   // per slot: tokens its recurrent state has taken in
  std::vector<int32_t> table_;      // [max_seqs, max_blocks_per_seq], -1 = none
  std::vector<int64_t> blocks_of_;  // per slot
  std::vector<int32_t> free_;
  DeviceBuffer<int32_t> table_dev_;
  bool dirty_ = true;
  size_t bytes_ = 0;
};

}  // namespace qparity::gpu
