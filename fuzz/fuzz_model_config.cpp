// libFuzzer: config.json contents -> ModelConfig.
#include <cstddef>
#include <cstdint>
#include <string_view>

#include "core/config/model_config.h"
#include "core/error.h"
#include "core/json_util.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  try {
    const auto j = qparity::parse_json_text(
        std::string_view(reinterpret_cast<const char*>(data), size), "config.json");
    const auto cfg = qparity::parse_model_config(j, "config.json");
    (void)qparity::to_json(cfg);
  } catch (const qparity::Error&) {
  }
  return 0;
}
