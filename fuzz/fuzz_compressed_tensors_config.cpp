// libFuzzer: config.json's quantization_config (compressed-tensors / fp8) -> QuantPlan.
#include <cstddef>
#include <cstdint>
#include <string_view>

#include "core/error.h"
#include "fuzz_model.h"
#include "schemes/description/quant_plan.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  try {
    qparity::QuantSources src;
    src.quantization_config = qparity::parse_json_text(
        std::string_view(reinterpret_cast<const char*>(data), size), "config.json");
    const auto plan = qparity::build_quant_plan(fuzz_model(), src);
    (void)plan.to_json();
  } catch (const qparity::Error&) {
  }
  return 0;
}
