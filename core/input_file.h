#pragma once
// The one way qparity reads an input file: the path is checked to be a regular file before it
// is opened (a FIFO would block forever, /dev/zero never ends, a directory reads as nothing),
// its size is bounded with a named error before anything is allocated, and a short read is an
// error. Standard input ("-") is read with the same bound. Every text, token, prompt, policy and
// JSON file the CLI takes goes through here.
#include <cstdint>
#include <filesystem>
#include <string>

namespace qparity {

// Default bound of read_input_file: 1 GiB (text and token files; a checkpoint's tensors are
// memory-mapped, never read through this).
inline constexpr uint64_t kMaxInputFileBytes = uint64_t{1} << 30;

// Throws an Error naming `path` and `what` ("text file", "token file") unless it is an existing
// regular file (symlinks followed).
void require_regular_file(const std::filesystem::path& path, const std::string& what);

// The whole file (or standard input for "-"), at most max_bytes; larger is an Error naming the
// size and the bound.
std::string read_input_file(const std::filesystem::path& path, const std::string& what,
                            uint64_t max_bytes = kMaxInputFileBytes);

}  // namespace qparity
