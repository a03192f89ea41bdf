#include "schemes/method/code_store.h"

#include <algorithm>
#include <cstring>
#include <limits>
#include <string>

#include "core/error.h"

namespace qparity::reference {

namespace {

size_t sz(int64_t v) {
  return static_cast<size_t>(v);
}

// The distinct values of `codes`, sorted, or empty when there are more than `limit`.
std::vector<int64_t> distinct_up_to(std::span<const int64_t> codes, size_t limit) {
  std::vector<int64_t> seen;  // sorted; small, so insertion by binary search is cheap
  for (int64_t c : codes) {
    const auto it = std::lower_bound(seen.begin(), seen.end(), c);
    if (it != seen.end() && *it == c) continue;
    if (seen.size() == limit) return {};
    seen.insert(it, c);
  }
  return seen;
}

template <typename T>
void store_fixed(std::span<const int64_t> codes, std::vector<uint8_t>& out) {
  out.resize(codes.size() * sizeof(T));
  for (size_t i = 0; i < codes.size(); ++i) {
    const T v = static_cast<T>(codes[i]);
    std::memcpy(out.data() + i * sizeof(T), &v, sizeof(T));
  }
}

template <typename T>
int64_t load_fixed(const std::vector<uint8_t>& data, int64_t i) {
  T v;
  std::memcpy(&v, data.data() + sz(i) * sizeof(T), sizeof(T));
  return static_cast<int64_t>(v);
}

}  // namespace

const char* code_store_kind_name(CodeStore::Kind k) {
  switch (k) {
    case CodeStore::Kind::kEmpty:
      return "empty";
    case CodeStore::Kind::kOffset4:
      return "offset-4";
    case CodeStore::Kind::kOffset8:
      return "offset-8";
    case CodeStore::Kind::kTable4:
      return "table-4";
    case CodeStore::Kind::kTable8:
      return "table-8";
    case CodeStore::Kind::kInt16:
      return "int16";
    case CodeStore::Kind::kInt32:
      return "int32";
    case CodeStore::Kind::kInt64:
      return "int64";
  }
  return "?";
}

CodeStore CodeStore::pack(std::span<const int64_t> codes) {
  CodeStore s;
  s.size_ = static_cast<int64_t>(codes.size());
  if (codes.empty()) return s;
  const auto [lo_it, hi_it] = std::minmax_element(codes.begin(), codes.end());
  const int64_t lo = *lo_it, hi = *hi_it;
  s.lo_ = lo;
  s.hi_ = hi;
  // hi - lo in unsigned arithmetic: the span of int64 codes can exceed INT64_MAX.
  const uint64_t range = static_cast<uint64_t>(hi) - static_cast<uint64_t>(lo);
  const auto pack4 = [&](auto index_of) {
    s.data_.assign((codes.size() + 1) / 2, 0);
    for (size_t i = 0; i < codes.size(); ++i)
      s.data_[i / 2] |= static_cast<uint8_t>(index_of(codes[i]) << (4 * (i % 2)));
  };
  const auto pack8 = [&](auto index_of) {
    s.data_.resize(codes.size());
    for (size_t i = 0; i < codes.size(); ++i)
      s.data_[i] = static_cast<uint8_t>(index_of(codes[i]));
  };
  if (range < 16) {
    s.kind_ = Kind::kOffset4;
    s.base_ = lo;
    pack4([&](int64_t c) { return static_cast<uint64_t>(c) - static_cast<uint64_t>(lo); });
    return s;
  }
  const auto table = distinct_up_to(codes, 256);
  if (!table.empty() && table.size() <= 16) {
    s.kind_ = Kind::kTable4;
    s.table_ = table;
    pack4(
        [&](int64_t c) { return std::lower_bound(table.begin(), table.end(), c) - table.begin(); });
    return s;
  }
  if (range < 256) {
    s.kind_ = Kind::kOffset8;
    s.base_ = lo;
    pack8([&](int64_t c) { return static_cast<uint64_t>(c) - static_cast<uint64_t>(lo); });
    return s;
  }
  if (!table.empty()) {
    s.kind_ = Kind::kTable8;
    s.table_ = table;
    pack8(
        [&](int64_t c) { return std::lower_bound(table.begin(), table.end(), c) - table.begin(); });
    return s;
  }
  if (lo >= std::numeric_limits<int16_t>::min() && hi <= std::numeric_limits<int16_t>::max()) {
    s.kind_ = Kind::kInt16;
    store_fixed<int16_t>(codes, s.data_);
  } else if (lo >= std::numeric_limits<int32_t>::min() &&
             hi <= std::numeric_limits<int32_t>::max()) {
    s.kind_ = Kind::kInt32;
    store_fixed<int32_t>(codes, s.data_);
  } else {
    s.kind_ = Kind::kInt64;
    store_fixed<int64_t>(codes, s.data_);
  }
  return s;
}

int64_t CodeStore::at(int64_t i) const {
  if (i < 0 || i >= size_)
    throw Error("CodeStore",
                "index " + std::to_string(i) + " outside [0, " + std::to_string(size_) + ")");
  int64_t one = 0;
  decode(i, std::span<int64_t>(&one, 1));
  return one;
}

void CodeStore::decode(int64_t begin, std::span<int64_t> out) const {
  const auto n = static_cast<int64_t>(out.size());
  if (begin < 0 || begin + n > size_)
    throw Error("CodeStore", "range [" + std::to_string(begin) + ", " + std::to_string(begin + n) +
                                 ") outside [0, " + std::to_string(size_) + ")");
  const auto nibble = [&](int64_t i) { return (data_[sz(i / 2)] >> (4 * (i % 2))) & 0xF; };
  switch (kind_) {
    case Kind::kEmpty:
      return;
    case Kind::kOffset4:
      for (int64_t j = 0; j < n; ++j)
        out[sz(j)] = base_ + nibble(begin + j);
      return;
    case Kind::kTable4:
      for (int64_t j = 0; j < n; ++j)
        out[sz(j)] = table_[sz(nibble(begin + j))];
      return;
    case Kind::kOffset8:
      for (int64_t j = 0; j < n; ++j)
        out[sz(j)] = base_ + data_[sz(begin + j)];
      return;
    case Kind::kTable8:
      for (int64_t j = 0; j < n; ++j)
        out[sz(j)] = table_[data_[sz(begin + j)]];
      return;
    case Kind::kInt16:
      for (int64_t j = 0; j < n; ++j)
        out[sz(j)] = load_fixed<int16_t>(data_, begin + j);
      return;
    case Kind::kInt32:
      for (int64_t j = 0; j < n; ++j)
        out[sz(j)] = load_fixed<int32_t>(data_, begin + j);
      return;
    case Kind::kInt64:
      for (int64_t j = 0; j < n; ++j)
        out[sz(j)] = load_fixed<int64_t>(data_, begin + j);
      return;
  }
}

std::vector<int64_t> CodeStore::decode_all() const {
  std::vector<int64_t> out(sz(size_));
  decode(0, out);
  return out;
}

}  // namespace qparity::reference
