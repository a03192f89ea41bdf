#include "gpu_engine/quant/weight_only_int.h"

#include <cuda_bf16.h>

#include <cmath>

#include "core/error.h"
#include "gpu_engine/cuda_check.h"
#include "gpu_engine/kernels/random_init.h"
#include "gpu_engine/kernels/weight_only_gemm.h"
#include "gpu_engine/quant/upload_util.h"

namespace qparity::gpu {

namespace {

bool all_bf16_values(const std::vector<double>& v) {
  for (double d : v) {
    const float f = static_cast<float>(d);
    if (static_cast<double>(f) != d) return false;
    if (static_cast<double>(__bfloat162float(__float2bfloat16_rn(f))) != d) return false;
  }
  return true;
}

}  // namespace

WeightOnlyIntMethod::WeightOnlyIntMethod(const reference::LinearMethod& host,
                                         const GpuMethodOptions& options, int64_t expert)
    : GpuLinearMethod(method_prefix(host, expert), host.config().scheme,
                      host.shape().out_features(), host.shape().in_features),
      fault_(options.fault_group_off_by_one) {
  const reference::ProcessedIntWeight w = processed_int_weight_of(host, expert);
  const std::string& where = prefix();
  bits_ = w.bits;
  group_ = w.group;
  if (bits_ != 4 && bits_ != 8)
    throw Error(where, "int" + std::to_string(bits_) +
                           " weights: the GPU weight-only kernels take 4 or 8 bits");
  if (w.rows != out_features() || w.cols != in_features())
    throw Error(where, "processed weight is [" + std::to_string(w.rows) + ", " +
                           std::to_string(w.cols) + "], the layer is [" +
                           std::to_string(out_features()) + ", " + std::to_string(in_features()) +
                           "]");
  const int64_t c = weight_only_codes_per_load(bits_);
  if (w.cols % c != 0 || group_ % c != 0)
    throw Error(where, "in_features " + std::to_string(w.cols) + " and group " +
                           std::to_string(group_) + " must be multiples of " + std::to_string(c) +
                           " for the GPU's int" + std::to_string(bits_) + " kernels");
  // Codes.
  if (bits_ == 8) {
    std::vector<uint8_t> bytes(w.stored.size());
    for (size_t i = 0; i < bytes.size(); ++i)
      bytes[i] = static_cast<uint8_t>(w.stored[i]);
    codes_ = DeviceBuffer<uint8_t>(bytes);
  } else {
    std::vector<uint8_t> bytes(w.stored.size() / 2);
    for (size_t i = 0; i < bytes.size(); ++i) {
      const int lo = w.stored[2 * i] + 8, hi = w.stored[2 * i + 1] + 8;
      if (lo < 0 || lo > 15 || hi < 0 || hi > 15)
        throw Error(where, "int4 code outside [-8, 7] at element " + std::to_string(2 * i));
      bytes[i] = static_cast<uint8_t>(lo | (hi << 4));
    }
    codes_ = DeviceBuffer<uint8_t>(bytes);
  }
  // Scales: bf16 only where that is exact.
  for (double s : w.scale)
    if (!std::isfinite(s) || !(s > 0))
      throw Error(where + ".weight_scale", "scale " + std::to_string(s) + " (must be finite > 0)");
  scale_bf16_ = all_bf16_values(w.scale);
  if (scale_bf16_) {
    std::vector<__nv_bfloat16> s(w.scale.size());
    for (size_t i = 0; i < s.size(); ++i)
      s[i] = __float2bfloat16_rn(static_cast<float>(w.scale[i]));
    scales_bf16_ = DeviceBuffer<__nv_bfloat16>(s);
  } else {
    scales_f32_ = DeviceBuffer<float>(exact_f32(w.scale, where + ".weight_scale"));
  }
  // Zeros.
  bool any = false, small_ints = true;
  for (double z : w.zero) {
    any = any || z != 0.0;
    small_ints = small_ints && z == std::floor(z) && z >= -128 && z <= 127;
  }
  if (any && bits_ == 4 && small_ints) {
    std::vector<int8_t> z(w.zero.size());
    for (size_t i = 0; i < z.size(); ++i)
      z[i] = static_cast<int8_t>(w.zero[i]);
    zeros_i8_ = DeviceBuffer<int8_t>(z);
  } else if (any) {
    zeros_f32_ = DeviceBuffer<float>(exact_f32(w.zero, where + " zero points"));
  }
  if (!w.bias.empty()) {
    // fp32 bias: the reference adds it in fp64; an F32 / BF16 bias is exact in fp32.
    bias_ = DeviceBuffer<float>(exact_f32(w.bias, where + ".bias"));
  }
}

WeightOnlyIntMethod::WeightOnlyIntMethod(std::string prefix, SchemeId scheme, int64_t n, int64_t k,
                                         const Random& r)
    : GpuLinearMethod(std::move(prefix), std::move(scheme), n, k), bits_(r.bits), group_(r.group) {
  const int64_t c = weight_only_codes_per_load(bits_);
  if ((bits_ != 4 && bits_ != 8) || k % c != 0 || group_ % c != 0 || k % group_ != 0)
    throw Error(this->prefix(), "random weights: int4 / int8, groups of a multiple of " +
                                    std::to_string(c) + " dividing in_features");
  // Codes: the bytes of random bf16 values (every byte is an int8 code, every nibble an int4 one).
  const size_t bytes = static_cast<size_t>(n * k * bits_ / 8);
  codes_ = DeviceBuffer<uint8_t>((bytes + 1) / 2 * 2);
  launch_fill_random_bf16(reinterpret_cast<__nv_bfloat16*>(codes_.get()),
                          static_cast<int64_t>(codes_.size() / 2), 0.f, 1.f, r.seed, nullptr);
  scale_bf16_ = true;
  scales_bf16_ = DeviceBuffer<__nv_bfloat16>(static_cast<size_t>(n * (k / group_)));
  launch_fill_random_bf16(scales_bf16_.get(), static_cast<int64_t>(scales_bf16_.size()), r.scale,
                          0.f, r.seed + 1, nullptr);
  QPARITY_CUDA_CHECK(cudaDeviceSynchronize());
}

void WeightOnlyIntMethod::apply(const __nv_bfloat16* x, __nv_bfloat16* y, int64_t t,
                                cudaStream_t stream, void*) const {
  WeightOnlyGemmParams p;
  p.x = x;
  p.w = codes_.get();
  p.scales = scale_bf16_ ? static_cast<const void*>(scales_bf16_.get())
                         : static_cast<const void*>(scales_f32_.get());
  p.scale_bf16 = scale_bf16_;
  p.zeros_f32 = zeros_f32_.get();
  p.zeros_i8 = zeros_i8_.get();
  p.bias = bias_.get();
  p.y = y;
  p.m = t;
  p.n = out_features();
  p.k = in_features();
  p.group = group_;
  p.bits = bits_;
  p.fault_group_off_by_one = fault_;
  launch_weight_only_gemm(p, stream);
}

WeightOnlyExpert WeightOnlyIntMethod::device_view() const {
  return {codes_.get(),
          scale_bf16_ ? static_cast<const void*>(scales_bf16_.get())
                      : static_cast<const void*>(scales_f32_.get()),
          zeros_f32_.get(), zeros_i8_.get(), bias_.get()};
}

size_t WeightOnlyIntMethod::device_bytes() const {
  return codes_.bytes() + scales_f32_.bytes() + scales_bf16_.bytes() + zeros_f32_.bytes() +
         zeros_i8_.bytes() + bias_.bytes();
}

}  // namespace qparity::gpu
