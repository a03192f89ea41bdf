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
#include <functional>
#include <vector>

#include "core/parallel/tp_sharding.h"
#include "gpu_engine/engine.h"
#include "gpu_engine/load_options.h"
#include "gpu_engine/tp_comm.h"

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

// One rank's NCCL communicator as the decoder uses it (tp_comm.h).
class NcclComm : public TpComm {
 public:
  NcclComm(ncclComm_t comm, int rank, int size) : comm_(comm), rank_(rank), size_(size) {}
  ~NcclComm() override;
  int rank() const override { return rank_; }
  int size() const override { return size_; }
  void all_gather_bf16(const __nv_bfloat16* send, __nv_bfloat16* recv, size_t count,
                       cudaStream_t stream) override;
  void all_gather_f32(const float* send, float* recv, size_t count, cudaStream_t stream) override;

 private:
  ncclComm_t comm_;
  int rank_, size_;
};

// The engine of checkpoint `dir` at tensor parallelism tp over devices 0..tp-1 of this process
// (tp = 1: the ordinary engine on the current device). One process drives every rank, each from
// its own thread (engine.h): a dump, a golden or a bisect of a TP run then needs no launcher and
// no inter-process gather, and the ranks' capture points meet in host memory. Each rank's shard
// is cut from the checkpoint in host memory and loaded as a checkpoint of the rank's shapes.
// Throws naming the count when fewer than tp devices are visible, or the tensor / config key
// whose partition fails.
std::unique_ptr<Engine> load_tp_engine(const std::filesystem::path& dir, int tp,
                                       const GpuLoadOptions& load, const EngineOptions& options,
                                       std::ostream* progress);

// The same from any source of rank models: model_of(rank) runs with that rank's device current
// and returns its shard (GpuModel::tp / rank / whole_cfg set), e.g. a random model of
// tp_rank_config's shapes for a benchmark.
std::unique_ptr<Engine> make_tp_engine(
    int tp, const std::function<std::unique_ptr<GpuModel>(int rank)>& model_of,
    const EngineOptions& options);

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
