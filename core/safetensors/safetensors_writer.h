#pragma once
// Writes safetensors files byte-for-byte as the reference implementation (huggingface/safetensors
// `serialize`) does: tensors ordered by dtype (larger alignment first, the format's dtype order)
// then by name; compact JSON with "__metadata__" first and each entry as
// {"dtype":..,"shape":[..],"data_offsets":[b,e]}; the header padded with spaces to a multiple of
// 8 bytes. Metadata keys are written sorted (the reference uses a hash map, so its order is
// unspecified). Writing is atomic: a temporary file in the same directory, fsync, rename.
#include <cstdint>
#include <filesystem>
#include <map>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "core/dtype.h"

namespace qparity {

struct TensorToWrite {
  std::string name;
  DType dtype;
  std::vector<uint64_t> shape;
  std::span<const uint8_t> bytes;  // little-endian element bytes, C order
};

enum class OverwritePolicy { kRefuse, kReplace };

std::vector<uint8_t> serialize_safetensors(
    std::vector<TensorToWrite> tensors,
    const std::optional<std::map<std::string, std::string>>& metadata);

void write_safetensors(const std::filesystem::path& path, std::vector<TensorToWrite> tensors,
                       const std::optional<std::map<std::string, std::string>>& metadata,
                       OverwritePolicy policy = OverwritePolicy::kRefuse);

// Atomic whole-file write used by every qparity writer (temp file + fsync + rename).
void write_file_atomic(const std::filesystem::path& path, std::span<const uint8_t> bytes,
                       OverwritePolicy policy);

}  // namespace qparity
