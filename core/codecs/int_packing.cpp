#include "core/codecs/int_packing.h"

#include "core/error.h"

namespace qparity::codec {

namespace {
void check_bits(int bits, const std::string& where) {
  if (bits < 1 || bits > 8)
    throw Error(where, "packed integer width must be 1..8 bits, got " + std::to_string(bits));
}
std::string idx(size_t i) {
  return "element " + std::to_string(i);
}
}  // namespace

std::vector<uint8_t> pack_nibbles(std::span<const uint8_t> nibbles, const std::string& where) {
  if (nibbles.size() % 2 != 0)
    throw Error(
        where, "nibble packing needs an even element count, got " + std::to_string(nibbles.size()));
  std::vector<uint8_t> out(nibbles.size() / 2);
  for (size_t i = 0; i < nibbles.size(); ++i) {
    if (nibbles[i] > 0xF) throw Error(where, idx(i) + " does not fit in 4 bits");
    out[i / 2] |= static_cast<uint8_t>(nibbles[i] << ((i % 2) * 4));
  }
  return out;
}

std::vector<uint8_t> unpack_nibbles(std::span<const uint8_t> bytes, size_t count,
                                    const std::string& where) {
  if (bytes.size() * 2 != count)
    throw Error(where, std::to_string(bytes.size()) + " packed bytes cannot hold " +
                           std::to_string(count) + " nibbles (need count/2 bytes, count even)");
  std::vector<uint8_t> out(count);
  for (size_t i = 0; i < count; ++i)
    out[i] = (bytes[i / 2] >> ((i % 2) * 4)) & 0xF;
  return out;
}

uint8_t int4_to_nibble(int q) {
  if (q < -8 || q > 7) throw Error("", "int4 value " + std::to_string(q) + " outside [-8, 7]");
  return static_cast<uint8_t>(q & 0xF);
}
int nibble_to_int4(uint8_t nibble) {
  return (nibble & 0x8) ? int(nibble & 0xF) - 16 : int(nibble & 0xF);
}
uint8_t int4_to_uint4b8(int q) {
  if (q < -8 || q > 7) throw Error("", "int4 value " + std::to_string(q) + " outside [-8, 7]");
  return static_cast<uint8_t>(q + 8);
}
int uint4b8_to_int4(uint8_t nibble) {
  return int(nibble & 0xF) - 8;
}

std::vector<int8_t> pack_int4_row_pairs(std::span<const int8_t> q, size_t rows, size_t cols,
                                        const std::string& where) {
  if (rows % 2 != 0)
    throw Error(where,
                "int4 pairs along the rows need an even row count, got " + std::to_string(rows));
  if (q.size() != rows * cols)
    throw Error(where, std::to_string(q.size()) + " codes for a [" + std::to_string(rows) + ", " +
                           std::to_string(cols) + "] matrix");
  std::vector<int8_t> out(rows / 2 * cols);
  for (size_t i = 0; i < q.size(); ++i)
    if (q[i] < -8 || q[i] > 7)
      throw Error(where, idx(i) + " = " + std::to_string(q[i]) + " is outside int4 [-8, 7]");
  for (size_t j = 0; j < rows / 2; ++j)
    for (size_t c = 0; c < cols; ++c) {
      const auto lo = static_cast<uint8_t>(q[(2 * j) * cols + c] & 0xF);
      const auto hi = static_cast<uint8_t>(q[(2 * j + 1) * cols + c] & 0xF);
      out[j * cols + c] = static_cast<int8_t>(static_cast<uint8_t>(lo | (hi << 4)));
    }
  return out;
}

std::vector<int8_t> unpack_int4_row_pairs(std::span<const int8_t> bytes, size_t rows, size_t cols,
                                          const std::string& where) {
  if (rows % 2 != 0 || bytes.size() != rows / 2 * cols)
    throw Error(where, std::to_string(bytes.size()) + " packed bytes cannot hold a [" +
                           std::to_string(rows) + ", " + std::to_string(cols) +
                           "] int4 matrix (need [rows/2, cols], rows even)");
  std::vector<int8_t> out(rows * cols);
  for (size_t j = 0; j < rows / 2; ++j)
    for (size_t c = 0; c < cols; ++c) {
      const auto b = static_cast<uint8_t>(bytes[j * cols + c]);
      out[(2 * j) * cols + c] = static_cast<int8_t>(nibble_to_int4(b & 0xF));
      out[(2 * j + 1) * cols + c] = static_cast<int8_t>(nibble_to_int4(b >> 4));
    }
  return out;
}

size_t ct_packed_len(size_t count, int bits, CtPackLayout layout) {
  check_bits(bits, "");
  const auto b = static_cast<size_t>(bits);
  if (layout == CtPackLayout::kDenseStream) return (count * b + 31) / 32;
  const size_t per_word = 32 / b;
  return (count + per_word - 1) / per_word;
}

namespace {
// Bit position of element i in the word stream.
size_t bit_position(size_t i, size_t b, CtPackLayout layout) {
  if (layout == CtPackLayout::kDenseStream) return i * b;
  const size_t per_word = 32 / b;
  return (i / per_word) * 32 + (i % per_word) * b;
}
}  // namespace

std::vector<int32_t> ct_pack(std::span<const int8_t> values, int bits, CtPackLayout layout,
                             const std::string& where) {
  check_bits(bits, where);
  const auto b = static_cast<size_t>(bits);
  const int lo = -(1 << (bits - 1));
  const int hi = (1 << (bits - 1)) - 1;
  std::vector<uint32_t> words(ct_packed_len(values.size(), bits, layout), 0u);
  for (size_t i = 0; i < values.size(); ++i) {
    const int q = values[i];
    if (q < lo || q > hi)
      throw Error(where, idx(i) + " = " + std::to_string(q) + " outside the " +
                             std::to_string(bits) + "-bit range [" + std::to_string(lo) + ", " +
                             std::to_string(hi) + "]");
    const uint64_t u = static_cast<uint64_t>(q - lo);  // q + 2^(b-1)
    const size_t pos = bit_position(i, b, layout);
    // A value may straddle two words in the dense stream: write through a 64-bit window.
    const uint64_t shifted = u << (pos % 32);
    words[pos / 32] |= static_cast<uint32_t>(shifted);
    if ((shifted >> 32) != 0) words[pos / 32 + 1] |= static_cast<uint32_t>(shifted >> 32);
  }
  std::vector<int32_t> out(words.size());
  for (size_t i = 0; i < words.size(); ++i)
    out[i] = static_cast<int32_t>(words[i]);
  return out;
}

std::vector<int8_t> ct_unpack(std::span<const int32_t> words, size_t count, int bits,
                              CtPackLayout layout, const std::string& where) {
  check_bits(bits, where);
  const auto b = static_cast<size_t>(bits);
  const size_t need = ct_packed_len(count, bits, layout);
  if (words.size() != need)
    throw Error(where, std::to_string(words.size()) + " int32 words, but " + std::to_string(count) +
                           " " + std::to_string(bits) + "-bit values need " + std::to_string(need) +
                           (layout == CtPackLayout::kDenseStream ? " (dense stream layout)"
                                                                 : " (per-word layout)"));
  const uint64_t mask = (uint64_t{1} << b) - 1;
  const int lo = -(1 << (bits - 1));
  std::vector<int8_t> out(count);
  std::vector<uint32_t> used(words.size(), 0u);  // bits consumed, to check the padding
  for (size_t i = 0; i < count; ++i) {
    const size_t pos = bit_position(i, b, layout);
    const size_t w = pos / 32;
    uint64_t window = static_cast<uint32_t>(words[w]);
    if (w + 1 < words.size()) window |= uint64_t{static_cast<uint32_t>(words[w + 1])} << 32;
    const uint64_t u = (window >> (pos % 32)) & mask;
    const uint64_t m = mask << (pos % 32);
    used[w] |= static_cast<uint32_t>(m);
    if ((m >> 32) != 0) used[w + 1] |= static_cast<uint32_t>(m >> 32);
    out[i] = static_cast<int8_t>(static_cast<int>(u) + lo);
  }
  for (size_t w = 0; w < words.size(); ++w) {
    if ((static_cast<uint32_t>(words[w]) & ~used[w]) != 0)
      throw Error(where, "int32 word " + std::to_string(w) +
                             " has bits set outside any packed value (wrong layout, bit width "
                             "or element count?)");
  }
  return out;
}

}  // namespace qparity::codec
