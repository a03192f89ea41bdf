#pragma once
// Writes safetensors files byte-for-byte as the reference implementation (huggingface/safetensors
// `serialize`) does: tensors ordered by dtype (larger alignment first, the format's dtype order)
// then by name; compact JSON with "__metadata__" first and each entry as
// {"dtype":..,"shape":[..],"data_offsets":[b,e]}; the header padded with spaces to a multiple of
// 8 bytes. Metadata keys are written sorted (the reference uses a hash map, so its order is
// unspecified). Writing is atomic: a temporary file in the same directory, fsync, rename.
#include <cstdint>
#include <filesystem>
#include <functional>
#include <map>
#include <memory>
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

// One safetensors file put together from tensors given one at a time, for files larger than
// memory (the quantizer's output): the bytes written equal write_safetensors() of the same
// tensors with the same metadata, bit for bit (same order, header and padding). Memory held:
// the entries' names and shapes, never their data:
//   * add() appends the bytes to a spill file (`spill`, created by the constructor, in the same
//     directory as the output ideally; removed by the destructor and on SIGINT/SIGTERM) at once,
//     so the caller may free them;
//   * add_view() records bytes the caller keeps valid until write() (a memory-mapped input
//     tensor); `after_write` runs once they are in the output (to give the mapped pages back).
// write() lays the file out in serialize_safetensors' order, copying each tensor from the spill
// or its view in bounded pieces, and writes it as write_file_atomic does (temporary file beside
// `path`, fsync, rename; under kRefuse an existing file is an Error and is left alone). The
// name, dtype and shape checks of serialize_safetensors apply, as an Error naming the tensor, at
// add time.
class SafetensorsAssembler {
 public:
  explicit SafetensorsAssembler(std::filesystem::path spill);
  SafetensorsAssembler(const SafetensorsAssembler&) = delete;
  SafetensorsAssembler& operator=(const SafetensorsAssembler&) = delete;
  ~SafetensorsAssembler();

  void add(std::string name, DType dtype, std::vector<uint64_t> shape,
           std::span<const uint8_t> bytes);
  void add_view(std::string name, DType dtype, std::vector<uint64_t> shape,
                std::span<const uint8_t> bytes, std::function<void()> after_write = {});

  size_t size() const { return entries_.size(); }
  uint64_t data_bytes() const { return data_bytes_; }
  std::vector<std::string> names() const;  // in the order given

  // Once only: afterwards the assembler holds nothing and its spill is gone.
  void write(const std::filesystem::path& path,
             const std::optional<std::map<std::string, std::string>>& metadata,
             OverwritePolicy policy);

 private:
  struct Entry {
    std::string name;
    DType dtype;
    std::vector<uint64_t> shape;
    uint64_t size = 0;
    uint64_t spill_offset = 0;          // add(): where its bytes are in the spill
    std::span<const uint8_t> view;      // add_view()
    std::function<void()> after_write;  // add_view()
    bool spilled = false;
  };
  void check_new(const std::string& name, DType dtype, const std::vector<uint64_t>& shape,
                 uint64_t size);

  std::filesystem::path spill_;
  int spill_fd_ = -1;
  uint64_t spill_bytes_ = 0;
  uint64_t data_bytes_ = 0;
  std::vector<Entry> entries_;
  std::map<std::string, size_t> by_name_;
  bool written_ = false;
  struct Guard;
  std::unique_ptr<Guard> guard_;
};

}  // namespace qparity
