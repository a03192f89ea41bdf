#include "core/input_file.h"

#include <fstream>
#include <iostream>
#include <system_error>

#include "core/error.h"
#include "core/memory_budget.h"  // format_bytes

namespace qparity {

namespace fs = std::filesystem;

void require_regular_file(const fs::path& path, const std::string& what) {
  std::error_code ec;
  const fs::file_status st = fs::status(path, ec);
  if (ec || !fs::exists(st)) throw Error(path.string(), "no such " + what);
  if (fs::is_directory(st)) throw Error(path.string(), "is a directory, not a " + what);
  if (!fs::is_regular_file(st))
    throw Error(path.string(),
                "is not a regular file (a FIFO, socket or device would be waited "
                "on or never end); give a " +
                    what);
}

namespace {

std::string read_stream(std::istream& in, const std::string& where, const std::string& what,
                        uint64_t max_bytes) {
  std::string out;
  char buf[1 << 16];
  while (in) {
    in.read(buf, sizeof buf);
    const auto got = static_cast<uint64_t>(in.gcount());
    if (out.size() + got > max_bytes)
      throw Error(where, what + " is larger than " + format_bytes(max_bytes) +
                             " (the bound on an input file); split it");
    out.append(buf, static_cast<size_t>(got));
  }
  if (in.bad()) throw Error(where, "read error");
  return out;
}

}  // namespace

std::string read_input_file(const fs::path& path, const std::string& what, uint64_t max_bytes) {
  if (path == "-") return read_stream(std::cin, "stdin", what, max_bytes);
  require_regular_file(path, what);
  std::error_code ec;
  const uintmax_t size = fs::file_size(path, ec);
  if (!ec && size > max_bytes)
    throw Error(path.string(), what + " of " + format_bytes(size) + " is larger than " +
                                   format_bytes(max_bytes) +
                                   " (the bound on an input file); split it");
  std::ifstream f(path, std::ios::binary);
  if (!f) throw Error(path.string(), "cannot open the " + what);
  return read_stream(f, path.string(), what, max_bytes);
}

}  // namespace qparity
