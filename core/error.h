#pragma once
// One exception type for every bad input qparity detects. The message always starts with where
// the problem is (file, tensor or key) and then names the rule that was violated, so that a CLI
// can print it as a single line and a test can assert on the name.
#include <stdexcept>
#include <string>

namespace qparity {

class Error : public std::runtime_error {
 public:
  Error(const std::string& where, const std::string& what)
      : std::runtime_error(where.empty() ? what : where + ": " + what), where_(where) {}
  const std::string& where() const { return where_; }

 private:
  std::string where_;
};

// A command line that cannot mean anything (conflicting or missing options, a value outside the
// option's choices): the CLI exits 2 for it, 1 for bad input files.
class UsageError : public Error {
 public:
  using Error::Error;
};

}  // namespace qparity
