#include "core/text/unicode_nfc.h"

#include <algorithm>
#include <cstdint>
#include <vector>

namespace qparity {

namespace {

struct CombiningClass {
  char32_t cp;
  uint8_t ccc;
};
struct Decomposition {
  char32_t cp;
  uint32_t offset, length;
};
struct Composition {
  char32_t first, second, composite;
};

#include "core/text/nfc_tables.inc"  // generated in the build tree (CMakeLists.txt)

// Hangul syllables (UAX #15, 3.12 of the standard).
constexpr char32_t kSBase = 0xAC00, kLBase = 0x1100, kVBase = 0x1161, kTBase = 0x11A7;
constexpr char32_t kLCount = 19, kVCount = 21, kTCount = 28, kNCount = kVCount * kTCount,
                   kSCount = kLCount * kNCount;

uint8_t ccc_of(char32_t c) {
  const auto it = std::lower_bound(std::begin(kCombiningClass), std::end(kCombiningClass), c,
                                   [](const CombiningClass& e, char32_t v) { return e.cp < v; });
  return it != std::end(kCombiningClass) && it->cp == c ? it->ccc : 0;
}

void decompose(char32_t c, std::u32string& out) {
  if (c >= kSBase && c < kSBase + kSCount) {
    const char32_t s = c - kSBase;
    out += kLBase + s / kNCount;
    out += kVBase + (s % kNCount) / kTCount;
    if (s % kTCount != 0) out += kTBase + s % kTCount;
    return;
  }
  const auto it = std::lower_bound(std::begin(kDecomposition), std::end(kDecomposition), c,
                                   [](const Decomposition& e, char32_t v) { return e.cp < v; });
  if (it != std::end(kDecomposition) && it->cp == c)
    out.append(kDecompositionData + it->offset, it->length);
  else
    out += c;
}

// The primary composite of (a, b), or 0.
char32_t compose(char32_t a, char32_t b) {
  if (a >= kLBase && a < kLBase + kLCount && b >= kVBase && b < kVBase + kVCount)
    return kSBase + ((a - kLBase) * kVCount + (b - kVBase)) * kTCount;
  if (a >= kSBase && a < kSBase + kSCount && (a - kSBase) % kTCount == 0 && b > kTBase &&
      b < kTBase + kTCount)
    return a + (b - kTBase);
  const auto it =
      std::lower_bound(std::begin(kComposition), std::end(kComposition), Composition{a, b, 0},
                       [](const Composition& x, const Composition& y) {
                         return x.first != y.first ? x.first < y.first : x.second < y.second;
                       });
  return it != std::end(kComposition) && it->first == a && it->second == b ? it->composite : 0;
}

std::u32string decode(std::string_view s) {
  std::u32string out;
  out.reserve(s.size());
  for (size_t i = 0; i < s.size();) {
    const auto b = static_cast<unsigned char>(s[i]);
    const int len = b < 0x80 ? 1 : (b & 0xE0) == 0xC0 ? 2 : (b & 0xF0) == 0xE0 ? 3 : 4;
    char32_t cp = len == 1 ? b : len == 2 ? (b & 0x1F) : len == 3 ? (b & 0x0F) : (b & 0x07);
    for (int j = 1; j < len; ++j)
      cp = (cp << 6) | (static_cast<unsigned char>(s[i + static_cast<size_t>(j)]) & 0x3F);
    out += cp;
    i += static_cast<size_t>(len);
  }
  return out;
}

}  // namespace

const char* nfc_unicode_version() {
  return kUnicodeVersion;
}

void append_utf8(char32_t c, std::string& out) {
  if (c < 0x80) {
    out += static_cast<char>(c);
  } else if (c < 0x800) {
    out += static_cast<char>(0xC0 | (c >> 6));
    out += static_cast<char>(0x80 | (c & 0x3F));
  } else if (c < 0x10000) {
    out += static_cast<char>(0xE0 | (c >> 12));
    out += static_cast<char>(0x80 | ((c >> 6) & 0x3F));
    out += static_cast<char>(0x80 | (c & 0x3F));
  } else {
    out += static_cast<char>(0xF0 | (c >> 18));
    out += static_cast<char>(0x80 | ((c >> 12) & 0x3F));
    out += static_cast<char>(0x80 | ((c >> 6) & 0x3F));
    out += static_cast<char>(0x80 | (c & 0x3F));
  }
}

std::string nfc(std::string_view utf8) {
  // Nothing below U+0300 decomposes or composes with what follows it unless a combining mark
  // follows; all-ASCII-and-Latin-1 text without marks is its own NFC.
  bool simple = true;
  for (const char ch : utf8)
    if (static_cast<unsigned char>(ch) >= 0xCC) {  // a lead byte of a code point >= U+0300
      simple = false;
      break;
    }
  if (simple) return std::string(utf8);
  std::u32string d;
  for (const char32_t c : decode(utf8))
    decompose(c, d);
  // Canonical ordering: each run of non-starters sorted by class, stably.
  for (size_t i = 0; i < d.size();) {
    if (ccc_of(d[i]) == 0) {
      ++i;
      continue;
    }
    size_t j = i;
    while (j < d.size() && ccc_of(d[j]) != 0)
      ++j;
    std::stable_sort(d.begin() + static_cast<std::ptrdiff_t>(i),
                     d.begin() + static_cast<std::ptrdiff_t>(j),
                     [](char32_t a, char32_t b) { return ccc_of(a) < ccc_of(b); });
    i = j;
  }
  // Canonical composition: a character joins the last starter unless blocked (a character
  // between them of class 0 or of a class >= its own).
  std::u32string out;
  out.reserve(d.size());
  std::ptrdiff_t starter = -1;
  uint8_t last = 0;  // class of the last character kept after the starter
  for (const char32_t c : d) {
    const uint8_t cc = ccc_of(c);
    if (starter >= 0) {
      const bool adjacent = static_cast<std::ptrdiff_t>(out.size()) == starter + 1;
      if (adjacent || (last != 0 && last < cc)) {
        const char32_t comp = compose(out[static_cast<size_t>(starter)], c);
        if (comp != 0) {
          out[static_cast<size_t>(starter)] = comp;
          continue;
        }
      }
    }
    if (cc == 0) {
      starter = static_cast<std::ptrdiff_t>(out.size());
      last = 0;
    } else {
      last = cc;
    }
    out += c;
  }
  std::string s;
  s.reserve(utf8.size());
  for (const char32_t c : out)
    append_utf8(c, s);
  return s;
}

}  // namespace qparity
