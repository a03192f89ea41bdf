#include "core/memory_budget.h"

#include <unistd.h>

#include <cctype>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <sstream>

#include "core/error.h"

namespace qparity {

namespace {

// The value in kB of `key` ("MemAvailable:") in a /proc file, or 0.
uint64_t proc_kib(const char* file, std::string_view key) {
  std::ifstream f(file);
  std::string line;
  while (std::getline(f, line))
    if (line.compare(0, key.size(), key) == 0) {
      std::istringstream in(line.substr(key.size()));
      uint64_t kib = 0;
      if (in >> kib) return kib;
    }
  return 0;
}

}  // namespace

uint64_t parse_memory_size(std::string_view text, const std::string& where) {
  const std::string value(text);
  auto bad = [&](const std::string& why) {
    return Error(where, "'" + value + "' is not a memory size (" + why +
                            "; e.g. 6G, 512M, 1.5GiB or a byte count)");
  };
  size_t i = 0;
  while (i < text.size() && (std::isdigit(static_cast<unsigned char>(text[i])) || text[i] == '.'))
    ++i;
  if (i == 0) throw bad("no number");
  double number = 0.0;
  try {
    size_t used = 0;
    number = std::stod(value.substr(0, i), &used);
    if (used != i) throw bad("a malformed number");
  } catch (const std::invalid_argument&) {
    throw bad("a malformed number");
  } catch (const std::out_of_range&) {
    throw bad("out of range");
  }
  std::string unit;
  for (char c : text.substr(i))
    unit += static_cast<char>(std::toupper(static_cast<unsigned char>(c)));
  double scale = 1.0;
  if (unit.empty() || unit == "B") {
    scale = 1.0;
  } else if (unit == "K" || unit == "KB" || unit == "KIB") {
    scale = 0x1p10;
  } else if (unit == "M" || unit == "MB" || unit == "MIB") {
    scale = 0x1p20;
  } else if (unit == "G" || unit == "GB" || unit == "GIB") {
    scale = 0x1p30;
  } else if (unit == "T" || unit == "TB" || unit == "TIB") {
    scale = 0x1p40;
  } else {
    throw bad("unknown unit '" + std::string(text.substr(i)) + "'");
  }
  const double bytes = std::floor(number * scale);
  if (!(bytes >= 1.0)) throw bad("not positive");
  if (bytes >= 0x1p63) throw bad("larger than 2^63 bytes");
  return static_cast<uint64_t>(bytes);
}

uint64_t available_memory_bytes() {
  if (const uint64_t kib = proc_kib("/proc/meminfo", "MemAvailable:"); kib > 0) return kib * 1024;
  const long pages = sysconf(_SC_PHYS_PAGES), page = sysconf(_SC_PAGESIZE);
  if (pages > 0 && page > 0) return static_cast<uint64_t>(pages) * static_cast<uint64_t>(page);
  return uint64_t{1} << 30;  // nothing readable: assume 1 GiB rather than unlimited
}

uint64_t peak_resident_bytes() {
  return proc_kib("/proc/self/status", "VmHWM:") * 1024;
}

std::string format_bytes(uint64_t bytes) {
  char buf[48];
  if (bytes < 1024) {
    std::snprintf(buf, sizeof buf, "%llu B", static_cast<unsigned long long>(bytes));
  } else {
    const char* units[] = {"KiB", "MiB", "GiB", "TiB"};
    double v = static_cast<double>(bytes) / 1024.0;
    int u = 0;
    while (v >= 1024.0 && u < 3) {
      v /= 1024.0;
      ++u;
    }
    std::snprintf(buf, sizeof buf, "%.1f %s", v, units[u]);
  }
  return buf;
}

}  // namespace qparity
