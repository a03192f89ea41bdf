#pragma once
// The keys of a producer's quantization_config that a reader does not know: listed as plan
// warnings (never silently ignored, never fatal: a key that changes the math is read by name and
// refused there when unsupported).
#include <set>
#include <string>

#include "core/json_util.h"
#include "schemes/description/quant_plan.h"

namespace qparity {

// One warning naming every key of `qc` outside `known` (`where` names the config object).
void warn_unknown_keys(QuantPlan& plan, const Json& qc, const std::string& where,
                       const std::set<std::string>& known);

}  // namespace qparity
