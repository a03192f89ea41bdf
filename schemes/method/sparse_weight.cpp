#include "schemes/method/sparse_weight.h"

#include <algorithm>
#include <bit>
#include <cstring>

#include "core/error.h"

namespace qparity::reference {

namespace {

constexpr std::string_view k24 = "sparse-24-bitmask";
constexpr std::string_view kBitmask = "sparse-bitmask";

bool signed_zero_is_zero(DType d) {
  switch (d) {
    case DType::kF8E4M3:
    case DType::kF8E5M2:
    case DType::kF16:
    case DType::kBF16:
    case DType::kF32:
    case DType::kF64:
      return true;
    default:
      return false;
  }
}

// Element bytes of a dtype the compressors handle (whole bytes; the `weight` tensors they see
// are never sub-byte).
size_t element_bytes(DType d, const std::string& where) {
  const unsigned bits = dtype_bits(d);
  if (bits == 0 || bits % 8 != 0 || d == DType::kBool || d == DType::kF8E8M0)
    throw Error(where, "a sparse-compressed weight of dtype " + std::string(dtype_name(d)) +
                           " is not a format any compressor writes");
  return bits / 8;
}

// The element is zero as the compressors see it (torch `!= 0`: both signed zeros of a float).
bool is_zero(const uint8_t* e, size_t bytes, bool float_sign) {
  for (size_t i = 0; i < bytes; ++i) {
    uint8_t b = e[i];
    if (float_sign && i + 1 == bytes) b &= 0x7f;  // little-endian: the sign is the top byte's bit
    if (b != 0) return false;
  }
  return true;
}

const TensorView& part(const std::map<std::string, TensorView>& parts, const std::string& name,
                       const std::string& where) {
  const auto it = parts.find(name);
  if (it == parts.end()) throw Error(where + "." + name, "missing");
  return it->second;
}

}  // namespace

const std::vector<std::string>& sparse_weight_parts(std::string_view format) {
  static const std::vector<std::string> p24 = {"shape", "compressed", "bitmask"};
  static const std::vector<std::string> pbm = {"shape", "compressed", "bitmask", "row_offsets"};
  if (format == k24) return p24;
  if (format == kBitmask) return pbm;
  throw Error("sparsity format '" + std::string(format) + "'",
              "not a bitmask format (sparse-24-bitmask, sparse-bitmask)");
}

HostTensor decompress_sparse_weight(std::string_view format,
                                    const std::map<std::string, TensorView>& parts,
                                    const std::string& where) {
  const bool two_four = format == k24;
  sparse_weight_parts(format);  // validates the format
  for (const auto& [name, t] : parts) {
    const auto& names = sparse_weight_parts(format);
    if (std::find(names.begin(), names.end(), name) == names.end())
      throw Error(where + "." + name, "not a tensor of the " + std::string(format) + " format");
  }
  const TensorView& shape_t = part(parts, "shape", where);
  const TensorView& values = part(parts, "compressed", where);
  const TensorView& mask = part(parts, "bitmask", where);
  const std::string ws = where + ".shape", wv = where + ".compressed", wm = where + ".bitmask";

  // The dense shape: torch.tensor(shape) (int64), reshaped to [2, 1] by sparse-24-bitmask.
  if (shape_t.dtype != DType::kI64 && shape_t.dtype != DType::kI32)
    throw Error(ws, "expected an integer tensor, got " + std::string(dtype_name(shape_t.dtype)));
  if (shape_t.numel() != 2)
    throw Error(ws, "expected the 2 dimensions of the dense weight, got shape " +
                        shape_string(shape_t.shape));
  const std::vector<int64_t> dims = decode_ints(shape_t, ws);
  const int64_t n = dims[0], k = dims[1];
  if (n <= 0 || k <= 0)
    throw Error(
        ws, "dense shape [" + std::to_string(n) + ", " + std::to_string(k) + "] is not a weight's");
  if (two_four && k % 4 != 0)
    throw Error(ws, "sparse-24-bitmask needs in_features divisible by 4, got " + std::to_string(k));

  const size_t eb = element_bytes(values.dtype, wv);
  const bool fsign = signed_zero_is_zero(values.dtype);
  const int64_t row_bytes = (k + 7) / 8;
  if (mask.dtype != DType::kU8 && mask.dtype != DType::kI8 && mask.dtype != DType::kBool)
    throw Error(wm, "expected U8 packed bits, got " + std::string(dtype_name(mask.dtype)));
  if (mask.shape != std::vector<int64_t>{n, row_bytes})
    throw Error(wm, "expected shape [" + std::to_string(n) + ", " + std::to_string(row_bytes) +
                        "] for a dense [" + std::to_string(n) + ", " + std::to_string(k) +
                        "] weight, got " + shape_string(mask.shape));
  auto bit = [&](int64_t r, int64_t c) {
    return (mask.bytes[static_cast<size_t>(r * row_bytes + c / 8)] >> (c % 8)) & 1;
  };

  int64_t set = 0;
  std::vector<int64_t> row_set(static_cast<size_t>(n), 0);
  for (int64_t r = 0; r < n; ++r)
    for (int64_t c = 0; c < k; ++c)
      row_set[static_cast<size_t>(r)] += bit(r, c);
  for (int64_t v : row_set)
    set += v;

  if (two_four) {
    if (values.shape != std::vector<int64_t>{n, k / 2})
      throw Error(wv, "expected shape [" + std::to_string(n) + ", " + std::to_string(k / 2) +
                          "] (2 of every 4 weights), got " + shape_string(values.shape));
    for (int64_t r = 0; r < n; ++r)
      for (int64_t g = 0; g < k; g += 4) {
        const int c = bit(r, g) + bit(r, g + 1) + bit(r, g + 2) + bit(r, g + 3);
        if (c != 2)
          throw Error(wm, "row " + std::to_string(r) + ", columns " + std::to_string(g) + ".." +
                              std::to_string(g + 3) + ": " + std::to_string(c) +
                              " bits set; 2:4 sparsity keeps exactly 2 of every 4");
      }
  } else {
    if (values.shape.size() != 1 || values.shape[0] != set)
      throw Error(wv, "expected a 1-D tensor of the " + std::to_string(set) +
                          " elements the bitmask marks, got shape " + shape_string(values.shape));
    const std::string wr = where + ".row_offsets";
    const TensorView& offs = part(parts, "row_offsets", where);
    if (offs.shape != std::vector<int64_t>{n})
      throw Error(wr,
                  "expected shape [" + std::to_string(n) + "], got " + shape_string(offs.shape));
    const std::vector<int64_t> o = decode_ints(offs, wr);
    int64_t at = 0;
    for (int64_t r = 0; r < n; ++r) {
      if (o[static_cast<size_t>(r)] != at)
        throw Error(wr, "row " + std::to_string(r) + " starts at " +
                            std::to_string(o[static_cast<size_t>(r)]) +
                            " but the bitmask puts it at " + std::to_string(at));
      at += row_set[static_cast<size_t>(r)];
    }
  }
  if (values.bytes.size() != static_cast<size_t>(set) * eb)
    throw Error(wv, "byte size does not match dtype and shape");

  HostTensor out;
  out.dtype = values.dtype;
  out.shape = {n, k};
  out.bytes.assign(static_cast<size_t>(n * k) * eb, 0);
  size_t next = 0;
  for (int64_t r = 0; r < n; ++r)
    for (int64_t c = 0; c < k; ++c)
      if (bit(r, c)) {
        std::memcpy(out.bytes.data() + static_cast<size_t>(r * k + c) * eb,
                    values.bytes.data() + next * eb, eb);
        ++next;
      }
  // sparse-bitmask stores only nonzero elements: a stored zero means the file was not written
  // by its compressor (torch `tensor != 0`), and its mask cannot be trusted.
  if (!two_four)
    for (size_t i = 0; i < next; ++i)
      if (is_zero(values.bytes.data() + i * eb, eb, fsign))
        throw Error(wv, "element " + std::to_string(i) +
                            " is zero; sparse-bitmask stores only the nonzero elements");
  return out;
}

TensorMap compress_sparse_weight(std::string_view format, const TensorView& dense,
                                 const std::string& where) {
  const bool two_four = format == k24;
  sparse_weight_parts(format);
  if (dense.shape.size() != 2)
    throw Error(where, "a sparse weight must be 2-D, got " + shape_string(dense.shape));
  const int64_t n = dense.shape[0], k = dense.shape[1];
  if (two_four && k % 4 != 0)
    throw Error(where,
                "sparse-24-bitmask needs in_features divisible by 4, got " + std::to_string(k));
  const size_t eb = element_bytes(dense.dtype, where);
  const bool fsign = signed_zero_is_zero(dense.dtype);
  const int64_t row_bytes = (k + 7) / 8;
  std::vector<uint8_t> mask(static_cast<size_t>(n * row_bytes), 0);
  std::vector<uint8_t> kept;
  std::vector<int64_t> offsets;
  auto elem = [&](int64_t r, int64_t c) {
    return dense.bytes.data() + static_cast<size_t>(r * k + c) * eb;
  };
  auto keep = [&](int64_t r, int64_t c) {
    mask[static_cast<size_t>(r * row_bytes + c / 8)] |= static_cast<uint8_t>(1u << (c % 8));
    kept.insert(kept.end(), elem(r, c), elem(r, c) + eb);
  };
  int64_t count = 0;
  for (int64_t r = 0; r < n; ++r) {
    offsets.push_back(count);
    for (int64_t g = 0; g < k; g += two_four ? 4 : k) {
      const int64_t end = two_four ? g + 4 : k;
      std::vector<bool> on(static_cast<size_t>(end - g));
      int nz = 0;
      for (int64_t c = g; c < end; ++c)
        if (!is_zero(elem(r, c), eb, fsign)) {
          on[static_cast<size_t>(c - g)] = true;
          ++nz;
        }
      if (two_four) {
        if (nz > 2)
          throw Error(where, "row " + std::to_string(r) + ", columns " + std::to_string(g) + ".." +
                                 std::to_string(g + 3) + " hold " + std::to_string(nz) +
                                 " nonzero weights; 2:4 sparsity keeps 2 (prune first)");
        for (int64_t c = g; c < end && nz < 2; ++c)
          if (!on[static_cast<size_t>(c - g)]) {
            on[static_cast<size_t>(c - g)] = true;
            ++nz;
          }
      }
      for (int64_t c = g; c < end; ++c)
        if (on[static_cast<size_t>(c - g)]) {
          keep(r, c);
          ++count;
        }
    }
  }
  TensorMap out;
  HostTensor values;
  values.dtype = dense.dtype;
  values.shape = two_four ? std::vector<int64_t>{n, k / 2} : std::vector<int64_t>{count};
  values.bytes = std::move(kept);
  out["compressed"] = std::move(values);
  HostTensor m;
  m.dtype = DType::kU8;
  m.shape = {n, row_bytes};
  m.bytes = std::move(mask);
  out["bitmask"] = std::move(m);
  out["shape"] =
      encode_ints(DType::kI64, two_four ? std::vector<int64_t>{2, 1} : std::vector<int64_t>{2},
                  std::vector<int64_t>{n, k}, where + ".shape");
  if (!two_four)
    out["row_offsets"] = encode_ints(DType::kI64, {n}, offsets, where + ".row_offsets");
  return out;
}

}  // namespace qparity::reference
