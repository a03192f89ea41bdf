#include "schemes/description/ct_pattern.h"

#include "core/error.h"

namespace qparity {

namespace {

// Python `re` syntax that ECMAScript spells differently; the rest is shared by the patterns
// real configs use (".*", "[0-9]+", "(a|b)", "$").
std::string python_to_ecmascript(const std::string& pat, const std::string& where) {
  std::string out;
  for (size_t i = 0; i < pat.size(); ++i) {
    if (pat.compare(i, 4, "(?P<") == 0) {
      const size_t close = pat.find('>', i);
      if (close == std::string::npos) throw Error(where, "unterminated named group");
      out += '(';
      i = close;
    } else if (pat.compare(i, 4, "(?P=") == 0) {
      throw Error(where, "named backreferences (?P=...) are not supported");
    } else if (pat[i] == '\\' && i + 1 < pat.size()) {
      if (pat[i + 1] == 'A')
        out += '^';
      else if (pat[i + 1] == 'Z')
        out += '$';
      else
        out += pat.substr(i, 2);
      ++i;
    } else {
      out += pat[i];
    }
  }
  return out;
}

}  // namespace

Pattern::Pattern(std::string t, const std::string& where) : text(std::move(t)) {
  if (text.rfind("re:", 0) != 0) return;
  is_regex = true;
  const std::string pat = text.substr(3);
  auto flags = std::regex::ECMAScript | std::regex::optimize;
#if defined(__GLIBCXX__)
  // libstdc++'s default executor backtracks (exponential on nested quantifiers); this one is
  // polynomial, which matters for configs from untrusted sources (and the fuzzers).
  flags |= std::regex_constants::__polynomial;
#endif
  try {
    re = std::regex(python_to_ecmascript(pat, where + ": regex '" + pat + "'"), flags);
  } catch (const std::regex_error& e) {
    throw Error(where, "invalid regex '" + pat + "' in target '" + text + "': " + e.what());
  }
  where_ = where;
}

bool Pattern::matches_name(std::string_view name) const {
  if (!is_regex) return text == name;
  try {
    return std::regex_search(name.begin(), name.end(), re, std::regex_constants::match_continuous);
  } catch (const std::regex_error& e) {
    throw Error(where_, "regex in target '" + text + "' failed on '" + std::string(name) +
                            "': " + e.what());
  }
}

bool any_matches(const std::vector<Pattern>& ps, std::string_view name, std::string_view cls) {
  for (const Pattern& p : ps)
    if (p.matches_name(name) || p.matches_class(cls)) return true;
  return false;
}

}  // namespace qparity
