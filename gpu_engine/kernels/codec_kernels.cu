#include "gpu_engine/kernels/codec_kernels.h"

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_fp4.h>
#include <cuda_fp8.h>

#include "core/error.h"
#include "gpu_engine/cuda_check.h"

namespace qparity::gpu {

namespace {

struct CodecParams {
  GpuCodec codec;
  bool saturate;
  const float* in;
  uint16_t* codes;
  float* values;
  uint32_t n;
};

__device__ float decode_one(GpuCodec c, uint32_t code) {
  switch (c) {
    case GpuCodec::kBF16: {
      __nv_bfloat16_raw r;
      r.x = static_cast<unsigned short>(code);
      return __bfloat162float(__nv_bfloat16(r));
    }
    case GpuCodec::kFP16: {
      __half_raw r;
      r.x = static_cast<unsigned short>(code);
      return __half2float(__half(r));
    }
    case GpuCodec::kE4M3:
      return __half2float(
          __half(__nv_cvt_fp8_to_halfraw(static_cast<__nv_fp8_storage_t>(code), __NV_E4M3)));
    case GpuCodec::kE5M2:
      return __half2float(
          __half(__nv_cvt_fp8_to_halfraw(static_cast<__nv_fp8_storage_t>(code), __NV_E5M2)));
    case GpuCodec::kE2M1:
      return __half2float(
          __half(__nv_cvt_fp4_to_halfraw(static_cast<__nv_fp4_storage_t>(code), __NV_E2M1)));
    case GpuCodec::kUE8M0TowardZero:
    case GpuCodec::kUE8M0Up:
      return __bfloat162float(
          __nv_bfloat16(__nv_cvt_e8m0_to_bf16raw(static_cast<__nv_fp8_storage_t>(code))));
  }
  return 0.f;
}

__device__ uint16_t encode_one(GpuCodec c, float x, bool saturate) {
  const __nv_saturation_t sat = saturate ? __NV_SATFINITE : __NV_NOSAT;
  switch (c) {
    case GpuCodec::kBF16:
      return __nv_bfloat16_raw(__float2bfloat16_rn(x)).x;
    case GpuCodec::kFP16:
      return __half_raw(__float2half_rn(x)).x;
    case GpuCodec::kE4M3:
      return __nv_cvt_float_to_fp8(x, sat, __NV_E4M3);
    case GpuCodec::kE5M2:
      return __nv_cvt_float_to_fp8(x, sat, __NV_E5M2);
    case GpuCodec::kE2M1:
      return __nv_cvt_float_to_fp4(x, __NV_E2M1, cudaRoundNearest);
    case GpuCodec::kUE8M0TowardZero:
      return __nv_cvt_float_to_e8m0(x, sat, cudaRoundZero);
    case GpuCodec::kUE8M0Up:
      return __nv_cvt_float_to_e8m0(x, sat, cudaRoundPosInf);
  }
  return 0;
}

__global__ void decode_kernel(CodecParams p) {
  const uint32_t i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < p.n) p.values[i] = decode_one(p.codec, i);
}

__global__ void encode_kernel(CodecParams p) {
  const uint32_t i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < p.n) p.codes[i] = encode_one(p.codec, p.in[i], p.saturate);
}

uint32_t code_count(GpuCodec c) {
  switch (c) {
    case GpuCodec::kBF16:
    case GpuCodec::kFP16:
      return 1u << 16;
    case GpuCodec::kE4M3:
    case GpuCodec::kE5M2:
    case GpuCodec::kUE8M0TowardZero:
    case GpuCodec::kUE8M0Up:
      return 256;
    case GpuCodec::kE2M1:
      return 16;
  }
  return 0;
}

// Device buffer freed on every path, including exceptions from later CUDA calls.
template <typename T>
struct DeviceBuffer {
  T* ptr = nullptr;
  explicit DeviceBuffer(size_t n) { QPARITY_CUDA_CHECK(cudaMalloc(&ptr, n * sizeof(T))); }
  ~DeviceBuffer() { cudaFree(ptr); }
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;
};

}  // namespace

std::vector<float> gpu_decode_all_codes(GpuCodec codec) {
  const uint32_t n = code_count(codec);
  DeviceBuffer<float> out(n);
  CodecParams p{codec, false, nullptr, nullptr, out.ptr, n};
  decode_kernel<<<(n + 255) / 256, 256>>>(p);
  QPARITY_CUDA_CHECK(cudaGetLastError());
  std::vector<float> host(n);
  QPARITY_CUDA_CHECK(cudaMemcpy(host.data(), out.ptr, n * sizeof(float), cudaMemcpyDeviceToHost));
  return host;
}

std::vector<uint16_t> gpu_encode(GpuCodec codec, const std::vector<float>& values, bool saturate) {
  if (values.size() > (1u << 30)) throw Error("gpu_encode", "at most 2^30 values per call");
  const auto n = static_cast<uint32_t>(values.size());
  if (n == 0) return {};
  DeviceBuffer<float> in(n);
  DeviceBuffer<uint16_t> out(n);
  QPARITY_CUDA_CHECK(cudaMemcpy(in.ptr, values.data(), n * sizeof(float), cudaMemcpyHostToDevice));
  CodecParams p{codec, saturate, in.ptr, out.ptr, nullptr, n};
  encode_kernel<<<(n + 255) / 256, 256>>>(p);
  QPARITY_CUDA_CHECK(cudaGetLastError());
  std::vector<uint16_t> host(n);
  QPARITY_CUDA_CHECK(
      cudaMemcpy(host.data(), out.ptr, n * sizeof(uint16_t), cudaMemcpyDeviceToHost));
  return host;
}

}  // namespace qparity::gpu
