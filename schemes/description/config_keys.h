#pragma once
// The keys of a producer's quantization_config that a reader does not know: listed as plan
// warnings (never silently ignored, never fatal: a key that changes the math is read by name and
// refused there when unsupported).
#include <set>
#include <string>
#include <vector>

#include "core/json_util.h"
#include "schemes/description/quant_plan.h"

namespace qparity {

// A list of module names as a Python producer or engine iterates it: a JSON array of strings.
// A bare string is refused (Python would iterate its characters, matching nearly every module
// by substring), unlike compressed-tensors' targets, where a string is one target.
std::vector<std::string> module_name_list(const Json& v, const std::string& where);

// One warning naming every key of `qc` outside `known` (`where` names the config object).
void warn_unknown_keys(QuantPlan& plan, const Json& qc, const std::string& where,
                       const std::set<std::string>& known);

}  // namespace qparity
