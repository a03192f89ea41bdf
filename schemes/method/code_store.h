#pragma once
// Integer codes kept in as few bits as they need, so that a loaded model's quantized weights cost
// about what the checkpoint stores (ARCHITECTURE.md: memory about the checkpoint size), while the
// GEMMs still see exact int64 codes, one decoded row at a time.
//
// pack() picks the narrowest of:
//   offset-4 / offset-8: every code is base + u with u in [0, 16) / [0, 256) (int4, int8, e2m1 on
//                        a small range; one or two bytes per two / one codes);
//   table-4 / table-8:   at most 16 / 256 distinct codes, stored as indices into a table (fp8
//                        e4m3 lattice codes span +-229376 but take at most 253 values; e2m1 15);
//   int16 / int32 / int64 by range.
// Decoding is exact: the stored form is a bijection of the codes it was built from.
#include <cstdint>
#include <span>
#include <vector>

namespace qparity::reference {

class CodeStore {
 public:
  enum class Kind : uint8_t {
    kEmpty,
    kOffset4,
    kOffset8,
    kTable4,
    kTable8,
    kInt16,
    kInt32,
    kInt64
  };

  CodeStore() = default;
  static CodeStore pack(std::span<const int64_t> codes);

  int64_t size() const { return size_; }
  Kind kind() const { return kind_; }
  // The smallest and largest code held (0 when empty).
  int64_t min_code() const { return lo_; }
  int64_t max_code() const { return hi_; }
  int64_t at(int64_t i) const;
  // codes [begin, begin + out.size()) into out.
  void decode(int64_t begin, std::span<int64_t> out) const;
  // The same codes as doubles (exact: a store whose codes reach 2^53 in magnitude is an Error), in
  // one pass and without an int64 detour: the products' hot path (a weight row's block per call).
  void decode_as_doubles(int64_t begin, std::span<double> out) const;
  std::vector<int64_t> decode_all() const;
  // Heap bytes held (payload and table).
  size_t bytes() const {
    return data_.capacity() + table_.capacity() * sizeof(int64_t) +
           dtable_.capacity() * sizeof(double);
  }

 private:
  Kind kind_ = Kind::kEmpty;
  int64_t size_ = 0;
  int64_t base_ = 0;            // offset kinds
  int64_t lo_ = 0, hi_ = 0;     // range of the codes
  std::vector<int64_t> table_;  // table kinds: index -> code
  std::vector<double> dtable_;  // the same codes as doubles (every table code is below 2^53)
  std::vector<uint8_t> data_;   // little-endian payload; 4-bit kinds low nibble first
};

const char* code_store_kind_name(CodeStore::Kind k);

}  // namespace qparity::reference
