#include "schemes/method/code_store.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <iterator>
#include <limits>
#include <string>

#include "core/error.h"
#include "schemes/method/parallel.h"

namespace qparity::reference {

namespace {

size_t sz(int64_t v) {
  return static_cast<size_t>(v);
}

// The chunks of a parallel pass over n codes: one per thread, at least 65536 codes each (what
// a chunk computes never depends on how many there are: see the callers).
int64_t chunk_count(int64_t n) {
  return std::max<int64_t>(1, std::min<int64_t>(reference_threads(), n / 65536));
}

// The distinct values of `codes`, sorted, or empty when there are more than `limit`. Chunks in
// parallel, each its own sorted set, then their union: the same set whatever the thread count.
std::vector<int64_t> distinct_up_to(std::span<const int64_t> codes, size_t limit) {
  const auto one = [limit](std::span<const int64_t> part, std::vector<int64_t>& seen) {
    for (int64_t c : part) {  // sorted; small, so insertion by binary search is cheap
      const auto it = std::lower_bound(seen.begin(), seen.end(), c);
      if (it != seen.end() && *it == c) continue;
      if (seen.size() == limit) return false;
      seen.insert(it, c);
    }
    return true;
  };
  const int64_t n = static_cast<int64_t>(codes.size());
  const int64_t parts = chunk_count(n);
  std::vector<std::vector<int64_t>> seen(static_cast<size_t>(parts));
  std::vector<char> fits(static_cast<size_t>(parts), 1);
  parallel_chunks(parts, n, [&](int64_t p0, int64_t p1) {
    for (int64_t p = p0; p < p1; ++p)
      fits[static_cast<size_t>(p)] =
          one(codes.subspan(static_cast<size_t>(n * p / parts),
                            static_cast<size_t>(n * (p + 1) / parts - n * p / parts)),
              seen[static_cast<size_t>(p)]);
  });
  std::vector<int64_t> all;
  for (int64_t p = 0; p < parts; ++p) {
    if (!fits[static_cast<size_t>(p)]) return {};
    std::vector<int64_t> merged;
    std::set_union(all.begin(), all.end(), seen[static_cast<size_t>(p)].begin(),
                   seen[static_cast<size_t>(p)].end(), std::back_inserter(merged));
    if (merged.size() > limit) return {};
    all.swap(merged);
  }
  return all;
}

template <typename T>
void store_fixed(std::span<const int64_t> codes, std::vector<uint8_t>& out) {
  out.resize(codes.size() * sizeof(T));
  const auto n = static_cast<int64_t>(codes.size());
  parallel_chunks(n, n, [&](int64_t b, int64_t e) {
    for (int64_t i = b; i < e; ++i) {
      const T v = static_cast<T>(codes[static_cast<size_t>(i)]);
      std::memcpy(out.data() + i * static_cast<int64_t>(sizeof(T)), &v, sizeof(T));
    }
  });
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
  const auto n = static_cast<int64_t>(codes.size());
  // min and max per chunk, then of those: exact whatever the thread count.
  const int64_t parts = chunk_count(n);
  std::vector<int64_t> los(static_cast<size_t>(parts)), his(static_cast<size_t>(parts));
  parallel_chunks(parts, n, [&](int64_t p0, int64_t p1) {
    for (int64_t p = p0; p < p1; ++p) {
      const auto [a, b] =
          std::minmax_element(codes.begin() + n * p / parts, codes.begin() + n * (p + 1) / parts);
      los[static_cast<size_t>(p)] = *a;
      his[static_cast<size_t>(p)] = *b;
    }
  });
  const int64_t lo = *std::min_element(los.begin(), los.end());
  const int64_t hi = *std::max_element(his.begin(), his.end());
  s.lo_ = lo;
  s.hi_ = hi;
  // hi - lo in unsigned arithmetic: the span of int64 codes can exceed INT64_MAX.
  const uint64_t range = static_cast<uint64_t>(hi) - static_cast<uint64_t>(lo);
  // Each output byte is written by one chunk (pack4: a chunk owns whole byte pairs).
  const auto pack4 = [&](auto index_of) {
    s.data_.assign((codes.size() + 1) / 2, 0);
    const auto bytes = static_cast<int64_t>(s.data_.size());
    parallel_chunks(bytes, n, [&](int64_t b, int64_t e) {
      for (int64_t i = 2 * b; i < std::min(2 * e, n); ++i)
        s.data_[static_cast<size_t>(i / 2)] |=
            static_cast<uint8_t>(index_of(codes[static_cast<size_t>(i)]) << (4 * (i % 2)));
    });
  };
  const auto pack8 = [&](auto index_of) {
    s.data_.resize(codes.size());
    parallel_chunks(n, n, [&](int64_t b, int64_t e) {
      for (int64_t i = b; i < e; ++i)
        s.data_[static_cast<size_t>(i)] =
            static_cast<uint8_t>(index_of(codes[static_cast<size_t>(i)]));
    });
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
    s.dtable_.assign(table.begin(), table.end());
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
    s.dtable_.assign(table.begin(), table.end());
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

void CodeStore::decode_as_doubles(int64_t begin, std::span<double> out) const {
  const auto n = static_cast<int64_t>(out.size());
  if (begin < 0 || begin + n > size_)
    throw Error("CodeStore", "range [" + std::to_string(begin) + ", " + std::to_string(begin + n) +
                                 ") outside [0, " + std::to_string(size_) + ")");
  if (!(std::fabs(static_cast<double>(lo_)) < 0x1p53 &&
        std::fabs(static_cast<double>(hi_)) < 0x1p53))
    throw Error("CodeStore", "codes in [" + std::to_string(lo_) + ", " + std::to_string(hi_) +
                                 "] have no exact double value");
  const uint8_t* d = data_.data();
  const auto base = static_cast<double>(base_);
  // Two codes per byte, low nibble first; an odd start or end takes its one nibble alone.
  const auto nibbles = [&](const auto& value) {
    int64_t j = 0, i = begin;
    if (i % 2 != 0 && j < n) out[sz(j++)] = value(d[sz(i++ / 2)] >> 4);
    for (; j + 2 <= n; j += 2, i += 2) {
      const uint8_t b = d[sz(i / 2)];
      out[sz(j)] = value(b & 0xF);
      out[sz(j + 1)] = value(b >> 4);
    }
    if (j < n) out[sz(j)] = value(d[sz(i / 2)] & 0xF);
  };
  switch (kind_) {
    case Kind::kEmpty:
      return;
    case Kind::kOffset4:
      nibbles([&](unsigned u) { return base + static_cast<double>(u); });
      return;
    case Kind::kTable4:
      nibbles([&](unsigned u) { return dtable_[u]; });
      return;
    case Kind::kOffset8:
      for (int64_t j = 0; j < n; ++j)
        out[sz(j)] = base + static_cast<double>(d[sz(begin + j)]);
      return;
    case Kind::kTable8:
      for (int64_t j = 0; j < n; ++j)
        out[sz(j)] = dtable_[d[sz(begin + j)]];
      return;
    case Kind::kInt16:
      for (int64_t j = 0; j < n; ++j)
        out[sz(j)] = static_cast<double>(load_fixed<int16_t>(data_, begin + j));
      return;
    case Kind::kInt32:
      for (int64_t j = 0; j < n; ++j)
        out[sz(j)] = static_cast<double>(load_fixed<int32_t>(data_, begin + j));
      return;
    case Kind::kInt64:
      for (int64_t j = 0; j < n; ++j)
        out[sz(j)] = static_cast<double>(load_fixed<int64_t>(data_, begin + j));
      return;
  }
}

std::vector<int64_t> CodeStore::decode_all() const {
  std::vector<int64_t> out(sz(size_));
  decode(0, out);
  return out;
}

}  // namespace qparity::reference
