#pragma once
// Checkpoint tensors as the reference handles them: in their checkpoint dtype and layout, as raw
// little-endian bytes (HostTensor owns them, TensorView borrows them, e.g. from an mmap). A
// scheme's `quantize` returns a TensorMap of HostTensors named as the producer names them
// relative to the module ("weight", "weight_scale", ...); its LinearMethod loads TensorViews.
#include <cstdint>
#include <map>
#include <span>
#include <string>
#include <vector>

#include "core/dtype.h"

namespace qparity::reference {

struct TensorView {
  DType dtype = DType::kF32;
  std::vector<int64_t> shape;
  std::span<const uint8_t> bytes;
  int64_t numel() const;
};

struct HostTensor {
  DType dtype = DType::kF32;
  std::vector<int64_t> shape;
  std::vector<uint8_t> bytes;
  int64_t numel() const;
  TensorView view() const { return {dtype, shape, bytes}; }
};

using TensorMap = std::map<std::string, HostTensor>;

// "[4, 128]"
std::string shape_string(std::span<const int64_t> shape);
int64_t numel_of(std::span<const int64_t> shape);
// Bytes that `numel` elements of `dtype` occupy (sub-byte types round up to whole bytes).
uint64_t storage_bytes(DType dtype, int64_t numel);

// How encode() treats a value the dtype cannot hold exactly.
enum class Encoding : uint8_t {
  kExact,    // codes: must be representable (integers in range, fp8/fp4 grid points); else Error
  kNearest,  // floats only: round to nearest even once (storing an fp64 scale as F32/BF16/F16)
};

// Encodes `values` into a tensor of `dtype` and `shape` (values.size() == numel). Integer dtypes
// take integral values in range; F4 packs nibbles (low nibble = even element); F8_E8M0 takes
// powers of two 2^-127..2^127. Errors name `where` and the first offending element.
HostTensor encode(DType dtype, std::vector<int64_t> shape, std::span<const double> values,
                  Encoding mode, const std::string& where);
// Convenience for integer tensors (I8/U8/I16/I32/I64 and U16/U32).
HostTensor encode_ints(DType dtype, std::vector<int64_t> shape, std::span<const int64_t> values,
                       const std::string& where);

// Exact fp64 values of every element (see tensor_decode.h for the per-dtype rules).
std::vector<double> decode(const TensorView& t, const std::string& where);
// Raw integers of an integer tensor (I8/U8/I16/U16/I32/U32/I64), without the 2^53 limit.
std::vector<int64_t> decode_ints(const TensorView& t, const std::string& where);

// The tensor `name` of a quantize() result; "<where>.<name>: missing" when absent.
const HostTensor& tensor_in(const TensorMap& m, const std::string& name, const std::string& where);

// Checks dtype and shape; the error names `where`, the expected and the found values.
void require_dtype(const TensorView& t, std::span<const DType> allowed, const std::string& where);
void require_shape(const TensorView& t, std::span<const int64_t> shape, const std::string& where);

}  // namespace qparity::reference
