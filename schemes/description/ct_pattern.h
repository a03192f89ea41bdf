#pragma once
// One compressed-tensors target or ignore entry ("re:<pattern>", an exact module name, or a class
// name such as "Linear"), compiled once. Quantization config groups, the ignore list, sparsity
// targets and transform targets all match modules through it, as compressed-tensors'
// match_named_modules / is_match do.
#include <regex>
#include <string>
#include <string_view>
#include <vector>

namespace qparity {

struct Pattern {
  std::string text;
  bool is_regex = false;
  std::regex re;

  // `where` names the config key in messages (an invalid regex is an Error naming it).
  Pattern(std::string t, const std::string& where);
  // compressed-tensors match_name: re.match (anchored at the start, not at the end), or equality.
  bool matches_name(std::string_view name) const;
  // Class names match only as plain text ("Linear"), never as a regex.
  bool matches_class(std::string_view cls) const { return !is_regex && text == cls; }

 private:
  std::string where_;
};

// Whether any of `ps` matches the module `name` (as the checkpoint names it) or its class.
bool any_matches(const std::vector<Pattern>& ps, std::string_view name, std::string_view cls);

}  // namespace qparity
