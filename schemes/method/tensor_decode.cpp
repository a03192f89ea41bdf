#include "schemes/method/tensor_decode.h"

#include <algorithm>
#include <array>
#include <cmath>
#include <cstring>

#include "core/codecs/float_format.h"
#include "core/codecs/ue8m0.h"
#include "core/error.h"
#include "schemes/math/simd_kernels.h"

namespace qparity::reference {

namespace {

template <typename T>
T load(const uint8_t* p) {
  T v;
  std::memcpy(&v, p, sizeof(T));  // data may be unaligned for T
  return v;
}

double decode_one(DType dtype, const uint8_t* base, uint64_t i, const std::string& where) {
  using namespace codec;
  switch (dtype) {
    case DType::kBool:
      return base[i] ? 1.0 : 0.0;
    case DType::kF4:
      return e2m1_to_double(static_cast<uint8_t>((base[i / 2] >> ((i % 2) * 4)) & 0xF));
    case DType::kU8:
      return base[i];
    case DType::kI8:
      return static_cast<int8_t>(base[i]);
    case DType::kF8E5M2:
      return e5m2_to_double(base[i]);
    case DType::kF8E4M3:
      return e4m3fn_to_double(base[i]);
    case DType::kF8E8M0:
      return ue8m0_to_double(base[i]);
    case DType::kI16:
      return load<int16_t>(base + 2 * i);
    case DType::kU16:
      return load<uint16_t>(base + 2 * i);
    case DType::kF16:
      return fp16_to_double(load<uint16_t>(base + 2 * i));
    case DType::kBF16:
      return bf16_to_double(load<uint16_t>(base + 2 * i));
    case DType::kI32:
      return load<int32_t>(base + 4 * i);
    case DType::kU32:
      return load<uint32_t>(base + 4 * i);
    case DType::kF32:
      return load<float>(base + 4 * i);
    case DType::kF64:
      return load<double>(base + 8 * i);
    case DType::kI64: {
      const auto v = load<int64_t>(base + 8 * i);
      if (v > (int64_t{1} << 53) || v < -(int64_t{1} << 53))
        throw Error(where, "I64 element " + std::to_string(i) + " = " + std::to_string(v) +
                               " is not exactly representable in fp64");
      return static_cast<double>(v);
    }
    case DType::kU64: {
      const auto v = load<uint64_t>(base + 8 * i);
      if (v > (uint64_t{1} << 53))
        throw Error(where,
                    "U64 element " + std::to_string(i) + " is not exactly representable in fp64");
      return static_cast<double>(v);
    }
    case DType::kF6E2M3:
    case DType::kF6E3M2:
    case DType::kC64:
      throw Error(where, "dtype " + std::string(dtype_name(dtype)) + " has no fp64 decoder");
  }
  throw Error(where, "unknown dtype");
}

}  // namespace

void decode_to_double(DType dtype, std::span<const uint8_t> bytes, uint64_t first,
                      std::span<double> out, const std::string& where) {
  const uint64_t bits = dtype_bits(dtype);
  const uint64_t last = first + out.size();
  if (last < first || (last * bits + 7) / 8 > bytes.size())
    throw Error(where, "element range [" + std::to_string(first) + ", " + std::to_string(last) +
                           ") is outside the tensor's " + std::to_string(bytes.size()) + " bytes");
  // bf16 and fp32 without the general decoder (the reference's hot path: every weight row of an
  // unquantized linear, at every call): a bf16 code is the top half of an fp32, and fp32 widens
  // to fp64 exactly, so the values are decode()'s, NaN aside (any NaN stays a NaN).
  if (dtype == DType::kBF16) {
    kernels::widen_bf16()(bytes.data() + 2 * first, out.data(), static_cast<int64_t>(out.size()));
    return;
  }
  if (dtype == DType::kF32) {
    const uint8_t* p = bytes.data() + 4 * first;
    for (uint64_t i = 0; i < out.size(); ++i) {
      float f;
      std::memcpy(&f, p + 4 * i, 4);
      out[i] = static_cast<double>(f);
    }
    return;
  }
  // One-byte float codes (fp8 weights, E8M0 scales: 218 M of them in one 8B-shaped layer) through
  // a table of decode_one's own 256 values, built once per dtype, so every value (NaN included)
  // is decode_one's.
  if (dtype == DType::kF8E4M3 || dtype == DType::kF8E5M2 || dtype == DType::kF8E8M0) {
    const auto table_of = [](DType d) {
      std::array<double, 256> t{};
      for (int b = 0; b < 256; ++b) {
        const auto byte = static_cast<uint8_t>(b);
        t[static_cast<size_t>(b)] = decode_one(d, &byte, 0, "");
      }
      return t;
    };
    static const std::array<double, 256> e4m3 = table_of(DType::kF8E4M3),
                                         e5m2 = table_of(DType::kF8E5M2),
                                         e8m0 = table_of(DType::kF8E8M0);
    const std::array<double, 256>& t = dtype == DType::kF8E4M3   ? e4m3
                                       : dtype == DType::kF8E5M2 ? e5m2
                                                                 : e8m0;
    const uint8_t* p = bytes.data() + first;
    for (uint64_t i = 0; i < out.size(); ++i)
      out[i] = t[p[i]];
    return;
  }
  for (uint64_t i = 0; i < out.size(); ++i)
    out[i] = decode_one(dtype, bytes.data(), first + i, where);
}

std::vector<double> decode_all(DType dtype, std::span<const uint8_t> bytes, uint64_t numel,
                               const std::string& where) {
  std::vector<double> out(numel);
  decode_to_double(dtype, bytes, 0, out, where);
  return out;
}

TensorStats tensor_stats(DType dtype, std::span<const uint8_t> bytes, uint64_t numel,
                         const std::string& where) {
  TensorStats s;
  s.count = numel;
  constexpr uint64_t kTile = 4096;
  std::vector<double> tile(kTile);
  double sum = 0, sumsq = 0;
  uint64_t finite = 0;
  s.min = INFINITY;
  s.max = -INFINITY;
  for (uint64_t start = 0; start < numel; start += kTile) {
    const uint64_t n = std::min(kTile, numel - start);
    decode_to_double(dtype, bytes, start, std::span<double>(tile.data(), n), where);
    for (uint64_t i = 0; i < n; ++i) {
      const double v = tile[i];
      if (!std::isfinite(v)) {
        (std::isnan(v) ? s.nan_count : s.inf_count)++;
        if (s.first_nonfinite < 0) s.first_nonfinite = static_cast<int64_t>(start + i);
        continue;
      }
      ++finite;
      s.min = std::min(s.min, v);
      s.max = std::max(s.max, v);
      sum += v;
      sumsq += v * v;
    }
  }
  if (finite == 0) {
    s.min = s.max = 0;
  } else {
    s.absmax = std::max(std::fabs(s.min), std::fabs(s.max));
    s.mean = sum / static_cast<double>(finite);
    s.rms = std::sqrt(sumsq / static_cast<double>(finite));
  }
  return s;
}

void require_finite_elements(DType dtype, std::span<const uint8_t> bytes, uint64_t numel,
                             const std::string& where) {
  constexpr uint64_t kChunk = 1 << 16;
  std::vector<double> buf(static_cast<size_t>(std::min(numel, kChunk)));
  for (uint64_t first = 0; first < numel; first += kChunk) {
    const std::span<double> out(buf.data(), static_cast<size_t>(std::min(kChunk, numel - first)));
    decode_to_double(dtype, bytes, first, out, where);
    for (size_t i = 0; i < out.size(); ++i)
      if (!std::isfinite(out[i]))
        throw Error(where, std::string(std::isnan(out[i]) ? "NaN" : "Inf") + " at element " +
                               std::to_string(first + i) + " (inputs must be finite)");
  }
}

}  // namespace qparity::reference
