#pragma once
// Helpers of the end-to-end CLI tests: run the `qparity` binary (QPARITY_CLI) in a shell with
// stdout and stderr captured to files in a scratch directory, and read a 2-D tensor it wrote.
#include <sys/wait.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>

#include "core/safetensors/safetensors_file.h"
#include "schemes/math/matmul.h"
#include "schemes/method/tensor_decode.h"

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

// The 2-D tensor `name` of a safetensors file, decoded exactly to fp64.
inline Matrix read_matrix(const std::filesystem::path& file, const std::string& name) {
  const auto f = SafetensorsFile::open(file);
  const TensorInfo& t = f.at(name);
  Matrix m(static_cast<int64_t>(t.shape.at(0)), static_cast<int64_t>(t.shape.at(1)));
  m.data = reference::decode_all(t.dtype, f.bytes(t), t.numel(), name);
  return m;
}

}  // namespace qparity::test
