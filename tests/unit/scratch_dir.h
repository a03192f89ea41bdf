#pragma once
// One temporary directory per test program, removed when the program exits, so repeated CI
// runs do not leave a directory per test (or per call) behind in /tmp.
#include <filesystem>
#include <string>
#include <system_error>

#include "test_seed.h"

namespace qparity::test {

class ScratchDir {
 public:
  explicit ScratchDir(const std::string& prefix)
      : path_(std::filesystem::temp_directory_path() /
              (prefix + "_" + std::to_string(test_seed()))) {
    std::filesystem::create_directories(path_);
  }
  ~ScratchDir() {
    std::error_code ignored;  // a failed cleanup must not turn a passing test into a crash
    std::filesystem::remove_all(path_, ignored);
  }
  ScratchDir(const ScratchDir&) = delete;
  ScratchDir& operator=(const ScratchDir&) = delete;
  const std::filesystem::path& path() const { return path_; }

 private:
  std::filesystem::path path_;
};

// The program-wide scratch directory named after `prefix` (the first call's prefix wins).
inline const std::filesystem::path& scratch_dir(const std::string& prefix) {
  static const ScratchDir dir(prefix);
  return dir.path();
}

}  // namespace qparity::test
