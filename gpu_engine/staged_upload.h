#pragma once
// Host-to-device weight upload through two pinned staging buffers: a chunk of a tensor's bytes
// (read straight from the mmap'd safetensors file) is converted to bf16 into one pinned buffer
// while the other is in flight on the copy stream. No second full host copy of the checkpoint
// exists at any time: host memory beyond the mapping is 2 x chunk bytes.
#include <cuda_bf16.h>
#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>
#include <span>
#include <string>

#include "core/dtype.h"

namespace qparity::gpu {

class StagedUploader {
 public:
  explicit StagedUploader(size_t chunk_bytes = size_t{16} << 20);
  ~StagedUploader();
  StagedUploader(const StagedUploader&) = delete;
  StagedUploader& operator=(const StagedUploader&) = delete;

  // Converts `src` (elements of `dtype`: BF16 copied, F16 / F32 rounded to nearest even) into
  // bf16 at dst (device, room for the element count). `what` names the tensor in errors (an
  // unsupported dtype, a NaN/Inf weight).
  void upload_bf16(__nv_bfloat16* dst, std::span<const uint8_t> src, DType dtype,
                   const std::string& what);
  // Waits for every copy issued so far.
  void finish();
  size_t bytes_uploaded() const { return uploaded_; }

 private:
  static constexpr int kSlots = 2;
  void* pinned_[kSlots] = {nullptr, nullptr};
  cudaEvent_t done_[kSlots] = {nullptr, nullptr};
  cudaStream_t stream_ = nullptr;
  size_t chunk_ = 0;
  int next_ = 0;
  size_t uploaded_ = 0;
};

}  // namespace qparity::gpu
