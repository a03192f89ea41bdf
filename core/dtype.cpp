#include "core/dtype.h"

namespace qparity {

std::string_view dtype_name(DType t) {
  switch (t) {
    case DType::kBool:
      return "BOOL";
    case DType::kF4:
      return "F4";
    case DType::kF6E2M3:
      return "F6_E2M3";
    case DType::kF6E3M2:
      return "F6_E3M2";
    case DType::kU8:
      return "U8";
    case DType::kI8:
      return "I8";
    case DType::kF8E5M2:
      return "F8_E5M2";
    case DType::kF8E4M3:
      return "F8_E4M3";
    case DType::kF8E8M0:
      return "F8_E8M0";
    case DType::kI16:
      return "I16";
    case DType::kU16:
      return "U16";
    case DType::kF16:
      return "F16";
    case DType::kBF16:
      return "BF16";
    case DType::kI32:
      return "I32";
    case DType::kU32:
      return "U32";
    case DType::kF32:
      return "F32";
    case DType::kC64:
      return "C64";
    case DType::kF64:
      return "F64";
    case DType::kI64:
      return "I64";
    case DType::kU64:
      return "U64";
  }
  return "?";
}

std::optional<DType> dtype_from_name(std::string_view name) {
  for (DType t : kAllDTypes) {
    if (dtype_name(t) == name) return t;
  }
  return std::nullopt;
}

unsigned dtype_bits(DType t) {
  switch (t) {
    case DType::kF4:
      return 4;
    case DType::kF6E2M3:
    case DType::kF6E3M2:
      return 6;
    case DType::kBool:
    case DType::kU8:
    case DType::kI8:
    case DType::kF8E5M2:
    case DType::kF8E4M3:
    case DType::kF8E8M0:
      return 8;
    case DType::kI16:
    case DType::kU16:
    case DType::kF16:
    case DType::kBF16:
      return 16;
    case DType::kI32:
    case DType::kU32:
    case DType::kF32:
      return 32;
    case DType::kC64:
    case DType::kF64:
    case DType::kI64:
    case DType::kU64:
      return 64;
  }
  return 0;
}

}  // namespace qparity
