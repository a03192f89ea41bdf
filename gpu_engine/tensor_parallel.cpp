#include "gpu_engine/tensor_parallel.h"

#include <string>

#include <ostream>

#include "core/error.h"
#include "gpu_engine/cuda_check.h"
#include "gpu_engine/model_loader.h"

namespace qparity::gpu {

namespace {

void check_nccl(ncclResult_t r, const char* call) {
  if (r != ncclSuccess)
    throw Error("nccl", std::string(call) + " failed: " + ncclGetErrorString(r));
}

}  // namespace

TpGroup::TpGroup(int tp) {
  int visible = 0;
  QPARITY_CUDA_CHECK(cudaGetDeviceCount(&visible));
  if (tp < 1 || tp > visible)
    throw Error("tensor parallel", "tp " + std::to_string(tp) + " needs that many GPUs; " +
                                       std::to_string(visible) + " visible");
  comms_.resize(static_cast<size_t>(tp));
  std::vector<int> devs(static_cast<size_t>(tp));
  for (int r = 0; r < tp; ++r)
    devs[static_cast<size_t>(r)] = r;
  check_nccl(ncclCommInitAll(comms_.data(), tp, devs.data()), "ncclCommInitAll");
  streams_.resize(static_cast<size_t>(tp));
  for (int r = 0; r < tp; ++r) {
    QPARITY_CUDA_CHECK(cudaSetDevice(r));
    QPARITY_CUDA_CHECK(
        cudaStreamCreateWithFlags(&streams_[static_cast<size_t>(r)], cudaStreamNonBlocking));
  }
}

TpGroup::~TpGroup() {
  for (size_t r = 0; r < comms_.size(); ++r) {
    cudaSetDevice(static_cast<int>(r));
    if (streams_[r]) {
      cudaStreamSynchronize(streams_[r]);
      cudaStreamDestroy(streams_[r]);
    }
    ncclCommDestroy(comms_[r]);
  }
}

void TpGroup::all_reduce_sum(const std::vector<void*>& buffers, size_t count, ncclDataType_t type) {
  if (buffers.size() != comms_.size())
    throw Error("tensor parallel", "all_reduce_sum needs one buffer per rank");
  check_nccl(ncclGroupStart(), "ncclGroupStart");
  for (size_t r = 0; r < comms_.size(); ++r)
    check_nccl(ncclAllReduce(buffers[r], buffers[r], count, type, ncclSum, comms_[r], streams_[r]),
               "ncclAllReduce");
  check_nccl(ncclGroupEnd(), "ncclGroupEnd");
}

void TpGroup::all_gather(const std::vector<const void*>& send, const std::vector<void*>& recv,
                         size_t count, ncclDataType_t type) {
  if (send.size() != comms_.size() || recv.size() != comms_.size())
    throw Error("tensor parallel", "all_gather needs one send and one recv buffer per rank");
  check_nccl(ncclGroupStart(), "ncclGroupStart");
  for (size_t r = 0; r < comms_.size(); ++r)
    check_nccl(ncclAllGather(send[r], recv[r], count, type, comms_[r], streams_[r]),
               "ncclAllGather");
  check_nccl(ncclGroupEnd(), "ncclGroupEnd");
}

void TpGroup::synchronize() {
  for (size_t r = 0; r < streams_.size(); ++r) {
    QPARITY_CUDA_CHECK(cudaSetDevice(static_cast<int>(r)));
    QPARITY_CUDA_CHECK(cudaStreamSynchronize(streams_[r]));
  }
}

NcclComm::~NcclComm() {
  // On the rank's device, leaving the caller's current device as it was.
  int current = 0;
  const bool known = cudaGetDevice(&current) == cudaSuccess;
  cudaSetDevice(rank_);
  ncclCommDestroy(comm_);
  if (known) cudaSetDevice(current);
}

void NcclComm::all_gather_bf16(const __nv_bfloat16* send, __nv_bfloat16* recv, size_t count,
                               cudaStream_t stream) {
  check_nccl(ncclAllGather(send, recv, count, ncclBfloat16, comm_, stream), "ncclAllGather");
}

void NcclComm::all_gather_f32(const float* send, float* recv, size_t count, cudaStream_t stream) {
  check_nccl(ncclAllGather(send, recv, count, ncclFloat32, comm_, stream), "ncclAllGather");
}

std::unique_ptr<Engine> load_tp_engine(const std::filesystem::path& dir, int tp,
                                       const GpuLoadOptions& load, const EngineOptions& options,
                                       std::ostream* progress) {
  if (tp == 1) return std::make_unique<Engine>(load_gpu_model(dir, progress, load), options);
  return make_tp_engine(
      tp,
      [&](int r) {
        GpuLoadOptions o = load;
        o.tp = tp;
        o.rank = r;
        if (progress) *progress << "qparity engine: rank " << r << " of tp " << tp << "\n";
        return load_gpu_model(dir, progress, o);
      },
      options);
}

std::unique_ptr<Engine> make_tp_engine(
    int tp, const std::function<std::unique_ptr<GpuModel>(int rank)>& model_of,
    const EngineOptions& options) {
  int visible = 0;
  QPARITY_CUDA_CHECK(cudaGetDeviceCount(&visible));
  if (tp < 1 || tp > visible)
    throw Error("tensor parallel", "--tp " + std::to_string(tp) + " needs that many GPUs; " +
                                       std::to_string(visible) + " visible");
  std::vector<ncclComm_t> raw(static_cast<size_t>(tp));
  std::vector<int> devs(static_cast<size_t>(tp));
  for (int r = 0; r < tp; ++r)
    devs[static_cast<size_t>(r)] = r;
  check_nccl(ncclCommInitAll(raw.data(), tp, devs.data()), "ncclCommInitAll");
  std::vector<std::unique_ptr<TpComm>> comms;
  for (int r = 0; r < tp; ++r)
    comms.push_back(std::make_unique<NcclComm>(raw[static_cast<size_t>(r)], r, tp));
  std::vector<std::unique_ptr<Engine>> engines;
  for (int r = 0; r < tp; ++r) {
    QPARITY_CUDA_CHECK(cudaSetDevice(r));
    std::unique_ptr<GpuModel> m = model_of(r);
    if (m->tp != tp || m->rank != r)
      throw Error("tensor parallel", "the model built for rank " + std::to_string(r) + " is rank " +
                                         std::to_string(m->rank) + " of tp " +
                                         std::to_string(m->tp));
    engines.push_back(
        std::make_unique<Engine>(std::move(m), options, comms[static_cast<size_t>(r)].get()));
  }
  QPARITY_CUDA_CHECK(cudaSetDevice(0));
  std::unique_ptr<Engine> leader = std::move(engines[0]);
  engines.erase(engines.begin());
  leader->attach_peers(std::move(engines), std::move(comms));
  return leader;
}

}  // namespace qparity::gpu
