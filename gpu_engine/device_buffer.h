#pragma once
// Owning device allocation of n elements of T (cudaMalloc / cudaFree), with blocking copies to and
// from host vectors. Move-only. Errors become qparity::Error through QPARITY_CUDA_CHECK.
#include <cuda_runtime_api.h>

#include <cstddef>
#include <utility>
#include <vector>

#include "gpu_engine/cuda_check.h"

namespace qparity::gpu {

template <typename T>
class DeviceBuffer {
 public:
  DeviceBuffer() = default;
  explicit DeviceBuffer(size_t n) : n_(n) {
    if (n_ > 0) QPARITY_CUDA_CHECK(cudaMalloc(reinterpret_cast<void**>(&p_), n_ * sizeof(T)));
  }
  explicit DeviceBuffer(const std::vector<T>& host) : DeviceBuffer(host.size()) { upload(host); }
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;
  DeviceBuffer(DeviceBuffer&& o) noexcept
      : p_(std::exchange(o.p_, nullptr)), n_(std::exchange(o.n_, 0)) {}
  DeviceBuffer& operator=(DeviceBuffer&& o) noexcept {
    if (this != &o) {
      release();
      p_ = std::exchange(o.p_, nullptr);
      n_ = std::exchange(o.n_, 0);
    }
    return *this;
  }
  ~DeviceBuffer() { release(); }

  T* get() const { return p_; }
  size_t size() const { return n_; }
  size_t bytes() const { return n_ * sizeof(T); }

  void upload(const std::vector<T>& host) {
    if (host.size() != n_) throw_size_mismatch(host.size());
    if (n_ > 0) QPARITY_CUDA_CHECK(cudaMemcpy(p_, host.data(), bytes(), cudaMemcpyHostToDevice));
  }
  std::vector<T> download() const {
    std::vector<T> host(n_);
    if (n_ > 0) QPARITY_CUDA_CHECK(cudaMemcpy(host.data(), p_, bytes(), cudaMemcpyDeviceToHost));
    return host;
  }
  // Every byte set to `byte`: 0xFF makes bf16 / fp16 / fp32 NaN, so an output a kernel fails to
  // write shows up in the comparison instead of passing as stale data.
  void poison(int byte = 0xFF) {
    if (n_ > 0) QPARITY_CUDA_CHECK(cudaMemset(p_, byte, bytes()));
  }

 private:
  void release() {
    if (p_) cudaFree(p_);  // no throw from a destructor; a failed free leaks, nothing more
    p_ = nullptr;
    n_ = 0;
  }
  [[noreturn]] void throw_size_mismatch(size_t got) const;

  T* p_ = nullptr;
  size_t n_ = 0;
};

[[noreturn]] void throw_buffer_size_mismatch(size_t have, size_t got);

template <typename T>
void DeviceBuffer<T>::throw_size_mismatch(size_t got) const {
  throw_buffer_size_mismatch(n_, got);
}

}  // namespace qparity::gpu
