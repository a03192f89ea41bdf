#include "gpu_engine/tensor_parallel.h"

#include <string>

#include "core/error.h"
#include "gpu_engine/cuda_check.h"

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

}  // namespace qparity::gpu
