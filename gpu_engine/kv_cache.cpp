#include "gpu_engine/kv_cache.h"

#include <algorithm>

#include "core/error.h"
#include "gpu_engine/cuda_check.h"

namespace qparity::gpu {

PagedKvCache::PagedKvCache(const ModelConfig& cfg, const KvCacheShape& s,
                           std::vector<KvCacheFormat> formats)
    : shape_(s), formats_(std::move(formats)) {
  if (s.num_blocks <= 0 || s.block_size <= 0 || s.max_seqs <= 0 || s.max_blocks_per_seq <= 0)
    throw Error("kv cache", "num_blocks, block_size, max_seqs and max_blocks_per_seq must be > 0");
  if (formats_.empty()) formats_.assign(static_cast<size_t>(cfg.num_layers), KvCacheFormat::kBf16);
  if (static_cast<int64_t>(formats_.size()) != cfg.num_layers)
    throw Error("kv cache", std::to_string(formats_.size()) + " layer formats for " +
                                std::to_string(cfg.num_layers) + " layers");
  const size_t elements =
      static_cast<size_t>(s.num_blocks * s.block_size * cfg.num_kv_heads * cfg.head_dim);
  const LinearAttentionDims& ld = cfg.linear;
  for (int64_t l = 0; l < cfg.num_layers; ++l) {
    if (cfg.is_linear_attention_layer(l)) {  // no keys or values: the slot's recurrent state
      k_.emplace_back();
      v_.emplace_back();
      conv_state_.emplace_back(
          static_cast<size_t>(s.max_seqs * (ld.conv_kernel - 1) * ld.conv_dim()));
      ssm_state_.emplace_back(static_cast<size_t>(s.max_seqs * ld.state_size()));
      bytes_ += conv_state_.back().bytes() + ssm_state_.back().bytes();
      continue;
    }
    const size_t per_layer = elements * kv_element_bytes(formats_[static_cast<size_t>(l)]);
    k_.emplace_back(per_layer);
    v_.emplace_back(per_layer);
    conv_state_.emplace_back();
    ssm_state_.emplace_back();
    bytes_ += 2 * per_layer;
  }
  linear_ = cfg.has_linear_attention();
  consumed_.assign(static_cast<size_t>(s.max_seqs), 0);
  table_.assign(static_cast<size_t>(s.max_seqs * s.max_blocks_per_seq), -1);
  blocks_of_.assign(static_cast<size_t>(s.max_seqs), 0);
  // Hand out low block ids first (a fresh cache's layout is then the same run to run).
  for (int64_t b = s.num_blocks - 1; b >= 0; --b)
    free_.push_back(static_cast<int32_t>(b));
  table_dev_ = DeviceBuffer<int32_t>(table_.size());
}

void PagedKvCache::reserve(int32_t slot, int64_t length) {
  if (slot < 0 || slot >= shape_.max_seqs)
    throw Error("kv cache", "slot " + std::to_string(slot) + " outside [0, " +
                                std::to_string(shape_.max_seqs) + ")");
  const int64_t need = (length + shape_.block_size - 1) / shape_.block_size;
  if (need > shape_.max_blocks_per_seq)
    throw Error("kv cache", "slot " + std::to_string(slot) + " needs " + std::to_string(length) +
                                " positions; a sequence holds at most " +
                                std::to_string(shape_.max_blocks_per_seq * shape_.block_size));
  int64_t& have = blocks_of_[static_cast<size_t>(slot)];
  if (need - have > static_cast<int64_t>(free_.size()))
    throw Error("kv cache", "out of blocks: slot " + std::to_string(slot) + " needs " +
                                std::to_string(need - have) + " more, " +
                                std::to_string(free_.size()) + " free");
  for (; have < need; ++have) {
    table_[static_cast<size_t>(slot * shape_.max_blocks_per_seq + have)] = free_.back();
    free_.pop_back();
    dirty_ = true;
  }
}

void PagedKvCache::release(int32_t slot) {
  if (slot < 0 || slot >= shape_.max_seqs) return;
  int64_t& have = blocks_of_[static_cast<size_t>(slot)];
  for (int64_t j = have - 1; j >= 0; --j) {
    int32_t& b = table_[static_cast<size_t>(slot * shape_.max_blocks_per_seq + j)];
    free_.push_back(b);
    b = -1;
  }
  have = 0;
  consumed_[static_cast<size_t>(slot)] = 0;
  dirty_ = true;
}

void PagedKvCache::check_recurrent_run(int32_t slot, int64_t first) const {
  if (!linear_) return;
  const int64_t have = consumed_.at(static_cast<size_t>(slot));
  if (first != 0 && have < 0)
    throw Error("kv cache", "slot " + std::to_string(slot) +
                                ": its recurrent (Gated DeltaNet) state was fed the same tokens "
                                "again by graph replays (replay_graph); restart the sequence at 0");
  if (first != 0 && first != have)
    throw Error("kv cache",
                "slot " + std::to_string(slot) + ": its recurrent (Gated DeltaNet) state holds " +
                    std::to_string(have) + " tokens, the batch continues it at position " +
                    std::to_string(first) + " (a recurrent state moves forward only: continue at " +
                    std::to_string(have) + ", or restart the sequence at 0)");
}

void PagedKvCache::invalidate_recurrent() {
  if (linear_) std::fill(consumed_.begin(), consumed_.end(), -1);
}

void PagedKvCache::advance_recurrent(int32_t slot, int64_t first, int64_t count) {
  if (linear_) consumed_.at(static_cast<size_t>(slot)) = first + count;
}

int64_t PagedKvCache::reserved(int32_t slot) const {
  return blocks_of_.at(static_cast<size_t>(slot)) * shape_.block_size;
}

void PagedKvCache::sync(cudaStream_t stream) {
  if (!dirty_) return;
  QPARITY_CUDA_CHECK(cudaMemcpyAsync(table_dev_.get(), table_.data(), table_.size() * 4,
                                     cudaMemcpyHostToDevice, stream));
  // The host table may change again before the copy runs: wait for it (a rare, small copy).
  QPARITY_CUDA_CHECK(cudaStreamSynchronize(stream));
  dirty_ = false;
}

}  // namespace qparity::gpu
