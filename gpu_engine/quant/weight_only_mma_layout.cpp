#include "gpu_engine/quant/weight_only_mma_layout.h"

#include <cuda_bf16.h>

#include <cmath>
#include <cstring>

#include "core/error.h"

namespace qparity::gpu {

namespace {

const char* name_of(MmaCodes c) {
  switch (c) {
    case MmaCodes::kInt4:
      return "int4";
    case MmaCodes::kInt8:
      return "int8";
    case MmaCodes::kE4m3:
      return "e4m3";
  }
  return "?";
}

}  // namespace

std::string weight_only_mma_refusal(MmaCodes codes, int64_t k, int64_t group,
                                    const std::vector<double>& zeros) {
  if (k % 16 != 0) return "in_features " + std::to_string(k) + " is not a multiple of 16";
  if (group <= 0 || group % 16 != 0 || k % group != 0)
    return "group " + std::to_string(group) + " is not a multiple of 16 dividing " +
           std::to_string(k);
  const double lo = codes == MmaCodes::kInt4 ? -8 : -128, hi = codes == MmaCodes::kInt4 ? 7 : 127;
  for (double z : zeros) {
    if (z == 0.0) continue;
    if (codes == MmaCodes::kE4m3) return "e4m3 codes take no zero points";
    if (z != std::floor(z) || z < lo || z > hi)
      return "zero point " + std::to_string(z) + " is not an integer in [" + std::to_string(lo) +
             ", " + std::to_string(hi) + "]";
  }
  return {};
}

MmaPackedWeight pack_weight_only_mma(MmaCodes codes, int64_t n, int64_t k, int64_t group,
                                     const std::vector<int8_t>& q,
                                     const std::vector<double>& scales,
                                     const std::vector<double>& zeros, bool scale_bf16,
                                     const std::string& where) {
  if (n <= 0) throw Error(where, "out_features must be > 0");
  if (const std::string why = weight_only_mma_refusal(codes, k, group, zeros); !why.empty())
    throw Error(where, std::string("the tensor-core ") + name_of(codes) + " kernel: " + why);
  const int64_t groups = k / group;
  if (static_cast<int64_t>(q.size()) != n * k)
    throw Error(where, "codes: " + std::to_string(q.size()) + " values for [" + std::to_string(n) +
                           ", " + std::to_string(k) + "]");
  if (static_cast<int64_t>(scales.size()) != n * groups ||
      (!zeros.empty() && zeros.size() != scales.size()))
    throw Error(where, "scales / zeros: " + std::to_string(scales.size()) + " / " +
                           std::to_string(zeros.size()) + " values for [" + std::to_string(n) +
                           ", " + std::to_string(groups) + "]");
  if (codes == MmaCodes::kInt4)
    for (size_t i = 0; i < q.size(); ++i)
      if (q[i] < -8 || q[i] > 7)
        throw Error(where, "int4 code " + std::to_string(q[i]) + " outside [-8, 7] at element " +
                               std::to_string(i));
  MmaPackedWeight p;
  p.codes = codes, p.n = n, p.k = k, p.group = group, p.scale_bf16 = scale_bf16;
  const int64_t rows = weight_only_mma_rows(n), tiles = rows / 16;
  const int64_t chunk = weight_only_mma_chunk(codes), chunks = (k + chunk - 1) / chunk;
  p.code_bytes.assign(static_cast<size_t>(weight_only_mma_code_bytes(codes, n, k)), 0);
  // The code at (row, col) as the byte or nibble the kernel expands; padding is code 0.
  const auto code_at = [&](int64_t row, int64_t col) -> uint32_t {
    if (row >= n || col >= k) return codes == MmaCodes::kInt4 ? 8u : 0u;
    const int8_t v = q[static_cast<size_t>(row * k + col)];
    return codes == MmaCodes::kInt4 ? static_cast<uint32_t>(v + 8) : static_cast<uint8_t>(v);
  };
  const int steps = static_cast<int>(chunk / 16);
  for (int64_t t = 0; t < tiles; ++t)
    for (int64_t c0 = 0; c0 < chunks; ++c0)
      for (int lane = 0; lane < 32; ++lane) {
        const int64_t r = t * 16 + lane / 4;
        const int c = lane % 4;
        uint32_t words[4] = {0, 0, 0, 0};
        for (int s = 0; s < steps; ++s) {
          const int64_t col = c0 * chunk + 16 * s + 4 * c;
          if (codes == MmaCodes::kInt4) {
            // Pair j: row r + 8 (j % 2), columns col + 2 (j / 2) and + 1, in nibbles j and j + 4.
            for (int j = 0; j < 4; ++j) {
              const int64_t row = r + 8 * (j % 2), cc = col + 2 * (j / 2);
              words[s] |= code_at(row, cc) << (4 * j);
              words[s] |= code_at(row, cc + 1) << (4 * (j + 4));
            }
          } else {
            // Word 2s: (r, col), (r, col + 1), (r + 8, col), (r + 8, col + 1); word 2s + 1 the
            // same at col + 2.
            for (int h = 0; h < 2; ++h)
              for (int b = 0; b < 4; ++b)
                words[2 * s + h] |= code_at(r + 8 * (b / 2), col + 2 * h + b % 2) << (8 * b);
          }
        }
        std::memcpy(p.code_bytes.data() + ((t * chunks + c0) * 32 + lane) * 16, words, 16);
      }
  const size_t count = static_cast<size_t>(weight_only_mma_scale_count(n, k, group));
  const auto packed_index = [&](int64_t row, int64_t g) {
    return static_cast<size_t>(((row / 16) * groups + g) * 16 + row % 16);
  };
  if (scale_bf16)
    p.scales_bf16.assign(count, __float2bfloat16_rn(0.f));
  else
    p.scales_f32.assign(count, 0.f);
  if (!zeros.empty()) p.zeros.assign(count, 0);
  for (int64_t row = 0; row < n; ++row)
    for (int64_t g = 0; g < groups; ++g) {
      const size_t from = static_cast<size_t>(row * groups + g), to = packed_index(row, g);
      const double s = scales[from];
      const float f = static_cast<float>(s);
      if (!std::isfinite(s) || static_cast<double>(f) != s)
        throw Error(where + ".weight_scale", "scale " + std::to_string(s) + " at row " +
                                                 std::to_string(row) +
                                                 " is not a finite fp32 value");
      if (scale_bf16) {
        const __nv_bfloat16 b = __float2bfloat16_rn(f);
        if (static_cast<double>(__bfloat162float(b)) != s)
          throw Error(where + ".weight_scale", "scale " + std::to_string(s) + " at row " +
                                                   std::to_string(row) + " is not a bf16 value");
        p.scales_bf16[to] = b;
      } else {
        p.scales_f32[to] = f;
      }
      if (!zeros.empty()) p.zeros[to] = static_cast<int8_t>(zeros[from]);
    }
  return p;
}

MmaWeightOnDevice upload_mma_weight(const MmaPackedWeight& p) {
  MmaWeightOnDevice d;
  d.codes = p.codes, d.n = p.n, d.k = p.k, d.group = p.group, d.scale_bf16 = p.scale_bf16;
  d.code_bytes = DeviceBuffer<uint8_t>(p.code_bytes);
  if (p.scale_bf16)
    d.scales_bf16 = DeviceBuffer<__nv_bfloat16>(p.scales_bf16);
  else
    d.scales_f32 = DeviceBuffer<float>(p.scales_f32);
  if (!p.zeros.empty()) d.zeros = DeviceBuffer<int8_t>(p.zeros);
  return d;
}

WeightOnlyMmaParams MmaWeightOnDevice::params(const __nv_bfloat16* x, __nv_bfloat16* y, int64_t m,
                                              const float* bias) const {
  WeightOnlyMmaParams p;
  p.x = x, p.y = y, p.m = m, p.bias = bias;
  p.w = code_bytes.get();
  p.scale_bf16 = scale_bf16;
  p.scales = scale_bf16 ? static_cast<const void*>(scales_bf16.get())
                        : static_cast<const void*>(scales_f32.get());
  p.zeros = zeros.size() ? zeros.get() : nullptr;
  p.n = n, p.k = k, p.group = group, p.codes = codes;
  return p;
}

}  // namespace qparity::gpu
