#include "schemes/method/host_tensor.h"

#include <algorithm>
#include <cmath>
#include <cstring>

#include "core/codecs/float_format.h"
#include "core/codecs/ue8m0.h"
#include "core/error.h"
#include "schemes/method/parallel.h"
#include "schemes/method/tensor_decode.h"

namespace qparity::reference {

namespace {

std::string elem(const std::string& where, size_t i) {
  return where + " element " + std::to_string(i);
}

template <typename T>
void put(std::vector<uint8_t>& out, size_t i, T v) {
  std::memcpy(out.data() + i * sizeof(T), &v, sizeof(T));
}

template <typename T>
T get(const uint8_t* p, size_t i) {
  T v;
  std::memcpy(&v, p + i * sizeof(T), sizeof(T));
  return v;
}

bool is_integer_dtype(DType d) {
  switch (d) {
    case DType::kU8:
    case DType::kI8:
    case DType::kI16:
    case DType::kU16:
    case DType::kI32:
    case DType::kU32:
    case DType::kI64:
    case DType::kU64:
    case DType::kBool:
      return true;
    default:
      return false;
  }
}

uint32_t float_code(const codec::FloatFormat& f, double v, Encoding mode, const std::string& where,
                    size_t i) {
  if (std::isnan(v)) throw Error(elem(where, i), "NaN cannot be stored");
  const uint32_t c = codec::encode(f, v, codec::Overflow::kNonSaturating);
  const double back = codec::decode(f, c);
  if (!std::isfinite(back) && std::isfinite(v))
    throw Error(elem(where, i), std::to_string(v) + " overflows " + std::string(f.name));
  if (mode == Encoding::kExact && back != v)
    throw Error(elem(where, i),
                std::to_string(v) + " is not exactly representable in " + std::string(f.name));
  return c;
}

}  // namespace

int64_t numel_of(std::span<const int64_t> shape) {
  int64_t n = 1;
  for (int64_t d : shape)
    n *= d;
  return n;
}
int64_t TensorView::numel() const {
  return numel_of(shape);
}
int64_t HostTensor::numel() const {
  return numel_of(shape);
}

std::string shape_string(std::span<const int64_t> shape) {
  std::string s = "[";
  for (size_t i = 0; i < shape.size(); ++i) {
    if (i) s += ", ";
    s += std::to_string(shape[i]);
  }
  return s + "]";
}

uint64_t storage_bytes(DType dtype, int64_t numel) {
  return (static_cast<uint64_t>(numel) * dtype_bits(dtype) + 7) / 8;
}

HostTensor encode(DType dtype, std::vector<int64_t> shape, std::span<const double> values,
                  Encoding mode, const std::string& where) {
  HostTensor t;
  t.dtype = dtype;
  t.shape = std::move(shape);
  const int64_t n = t.numel();
  if (static_cast<int64_t>(values.size()) != n)
    throw Error(where, std::to_string(values.size()) + " values for shape " +
                           shape_string(t.shape) + " (" + std::to_string(n) + " elements)");
  t.bytes.assign(storage_bytes(dtype, n), 0);
  if (is_integer_dtype(dtype)) {
    // Integral and exactly an int64 here; the dtype's range is encode_ints' check.
    std::vector<int64_t> ints(values.size());
    for (size_t i = 0; i < values.size(); ++i) {
      const double v = values[i];
      if (!(v == std::floor(v)) || std::fabs(v) > 9007199254740992.0)
        throw Error(elem(where, i), std::to_string(v) + " is not an integer (for " +
                                        std::string(dtype_name(dtype)) + ")");
      ints[i] = static_cast<int64_t>(v);
    }
    return encode_ints(dtype, t.shape, ints, where);
  }
  // In parallel chunks of element pairs (two F4 codes share a byte, so a chunk never splits
  // one); every element is encoded alone, so the bytes do not depend on the thread count, and an
  // error is the lowest failing element's (parallel_chunks rethrows the lowest chunk's).
  const int64_t pairs = (n + 1) / 2;
  parallel_chunks(pairs, 64 * pairs, [&](int64_t p0, int64_t p1) {
    for (size_t i = static_cast<size_t>(2 * p0); i < static_cast<size_t>(std::min(n, 2 * p1));
         ++i) {
      const double v = values[i];
      switch (dtype) {
        case DType::kF64:
          put<double>(t.bytes, i, v);
          break;
        case DType::kF32: {
          if (std::isnan(v)) throw Error(elem(where, i), "NaN cannot be stored");
          const float f = static_cast<float>(v);
          if (std::isinf(f) && std::isfinite(v))
            throw Error(elem(where, i), std::to_string(v) + " overflows F32");
          if (mode == Encoding::kExact && static_cast<double>(f) != v)
            throw Error(elem(where, i), std::to_string(v) + " is not exactly representable in F32");
          put<float>(t.bytes, i, f);
          break;
        }
        case DType::kBF16:
          put<uint16_t>(t.bytes, i,
                        static_cast<uint16_t>(float_code(codec::kBF16, v, mode, where, i)));
          break;
        case DType::kF16:
          put<uint16_t>(t.bytes, i,
                        static_cast<uint16_t>(float_code(codec::kFP16, v, mode, where, i)));
          break;
        case DType::kF8E4M3:
          t.bytes[i] = static_cast<uint8_t>(float_code(codec::kE4M3FN, v, mode, where, i));
          break;
        case DType::kF8E5M2:
          t.bytes[i] = static_cast<uint8_t>(float_code(codec::kE5M2, v, mode, where, i));
          break;
        case DType::kF4: {
          const uint32_t c = float_code(codec::kE2M1, v, mode, where, i);
          t.bytes[i / 2] = static_cast<uint8_t>(t.bytes[i / 2] | (c << ((i % 2) * 4)));
          break;
        }
        case DType::kF8E8M0: {
          const uint8_t c = codec::double_to_ue8m0(v, codec::Ue8m0Rounding::kTowardZero,
                                                   codec::Overflow::kNonSaturating);
          if (c == codec::kUe8m0Nan || codec::ue8m0_to_double(c) != v)
            throw Error(elem(where, i),
                        std::to_string(v) + " is not a power of two in [2^-127, 2^127] (F8_E8M0)");
          t.bytes[i] = c;
          break;
        }
        default:
          throw Error(where, "cannot encode values as " + std::string(dtype_name(dtype)));
      }
    }
  });
  return t;
}

HostTensor encode_ints(DType dtype, std::vector<int64_t> shape, std::span<const int64_t> values,
                       const std::string& where) {
  HostTensor t;
  t.dtype = dtype;
  t.shape = std::move(shape);
  const int64_t n = t.numel();
  if (static_cast<int64_t>(values.size()) != n)
    throw Error(where, std::to_string(values.size()) + " values for shape " +
                           shape_string(t.shape) + " (" + std::to_string(n) + " elements)");
  t.bytes.assign(storage_bytes(dtype, n), 0);
  auto check = [&](size_t i, int64_t lo, int64_t hi) {
    if (values[i] < lo || values[i] > hi)
      throw Error(elem(where, i), std::to_string(values[i]) + " is not an integer in [" +
                                      std::to_string(lo) + ", " + std::to_string(hi) + "] for " +
                                      std::string(dtype_name(dtype)));
  };
  for (size_t i = 0; i < values.size(); ++i) {
    switch (dtype) {
      case DType::kU8:
        check(i, 0, 255);
        t.bytes[i] = static_cast<uint8_t>(values[i]);
        break;
      case DType::kBool:
        check(i, 0, 1);
        t.bytes[i] = static_cast<uint8_t>(values[i]);
        break;
      case DType::kI8:
        check(i, -128, 127);
        t.bytes[i] = static_cast<uint8_t>(static_cast<int8_t>(values[i]));
        break;
      case DType::kI16:
        check(i, -32768, 32767);
        put<int16_t>(t.bytes, i, static_cast<int16_t>(values[i]));
        break;
      case DType::kU16:
        check(i, 0, 65535);
        put<uint16_t>(t.bytes, i, static_cast<uint16_t>(values[i]));
        break;
      case DType::kI32:
        check(i, INT32_MIN, INT32_MAX);
        put<int32_t>(t.bytes, i, static_cast<int32_t>(values[i]));
        break;
      case DType::kU32:
        check(i, 0, UINT32_MAX);
        put<uint32_t>(t.bytes, i, static_cast<uint32_t>(values[i]));
        break;
      case DType::kI64:
        put<int64_t>(t.bytes, i, values[i]);
        break;
      case DType::kU64:
        check(i, 0, INT64_MAX);
        put<uint64_t>(t.bytes, i, static_cast<uint64_t>(values[i]));
        break;
      default:
        throw Error(where, std::string(dtype_name(dtype)) + " is not an integer dtype");
    }
  }
  return t;
}

std::vector<double> decode(const TensorView& t, const std::string& where) {
  const int64_t n = t.numel();
  if (t.bytes.size() != storage_bytes(t.dtype, n))
    throw Error(where, std::to_string(t.bytes.size()) + " bytes for " +
                           std::string(dtype_name(t.dtype)) + " " + shape_string(t.shape));
  return decode_all(t.dtype, t.bytes, static_cast<uint64_t>(n), where);
}

std::vector<int64_t> decode_ints(const TensorView& t, const std::string& where) {
  const int64_t n = t.numel();
  if (t.bytes.size() != storage_bytes(t.dtype, n))
    throw Error(where, std::to_string(t.bytes.size()) + " bytes for " +
                           std::string(dtype_name(t.dtype)) + " " + shape_string(t.shape));
  std::vector<int64_t> out(static_cast<size_t>(n));
  const uint8_t* p = t.bytes.data();
  for (size_t i = 0; i < out.size(); ++i) {
    switch (t.dtype) {
      case DType::kU8:
      case DType::kBool:
        out[i] = p[i];
        break;
      case DType::kI8:
        out[i] = static_cast<int8_t>(p[i]);
        break;
      case DType::kI16:
        out[i] = get<int16_t>(p, i);
        break;
      case DType::kU16:
        out[i] = get<uint16_t>(p, i);
        break;
      case DType::kI32:
        out[i] = get<int32_t>(p, i);
        break;
      case DType::kU32:
        out[i] = get<uint32_t>(p, i);
        break;
      case DType::kI64:
        out[i] = get<int64_t>(p, i);
        break;
      default:
        throw Error(
            where, std::string(dtype_name(t.dtype)) + " is not an integer dtype this reader takes");
    }
  }
  return out;
}

const HostTensor& tensor_in(const TensorMap& m, const std::string& name, const std::string& where) {
  const auto it = m.find(name);
  if (it == m.end()) throw Error(where + "." + name, "missing");
  return it->second;
}

void require_dtype(const TensorView& t, std::span<const DType> allowed, const std::string& where) {
  for (DType d : allowed)
    if (d == t.dtype) return;
  std::string names;
  for (DType d : allowed)
    names += (names.empty() ? "" : " or ") + std::string(dtype_name(d));
  throw Error(where,
              "dtype " + std::string(dtype_name(t.dtype)) + " where the scheme expects " + names);
}

void require_shape(const TensorView& t, std::span<const int64_t> shape, const std::string& where) {
  if (t.shape.size() == shape.size() && std::equal(shape.begin(), shape.end(), t.shape.begin()))
    return;
  throw Error(
      where, "shape " + shape_string(t.shape) + " where the scheme expects " + shape_string(shape));
}

}  // namespace qparity::reference
