#include "gpu_engine/quant/weight_only_int.h"

#include <cuda_bf16.h>

#include <algorithm>
#include <cmath>

#include "core/error.h"
#include "gpu_engine/cuda_check.h"
#include "gpu_engine/kernels/random_init.h"
#include "gpu_engine/kernels/weight_only_gemm.h"
#include "gpu_engine/quant/upload_util.h"

namespace qparity::gpu {

WeightOnlyIntMethod::WeightOnlyIntMethod(const reference::LinearMethod& host,
                                         const GpuMethodOptions& options, int64_t expert)
    : GpuLinearMethod(method_prefix(host, expert), host.config().scheme,
                      host.shape().out_features(), host.shape().in_features),
      fault_(options.fault_group_off_by_one) {
  const reference::ProcessedIntWeight w = processed_int_weight_of(host, expert);
  const MmaCodes kind = w.bits == 4 ? MmaCodes::kInt4 : MmaCodes::kInt8;
  const bool any_zero = std::any_of(w.zero.begin(), w.zero.end(), [](double z) { return z != 0; });
  if (expert >= 0 || (w.bits != 4 && w.bits != 8) ||
      !weight_only_mma_refusal(kind, in_features(), w.group, w.zero).empty()) {
    dev_ = upload_int_weight(w, out_features(), in_features(), prefix());
    return;
  }
  require_processed_shape(w.rows, w.cols, out_features(), in_features(), prefix());
  for (double s : w.scale)
    if (!std::isfinite(s) || !(s > 0))
      throw Error(prefix() + ".weight_scale",
                  "scale " + std::to_string(s) + " (must be finite > 0)");
  dev_.bits = w.bits;
  dev_.group = w.group;
  dev_.scale_bf16 = all_bf16_values(w.scale);
  mma_ = upload_mma_weight(
      pack_weight_only_mma(kind, out_features(), in_features(), w.group, w.stored, w.scale,
                           any_zero ? w.zero : std::vector<double>{}, dev_.scale_bf16, prefix()));
  if (!w.bias.empty()) dev_.bias = DeviceBuffer<float>(exact_f32(w.bias, prefix() + ".bias"));
  dev_.perm = DeviceBuffer<int32_t>(gather_columns_of(w.perm, in_features(), prefix()));
}

WeightOnlyIntMethod::WeightOnlyIntMethod(std::string prefix, SchemeId scheme, int64_t n, int64_t k,
                                         const Random& r)
    : GpuLinearMethod(std::move(prefix), std::move(scheme), n, k) {
  dev_.bits = r.bits;
  dev_.group = r.group;
  if (r.bits != 4 && r.bits != 8) throw Error(this->prefix(), "random weights: int4 / int8");
  dev_.scale_bf16 = true;
  if (r.tensor_cores) {
    const MmaCodes kind = r.bits == 4 ? MmaCodes::kInt4 : MmaCodes::kInt8;
    if (const std::string why = weight_only_mma_refusal(kind, k, r.group, {}); !why.empty())
      throw Error(this->prefix(), "random weights: " + why);
    mma_.codes = kind;
    mma_.n = n, mma_.k = k, mma_.group = r.group, mma_.scale_bf16 = true;
    // Random bf16 values' bytes (an even count: code bytes are whole 16-byte units).
    mma_.code_bytes =
        DeviceBuffer<uint8_t>(static_cast<size_t>(weight_only_mma_code_bytes(kind, n, k)));
    launch_fill_random_bf16(reinterpret_cast<__nv_bfloat16*>(mma_.code_bytes.get()),
                            static_cast<int64_t>(mma_.code_bytes.size() / 2), 0.f, 1.f, r.seed,
                            nullptr);
    mma_.scales_bf16 = DeviceBuffer<__nv_bfloat16>(
        static_cast<size_t>(weight_only_mma_scale_count(n, k, r.group)));
    launch_fill_random_bf16(mma_.scales_bf16.get(), static_cast<int64_t>(mma_.scales_bf16.size()),
                            r.scale, 0.f, r.seed + 1, nullptr);
    QPARITY_CUDA_CHECK(cudaDeviceSynchronize());
    return;
  }
  const int64_t c = weight_only_codes_per_load(r.bits);
  if (k % c != 0 || r.group % c != 0 || k % r.group != 0)
    throw Error(this->prefix(), "random weights: groups of a multiple of " + std::to_string(c) +
                                    " dividing in_features");
  // Codes: the bytes of random bf16 values (every byte is an int8 code, every nibble an int4 one).
  const size_t bytes = static_cast<size_t>(n * k * r.bits / 8);
  dev_.codes = DeviceBuffer<uint8_t>((bytes + 1) / 2 * 2);
  launch_fill_random_bf16(reinterpret_cast<__nv_bfloat16*>(dev_.codes.get()),
                          static_cast<int64_t>(dev_.codes.size() / 2), 0.f, 1.f, r.seed, nullptr);
  dev_.scales_bf16 = DeviceBuffer<__nv_bfloat16>(static_cast<size_t>(n * (k / r.group)));
  launch_fill_random_bf16(dev_.scales_bf16.get(), static_cast<int64_t>(dev_.scales_bf16.size()),
                          r.scale, 0.f, r.seed + 1, nullptr);
  QPARITY_CUDA_CHECK(cudaDeviceSynchronize());
}

size_t WeightOnlyIntMethod::workspace_bytes(int64_t max_tokens) const {
  return permuted() ? gathered_input_bytes(max_tokens, in_features()) : 0;
}

void WeightOnlyIntMethod::apply(const __nv_bfloat16* x, __nv_bfloat16* y, int64_t t,
                                cudaStream_t stream, void* workspace) const {
  const __nv_bfloat16* in =
      permuted() ? gather_input(x, dev_.perm.get(), t, in_features(), workspace, prefix(), stream)
                 : x;
  if (mma_.on()) {
    WeightOnlyMmaParams p = mma_.params(in, y, t, dev_.bias.get());
    p.fault_group_off_by_one = fault_;
    launch_weight_only_mma(p, stream);
    return;
  }
  WeightOnlyGemmParams p;
  p.x = in;
  p.w = dev_.codes.get();
  p.scales = dev_.scales();
  p.scale_bf16 = dev_.scale_bf16;
  p.zeros_f32 = dev_.zeros_f32.get();
  p.zeros_i8 = dev_.zeros_i8.get();
  p.bias = dev_.bias.get();
  p.y = y;
  p.m = t;
  p.n = out_features();
  p.k = in_features();
  p.group = dev_.group;
  p.bits = dev_.bits;
  p.fault_group_off_by_one = fault_;
  launch_weight_only_gemm(p, stream);
}

WeightOnlyExpert WeightOnlyIntMethod::device_view() const {
  if (mma_.on())
    throw Error(prefix(), "a dense layer in the tensor-core layout has no grouped-expert view");
  return {dev_.codes.get(), dev_.scales(), dev_.zeros_f32.get(), dev_.zeros_i8.get(),
          dev_.bias.get()};
}

size_t WeightOnlyIntMethod::device_bytes() const {
  return dev_.bytes() + mma_.bytes();
}

}  // namespace qparity::gpu
