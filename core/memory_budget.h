#pragma once
// Memory sizes as the command line takes them, and what this machine can give: the budget the
// reference streams a model under when it does not fit (`--memory-budget`).
#include <cstdint>
#include <string>
#include <string_view>

namespace qparity {

// "6G", "6GiB", "6GB", "512M", "1.5G", "4096K", "123456789" (bytes): binary units (K = 1024),
// as `free -h` prints them; case-insensitive. Anything else (empty, negative, zero, an unknown
// unit, more than 2^63 bytes) is an Error naming `where` and the value.
uint64_t parse_memory_size(std::string_view text, const std::string& where);

// The memory the kernel says a new allocation can have without swapping (MemAvailable in
// /proc/meminfo); when that cannot be read, the physical memory (sysconf). Never 0.
uint64_t available_memory_bytes();

// The peak resident set size of this process so far (VmHWM in /proc/self/status), 0 if unknown.
uint64_t peak_resident_bytes();

// "15.0 GiB", "512.0 MiB", "812 B": for messages.
std::string format_bytes(uint64_t bytes);

}  // namespace qparity
