#include "schemes/description/config_keys.h"

#include "core/error.h"

namespace qparity {

std::vector<std::string> module_name_list(const Json& v, const std::string& where) {
  if (v.is_string())
    throw Error(where, "is the string '" + v.get<std::string>() +
                           "', not a list of module names (vLLM would iterate its characters)");
  return as_string_list(v, where);
}

void warn_unknown_keys(QuantPlan& plan, const Json& qc, const std::string& where,
                       const std::set<std::string>& known) {
  std::string unknown;
  for (auto it = qc.begin(); it != qc.end(); ++it)
    if (!known.count(it.key())) unknown += (unknown.empty() ? "'" : ", '") + it.key() + "'";
  if (!unknown.empty())
    plan.add_warning(where + ": unknown key(s) " + unknown +
                     " not read (qparity knows no meaning for them; check they do not change "
                     "the arithmetic)");
}

}  // namespace qparity
