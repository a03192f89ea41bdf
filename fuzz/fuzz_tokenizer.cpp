// libFuzzer: a tokenizer.json and a text -> Tokenizer::load, then encode with and without the
// special tokens. The input is the tokenizer.json's bytes, a NUL byte, then the text (no NUL: the
// whole input is the tokenizer.json and a fixed text is encoded). Only qparity::Error may escape
// (a malformed file, an unsupported model, invalid UTF-8 named by offset); anything else - a
// raw library exception, a crash, a hang - is a finding.
#include <unistd.h>

#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>
#include <string_view>

#include "core/error.h"
#include "core/text/tokenizer.h"

namespace {

// One directory per process, rewritten each input (Tokenizer::load reads dir/tokenizer.json).
const std::filesystem::path& scratch() {
  static const std::filesystem::path dir = [] {
    const auto d = std::filesystem::temp_directory_path() /
                   ("qparity_fuzz_tokenizer_" + std::to_string(::getpid()));
    std::filesystem::create_directories(d);
    return d;
  }();
  return dir;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static const bool verbose = std::getenv("QPARITY_FUZZ_VERBOSE") != nullptr;
  const std::string_view in(reinterpret_cast<const char*>(data), size);
  const size_t nul = in.find('\0');
  const std::string_view json = in.substr(0, nul);
  const std::string_view text =
      nul == std::string_view::npos ? std::string_view("Hello, world! 123 \xC3\xA9 \n\n  x")
                                    : in.substr(nul + 1);
  {
    std::ofstream f(scratch() / "tokenizer.json", std::ios::binary | std::ios::trunc);
    f.write(json.data(), static_cast<std::streamsize>(json.size()));
  }
  try {
    const qparity::Tokenizer tok = qparity::Tokenizer::load(scratch());
    for (const int64_t id : tok.encode(text, true))
      if (id < 0) std::abort();  // ids come from the vocabulary or added tokens: never negative
    (void)tok.encode(text, false);
    if (verbose) std::fprintf(stderr, "  ok: %s\n", tok.description().c_str());
  } catch (const qparity::Error& e) {
    if (verbose) std::fprintf(stderr, "  %s\n", e.what());
  }
  return 0;
}
