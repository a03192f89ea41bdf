// libFuzzer: model.safetensors.index.json contents.
#include <cstddef>
#include <cstdint>
#include <string_view>

#include "core/error.h"
#include "core/json_util.h"
#include "core/safetensors/checkpoint.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  try {
    const auto j = qparity::parse_json_text(
        std::string_view(reinterpret_cast<const char*>(data), size), "fuzz.index.json");
    (void)qparity::parse_safetensors_index(j, "fuzz.index.json");
  } catch (const qparity::Error&) {
  }
  return 0;
}
