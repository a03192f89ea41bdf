// libFuzzer: any byte string as a whole safetensors file. Only qparity::Error may escape the
// parser; anything else (another exception type, a sanitizer report, a hang) is a finding.
#include <cstddef>
#include <cstdint>
#include <span>

#include "core/error.h"
#include "core/safetensors/safetensors_file.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  try {
    const auto h =
        qparity::parse_safetensors(std::span<const uint8_t>(data, size), "fuzz.safetensors");
    // Touch what a reader would: every tensor's byte range must lie inside the input.
    uint64_t sum = 0;
    for (const auto& t : h.tensors) {
      const uint8_t* p = data + 8 + h.header_len + t.begin;
      if (t.nbytes()) sum += p[0] + p[t.nbytes() - 1];
    }
    (void)sum;
  } catch (const qparity::Error&) {
  }
  return 0;
}
