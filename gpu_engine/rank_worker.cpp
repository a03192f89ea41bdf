#include "gpu_engine/rank_worker.h"

#include <cuda_runtime_api.h>

#include "core/error.h"
#include "gpu_engine/cuda_check.h"

namespace qparity::gpu {

RankWorker::RankWorker(int device) : thread_([this, device] { loop(device); }) {}

RankWorker::~RankWorker() {
  {
    std::unique_lock<std::mutex> lock(mutex_);
    cv_.wait(lock, [&] { return !pending_ && !running_; });
    stop_ = true;
  }
  cv_.notify_all();
  thread_.join();
}

void RankWorker::post(std::function<void()> job) {
  std::unique_lock<std::mutex> lock(mutex_);
  if (pending_ || running_) throw Error("engine", "a rank worker was given a second job");
  job_ = std::move(job);
  error_ = nullptr;
  pending_ = true;
  lock.unlock();
  cv_.notify_all();
}

void RankWorker::wait() {
  std::unique_lock<std::mutex> lock(mutex_);
  cv_.wait(lock, [&] { return !pending_ && !running_; });
  if (error_) {
    std::exception_ptr e = error_;
    error_ = nullptr;
    std::rethrow_exception(e);
  }
}

void RankWorker::loop(int device) {
  std::exception_ptr bind_error;
  try {
    QPARITY_CUDA_CHECK(cudaSetDevice(device));
  } catch (...) {
    bind_error = std::current_exception();
  }
  for (;;) {
    std::function<void()> job;
    {
      std::unique_lock<std::mutex> lock(mutex_);
      cv_.wait(lock, [&] { return pending_ || stop_; });
      if (stop_ && !pending_) return;
      job = std::move(job_);
      pending_ = false;
      running_ = true;
    }
    std::exception_ptr error = bind_error;
    if (!error) {
      try {
        job();
      } catch (...) {
        error = std::current_exception();
      }
    }
    {
      std::lock_guard<std::mutex> lock(mutex_);
      running_ = false;
      error_ = error;
    }
    cv_.notify_all();
  }
}

}  // namespace qparity::gpu
