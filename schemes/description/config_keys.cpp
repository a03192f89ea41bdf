#include "schemes/description/config_keys.h"

namespace qparity {

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
