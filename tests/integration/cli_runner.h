#pragma once
// Runs the `qparity` binary (QPARITY_CLI) in a shell with stdout and stderr captured to files in
// a scratch directory, for the end-to-end CLI tests.
#include <sys/wait.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>

namespace qparity::test {

struct CliRun {
  int status = -1;
  std::string out, err;
};

inline std::string slurp(const std::filesystem::path& p) {
  std::ifstream in(p);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

// `args` is appended to the binary's path verbatim (quote paths with spaces yourself).
inline CliRun run_cli(const std::filesystem::path& scratch, const std::string& args) {
  const auto out = scratch / "stdout", err = scratch / "stderr";
  const std::string cmd =
      std::string(QPARITY_CLI) + " " + args + " >" + out.string() + " 2>" + err.string();
  const int raw = std::system(cmd.c_str());
  CliRun r;
  r.status = WIFEXITED(raw) ? WEXITSTATUS(raw) : 128 + WTERMSIG(raw);
  r.out = slurp(out);
  r.err = slurp(err);
  return r;
}

}  // namespace qparity::test
