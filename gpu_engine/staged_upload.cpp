#include "gpu_engine/staged_upload.h"

#include <cuda_fp16.h>

#include <cmath>
#include <cstring>

#include "core/error.h"
#include "gpu_engine/cuda_check.h"

namespace qparity::gpu {

StagedUploader::StagedUploader(size_t chunk_bytes) : chunk_(chunk_bytes - chunk_bytes % 4) {
  if (chunk_ < 4) throw Error("StagedUploader", "chunk must hold at least one fp32 value");
  QPARITY_CUDA_CHECK(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking));
  for (int i = 0; i < kSlots; ++i) {
    QPARITY_CUDA_CHECK(cudaMallocHost(&pinned_[i], chunk_));
    QPARITY_CUDA_CHECK(cudaEventCreateWithFlags(&done_[i], cudaEventDisableTiming));
  }
}

StagedUploader::~StagedUploader() {
  if (stream_) cudaStreamSynchronize(stream_);
  for (int i = 0; i < kSlots; ++i) {
    if (done_[i]) cudaEventDestroy(done_[i]);
    if (pinned_[i]) cudaFreeHost(pinned_[i]);
  }
  if (stream_) cudaStreamDestroy(stream_);
}

void StagedUploader::upload_bf16(__nv_bfloat16* dst, std::span<const uint8_t> src, DType dtype,
                                 const std::string& what) {
  size_t in_size = 0;
  switch (dtype) {
    case DType::kBF16:
    case DType::kF16:
      in_size = 2;
      break;
    case DType::kF32:
      in_size = 4;
      break;
    default:
      throw Error(what, "the GPU engine loads BF16, F16 or F32 weights; this tensor is " +
                            std::string(dtype_name(dtype)));
  }
  if (src.size() % in_size != 0)
    throw Error(what, "byte size " + std::to_string(src.size()) + " is not a whole number of " +
                          std::string(dtype_name(dtype)) + " elements");
  const size_t n = src.size() / in_size;
  const size_t per_chunk = chunk_ / 2;  // bf16 elements one pinned buffer holds
  for (size_t first = 0; first < n; first += per_chunk) {
    const size_t count = std::min(per_chunk, n - first);
    const int slot = next_;
    next_ = (next_ + 1) % kSlots;
    QPARITY_CUDA_CHECK(cudaEventSynchronize(done_[slot]));  // the slot's previous copy is done
    auto* out = static_cast<__nv_bfloat16*>(pinned_[slot]);
    const uint8_t* in = src.data() + first * in_size;
    bool finite = true;
    if (dtype == DType::kBF16) {
      std::memcpy(out, in, count * 2);
      for (size_t i = 0; i < count && finite; ++i)
        finite = std::isfinite(__bfloat162float(out[i]));
    } else {
      for (size_t i = 0; i < count; ++i) {
        float f;
        if (dtype == DType::kF32) {
          std::memcpy(&f, in + 4 * i, 4);
        } else {
          __half_raw r;
          std::memcpy(&r.x, in + 2 * i, 2);
          f = __half2float(__half(r));
        }
        finite = finite && std::isfinite(f);
        out[i] = __float2bfloat16_rn(f);
      }
    }
    if (!finite)
      throw Error(what, "holds a NaN or Inf weight (elements " + std::to_string(first) + ".." +
                            std::to_string(first + count - 1) + ")");
    QPARITY_CUDA_CHECK(
        cudaMemcpyAsync(dst + first, out, count * 2, cudaMemcpyHostToDevice, stream_));
    QPARITY_CUDA_CHECK(cudaEventRecord(done_[slot], stream_));
    uploaded_ += count * 2;
  }
}

void StagedUploader::finish() {
  QPARITY_CUDA_CHECK(cudaStreamSynchronize(stream_));
}

}  // namespace qparity::gpu
