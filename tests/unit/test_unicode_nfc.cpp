// NFC (core/text/unicode_nfc.h) against the Unicode standard's own conformance test,
// NormalizationTest.txt from Debian's unicode-data (decompressed at configure time): for every
// line c1;c2;c3;c4;c5, NFC(c1) = NFC(c2) = NFC(c3) = c2 and NFC(c4) = NFC(c5) = c4; and every
// code point not listed in part 1 is its own NFC.
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
  while (in >> h) {
    append_utf8(static_cast<char32_t>(std::stoul(h, nullptr, 16)), out);
  }
  return out;
}

TEST(UnicodeNfc, PassesTheStandardsConformanceTest) {
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
  std::cout << "NFC conformance: " << lines << " lines (Unicode " << nfc_unicode_version()
            << " tables)\n";
}

}  // namespace
}  // namespace qparity
