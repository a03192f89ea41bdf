#pragma once
// Single-process tensor parallelism over devices 0..tp-1: one NCCL communicator and one stream
// per rank (ncclCommInitAll), collectives issued for all ranks from one host thread inside an
// NCCL group. With core/parallel/tp_sharding.h's rules (which slice of each checkpoint tensor a
// rank holds) this is the TP path's foundation: row-parallel linears all-reduce their partial
// sums, column-parallel ones all-gather their slices, the vocab-parallel embedding all-reduces
// rows that only their owner filled. Runs where NCCL was found (NCCL::nccl).
#include <cuda_runtime_api.h>
#include <nccl.h>

#include <cstdint>
#include <vector>

#include "core/parallel/tp_sharding.h"

namespace qparity::gpu {

class TpGroup {
 public:
  // Throws qparity::Error naming the count when fewer than tp devices are visible.
  explicit TpGroup(int tp);
  ~TpGroup();
  TpGroup(const TpGroup&) = delete;
  TpGroup& operator=(const TpGroup&) = delete;

  int size() const { return static_cast<int>(comms_.size()); }
  cudaStream_t stream(int rank) const { return streams_[static_cast<size_t>(rank)]; }

  // In place: buffers[r] (on device r, `count` elements) becomes the sum over ranks.
  void all_reduce_sum(const std::vector<void*>& buffers, size_t count, ncclDataType_t type);
  // recv[r] (tp * count elements) = send[0] | send[1] | ... on every rank.
  void all_gather(const std::vector<const void*>& send, const std::vector<void*>& recv,
                  size_t count, ncclDataType_t type);
  void synchronize();

 private:
  std::vector<ncclComm_t> comms_;
  std::vector<cudaStream_t> streams_;
};

// The rows [begin, end) (dim 0) or columns (dim 1) of a row-major [rows, cols] tensor, as the
// shard says; vocab shards get zero rows up to `padded`.
template <typename T>
std::vector<T> shard_of(const std::vector<T>& full, int64_t rows, int64_t cols,
                        const TensorShard& s) {
  std::vector<T> out;
  if (s.dim == 0) {
    out.assign(full.begin() + s.begin * cols, full.begin() + s.end * cols);
    if (s.kind == ShardKind::kVocab) out.resize(static_cast<size_t>(s.padded * cols), T{});
  } else {
    for (int64_t r = 0; r < rows; ++r)
      out.insert(out.end(), full.begin() + r * cols + s.begin, full.begin() + r * cols + s.end);
  }
  return out;
}

}  // namespace qparity::gpu
