#pragma once
// A memory-mapped safetensors file whose header has been validated completely before any tensor
// byte is touched:
//   * the 8-byte little-endian header length fits the file and is at most kMaxHeaderBytes;
//   * the header is UTF-8 JSON, an object, with no duplicate keys;
//   * `__metadata__`, if present, maps strings to strings;
//   * every tensor entry has exactly `dtype` (a known name), `shape` (non-negative integers) and
//     `data_offsets` ([begin, end], begin <= end);
//   * shape product x dtype bits == 8 x (end - begin), without overflow;
//   * sorted by offset, the tensors tile the data region exactly: no gap, no overlap, and the
//     last one ends at the end of the file.
// Tensor data may be unaligned for its dtype (the format allows it): read it as bytes.
#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <map>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "core/dtype.h"

namespace qparity {

inline constexpr uint64_t kMaxSafetensorsHeaderBytes = 100'000'000;  // as the reference reader

struct TensorInfo {
  std::string name;
  DType dtype;
  std::vector<uint64_t> shape;
  uint64_t begin = 0;  // byte offsets relative to the start of the data region
  uint64_t end = 0;
  uint64_t numel() const;
  uint64_t nbytes() const { return end - begin; }
};

struct SafetensorsHeader {
  uint64_t header_len = 0;          // N, the JSON length including padding
  std::vector<TensorInfo> tensors;  // sorted by begin offset
  std::map<std::string, std::string> metadata;
  bool has_metadata = false;  // "__metadata__" present (possibly empty)
};

// Validates a whole file image (header and the size of the data region); `where` names the file
// in errors. Used by SafetensorsFile::open and directly by the fuzzer.
SafetensorsHeader parse_safetensors(std::span<const uint8_t> file_bytes, const std::string& where);

class SafetensorsFile {
 public:
  static SafetensorsFile open(const std::filesystem::path& path);
  // A file image held in memory (validated as open() validates a file), named `name` in errors:
  // what a tensor-parallel rank's shard of a checkpoint is (schemes/parallel/checkpoint_shard.h).
  static SafetensorsFile from_image(std::vector<uint8_t> image, const std::filesystem::path& name);

  SafetensorsFile(SafetensorsFile&&) noexcept = default;
  SafetensorsFile& operator=(SafetensorsFile&&) noexcept = default;
  ~SafetensorsFile() = default;

  const std::filesystem::path& path() const { return path_; }
  const std::vector<TensorInfo>& tensors() const { return header_.tensors; }
  const std::map<std::string, std::string>& metadata() const { return header_.metadata; }
  const SafetensorsHeader& header() const { return header_; }
  uint64_t file_size() const { return size_; }

  const TensorInfo* find(const std::string& name) const;
  // Throws naming the file and the tensor when absent.
  const TensorInfo& at(const std::string& name) const;
  std::span<const uint8_t> bytes(const TensorInfo& t) const;
  // Returns the mapped pages under t's bytes to the kernel (madvise MADV_DONTNEED): once a
  // reader has copied a tensor, its pages no longer count in the process's resident set. The
  // mapping is read-only and private, so a later read maps the file's bytes again; nothing is
  // lost. Pages shared with a neighbouring tensor are dropped too (they reload the same way).
  void drop_pages(const TensorInfo& t) const;

 private:
  struct Mapping;
  SafetensorsFile() = default;
  std::filesystem::path path_;
  std::shared_ptr<const Mapping> map_;
  uint64_t size_ = 0;
  SafetensorsHeader header_;
  std::map<std::string, size_t, std::less<>> index_;
};

}  // namespace qparity
