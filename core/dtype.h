#pragma once
// The element types a safetensors file can declare, in the format's own order (which is also
// the writer's sort order: larger alignment first). Sub-byte types count bits, not bytes.
#include <cstdint>
#include <optional>
#include <string_view>

namespace qparity {

enum class DType : uint8_t {
  kBool,
  kF4,      // float4_e2m1, two per byte, low nibble first
  kF6E2M3,  // float6 types: defined by the format, no codec here yet
  kF6E3M2,
  kU8,
  kI8,
  kF8E5M2,
  kF8E4M3,  // e4m3fn (torch.float8_e4m3fn)
  kF8E8M0,  // ue8m0 (torch.float8_e8m0fnu)
  kI16,
  kU16,
  kF16,
  kBF16,
  kI32,
  kU32,
  kF32,
  kC64,
  kF64,
  kI64,
  kU64,
};

inline constexpr DType kAllDTypes[] = {DType::kBool,   DType::kF4,  DType::kF6E2M3, DType::kF6E3M2,
                                       DType::kU8,     DType::kI8,  DType::kF8E5M2, DType::kF8E4M3,
                                       DType::kF8E8M0, DType::kI16, DType::kU16,    DType::kF16,
                                       DType::kBF16,   DType::kI32, DType::kU32,    DType::kF32,
                                       DType::kC64,    DType::kF64, DType::kI64,    DType::kU64};

// The name used in safetensors headers ("BF16", "F8_E4M3", ...).
std::string_view dtype_name(DType t);
// Inverse of dtype_name; nullopt for an unknown name.
std::optional<DType> dtype_from_name(std::string_view name);
// Storage size of one element in bits (4 for F4, 6 for the F6 types).
unsigned dtype_bits(DType t);

}  // namespace qparity
