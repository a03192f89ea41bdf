#pragma once
// Unicode Normalization Form C (UAX #15) of UTF-8 text, what the NFC normalizer of Qwen's
// tokenizer.json asks for: canonical decomposition (recursive mappings; Hangul syllables by the
// algorithm), canonical ordering of combining marks, then canonical composition of primary
// composites (Hangul LV / LVT by the algorithm). The tables are generated at configure time from
// the Unicode Character Database of Debian's unicode-data package (gen_nfc_tables.py), restricted
// to the characters assigned by Unicode 9.0, the version of HF tokenizers' NFC tables (characters
// assigned later pass through unchanged there, and here); the unit test runs that package's
// NormalizationTest.txt, the standard's conformance test, over those characters.
#include <string>
#include <string_view>

namespace qparity {

// NFC of valid UTF-8 (the caller validates it); the result is UTF-8.
std::string nfc(std::string_view utf8);
// The Unicode version of the tables.
const char* nfc_unicode_version();
// Appends code point c (<= U+10FFFF, not a surrogate) as UTF-8.
void append_utf8(char32_t c, std::string& out);

}  // namespace qparity
