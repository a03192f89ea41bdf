#pragma once
// A host thread bound to one CUDA device, running one job at a time: how a tensor-parallel
// engine drives its ranks from one process (engine.h). Each rank issues its own kernels and
// collectives on its own stream from its own thread, so no rank's launches wait behind
// another's, and NCCL needs no group calls (one communicator per thread).
#include <condition_variable>
#include <exception>
#include <functional>
#include <mutex>
#include <thread>

namespace qparity::gpu {

class RankWorker {
 public:
  explicit RankWorker(int device);
  ~RankWorker();  // finishes the running job, then joins
  RankWorker(const RankWorker&) = delete;
  RankWorker& operator=(const RankWorker&) = delete;

  // Starts `job` on the worker's thread (the device current); one job at a time.
  void post(std::function<void()> job);
  // Waits for the posted job; rethrows what it threw.
  void wait();

 private:
  void loop(int device);
  std::mutex mutex_;
  std::condition_variable cv_;
  std::function<void()> job_;
  bool pending_ = false, running_ = false, stop_ = false;
  std::exception_ptr error_;
  std::thread thread_;
};

}  // namespace qparity::gpu
