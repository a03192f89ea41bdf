// NFC (core/text/unicode_nfc.h) against the Unicode standard's own conformance test,
// NormalizationTest.txt from Debian's unicode-data (decompressed at configure time): for every
// line c1;c2;c3;c4;c5, NFC(c1) = NFC(c2) = NFC(c3) = c2 and NFC(c4) = NFC(c5) = c4, over the lines
// whose characters were all assigned by Unicode 9.0 (the tables' version: HF tokenizers' NFC);
// characters assigned later are left as they are; and every code point not listed in part 1 is
// its own NFC.
#include <gtest/gtest.h>

#include <fstream>
#include <set>
#include <sstream>

#include "core/text/unicode_nfc.h"

namespace qparity {
namespace {

std::string utf8_of(const std::string& hex_list) {
  std::string out;
  std::istringstream in(hex_list);
  std::string h;
  // Written out here rather than append_utf8: the test's strings do not depend on the code
  // under test.
  while (in >> h) {
    const auto c = static_cast<char32_t>(std::stoul(h, nullptr, 16));
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
  return out;
}

// Code points assigned after Unicode 9.0 (DerivedAge.txt).
std::set<char32_t> assigned_after_9() {
  std::ifstream f(std::string(QPARITY_UCD_DIR) + "/DerivedAge.txt");
  std::set<char32_t> late;
  std::string line;
  while (std::getline(f, line)) {
    line = line.substr(0, line.find('#'));
    const size_t semi = line.find(';');
    if (semi == std::string::npos) continue;
    const std::string range = line.substr(0, semi);
    const double age = std::stod(line.substr(semi + 1));
    if (age <= 9.0) continue;
    const size_t dots = range.find("..");
    const auto lo = static_cast<char32_t>(std::stoul(range.substr(0, dots), nullptr, 16));
    const auto hi = dots == std::string::npos
                        ? lo
                        : static_cast<char32_t>(std::stoul(range.substr(dots + 2), nullptr, 16));
    for (char32_t c = lo; c <= hi; ++c)
      late.insert(c);
  }
  return late;
}

TEST(UnicodeNfc, PassesTheStandardsConformanceTest) {
  const std::set<char32_t> late = assigned_after_9();
  ASSERT_GT(late.size(), 10000u);
  int skipped = 0;
  std::ifstream f(QPARITY_NORMALIZATION_TEST);
  ASSERT_TRUE(f) << QPARITY_NORMALIZATION_TEST;
  std::string line;
  int part = -1, lines = 0, failures = 0;
  std::set<char32_t> listed;
  while (std::getline(f, line)) {
    if (line.starts_with("@Part")) {
      part = line[5] - '0';
      continue;
    }
    if (line.empty() || line[0] == '#') continue;
    std::vector<std::string> c;
    std::istringstream fields(line);
    for (std::string x; c.size() < 5 && std::getline(fields, x, ';');)
      c.push_back(x);
    ASSERT_EQ(c.size(), 5u) << line;
    if (part == 1) listed.insert(static_cast<char32_t>(std::stoul(c[0], nullptr, 16)));
    bool recent = false;
    for (const std::string& col : c) {
      std::istringstream hs(col);
      for (std::string h; hs >> h;)
        recent = recent || late.count(static_cast<char32_t>(std::stoul(h, nullptr, 16)));
    }
    if (recent) {
      ++skipped;
      continue;
    }
    const std::string want = utf8_of(c[1]), want45 = utf8_of(c[3]);
    for (int i : {0, 1, 2})
      if (nfc(utf8_of(c[static_cast<size_t>(i)])) != want && ++failures <= 10)
        ADD_FAILURE() << "NFC(c" << i + 1 << ") != c2 on: " << line;
    for (int i : {3, 4})
      if (nfc(utf8_of(c[static_cast<size_t>(i)])) != want45 && ++failures <= 10)
        ADD_FAILURE() << "NFC(c" << i + 1 << ") != c4 on: " << line;
    ++lines;
  }
  EXPECT_GT(lines, 15000);
  EXPECT_EQ(failures, 0);
  // Part 1 lists every code point with a decomposition or a combining class; all others are
  // unchanged by NFC, alone.
  int singles = 0;
  for (char32_t c = 0; c <= 0x10FFFF; ++c) {
    if ((c >= 0xD800 && c <= 0xDFFF) || listed.count(c)) continue;
    const std::string s = utf8_of([&] {
      std::ostringstream h;
      h << std::hex << static_cast<uint32_t>(c);
      return h.str();
    }());
    if (nfc(s) != s && ++singles <= 10)
      ADD_FAILURE() << "U+" << std::hex << static_cast<uint32_t>(c) << " changed";
  }
  EXPECT_EQ(singles, 0);
  std::cout << "NFC conformance: " << lines << " lines, " << skipped
            << " skipped for characters assigned after 9.0 (tables: Unicode "
            << nfc_unicode_version() << ")\n";
  // As HF tokenizers: a composition of characters from Unicode 13 is not made, a mark from
  // Unicode 14 is not reordered.
  EXPECT_EQ(nfc("\U00011935\U00011930"), "\U00011935\U00011930");
  EXPECT_EQ(nfc("a\u0898\u0316"), "a\u0898\u0316");
}

}  // namespace
}  // namespace qparity
