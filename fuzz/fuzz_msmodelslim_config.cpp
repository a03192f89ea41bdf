// libFuzzer: msModelSlim quant_model_description.json -> QuantPlan.
#include <cstddef>
#include <cstdint>
#include <string_view>

#include "core/error.h"
#include "fuzz_model.h"
#include "schemes/description/quant_plan.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  try {
    qparity::QuantSources src;
    src.msmodelslim_description =
        qparity::parse_json_text(std::string_view(reinterpret_cast<const char*>(data), size),
                                 "quant_model_description.json");
    const auto plan = qparity::build_quant_plan(fuzz_model(), src);
    (void)plan.to_json();
  } catch (const qparity::Error&) {
  }
  return 0;
}
