#include "gpu_engine/quant/int_weight_upload.h"

#include <cmath>

#include "core/error.h"
#include "gpu_engine/kernels/weight_only_gemm.h"
#include "gpu_engine/quant/upload_util.h"

namespace qparity::gpu {

IntWeightOnDevice upload_int_weight(const reference::ProcessedIntWeight& w, int64_t n, int64_t k,
                                    const std::string& where, bool int8_zeros_only) {
  IntWeightOnDevice d;
  d.bits = w.bits;
  d.group = w.group;
  if (d.bits != 4 && d.bits != 8)
    throw Error(where, "int" + std::to_string(d.bits) +
                           " weights: the GPU's integer-weight kernels take 4 or 8 bits");
  require_processed_shape(w.rows, w.cols, n, k, where);
  const int64_t c = weight_only_codes_per_load(d.bits);
  if (w.cols % c != 0 || d.group % c != 0)
    throw Error(where, "in_features " + std::to_string(w.cols) + " and group " +
                           std::to_string(d.group) + " must be multiples of " + std::to_string(c) +
                           " for the GPU's int" + std::to_string(d.bits) + " kernels");
  // Codes.
  if (d.bits == 8) {
    std::vector<uint8_t> bytes(w.stored.size());
    for (size_t i = 0; i < bytes.size(); ++i)
      bytes[i] = static_cast<uint8_t>(w.stored[i]);
    d.codes = DeviceBuffer<uint8_t>(bytes);
  } else {
    std::vector<uint8_t> bytes(w.stored.size() / 2);
    for (size_t i = 0; i < bytes.size(); ++i) {
      const int lo = w.stored[2 * i] + 8, hi = w.stored[2 * i + 1] + 8;
      if (lo < 0 || lo > 15 || hi < 0 || hi > 15)
        throw Error(where, "int4 code outside [-8, 7] at element " + std::to_string(2 * i));
      bytes[i] = static_cast<uint8_t>(lo | (hi << 4));
    }
    d.codes = DeviceBuffer<uint8_t>(bytes);
  }
  // Scales: bf16 only where that is exact.
  for (double s : w.scale)
    if (!std::isfinite(s) || !(s > 0))
      throw Error(where + ".weight_scale", "scale " + std::to_string(s) + " (must be finite > 0)");
  d.scale_bf16 = all_bf16_values(w.scale);
  if (d.scale_bf16) {
    std::vector<__nv_bfloat16> s(w.scale.size());
    for (size_t i = 0; i < s.size(); ++i)
      s[i] = __float2bfloat16_rn(static_cast<float>(w.scale[i]));
    d.scales_bf16 = DeviceBuffer<__nv_bfloat16>(s);
  } else {
    d.scales_f32 = DeviceBuffer<float>(exact_f32(w.scale, where + ".weight_scale"));
  }
  // Zeros.
  bool any = false, small_ints = true;
  for (double z : w.zero) {
    any = any || z != 0.0;
    small_ints = small_ints && z == std::floor(z) && z >= -128 && z <= 127;
  }
  if (any && int8_zeros_only && !small_ints)
    throw Error(where, "zero points must be integers in [-128, 127] for the GPU's integer GEMM");
  if (any && (d.bits == 4 || int8_zeros_only) && small_ints) {
    std::vector<int8_t> z(w.zero.size());
    for (size_t i = 0; i < z.size(); ++i)
      z[i] = static_cast<int8_t>(w.zero[i]);
    d.zeros_i8 = DeviceBuffer<int8_t>(z);
  } else if (any) {
    d.zeros_f32 = DeviceBuffer<float>(exact_f32(w.zero, where + " zero points"));
  }
  // fp32 bias: the reference adds it in fp64; an F32 / BF16 bias is exact in fp32.
  if (!w.bias.empty()) d.bias = DeviceBuffer<float>(exact_f32(w.bias, where + ".bias"));
  d.perm = DeviceBuffer<int32_t>(gather_columns_of(w.perm, k, where));
  return d;
}

}  // namespace qparity::gpu
