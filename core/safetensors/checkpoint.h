#pragma once
// All tensors of a checkpoint: one safetensors file, a directory holding one or more, or a
// sharded directory with a `*.safetensors.index.json` (HF `model.safetensors.index.json`,
// msModelSlim `quant_model_weights.safetensors.index.json`). Rules:
//   * with an index: every listed tensor is found in the shard the index names, exactly once;
//     a tensor present in a shard but not listed is an error; a listed shard that is missing is
//     an error; shard names are plain file names inside the directory;
//   * without one: every `*.safetensors` in the directory is opened, and a name present in two
//     files is an error naming both.
#include <deque>
#include <filesystem>
#include <map>
#include <span>
#include <string>
#include <vector>

#include "core/json_util.h"
#include "core/safetensors/safetensors_file.h"

namespace qparity {

struct TensorRef {
  const SafetensorsFile* file;
  const TensorInfo* info;
  std::span<const uint8_t> bytes() const { return file->bytes(*info); }
  void drop_pages() const { file->drop_pages(*info); }
};

// Parsed `weight_map` of an index file: tensor name -> shard file name.
std::map<std::string, std::string> parse_safetensors_index(const Json& j, const std::string& where);

class Checkpoint {
 public:
  static Checkpoint open(const std::filesystem::path& path);
  // The tensors of `files` (in-memory images, SafetensorsFile::from_image) as one checkpoint
  // rooted at `root` (what errors and loaders name); a name in two files is an Error.
  static Checkpoint from_files(const std::filesystem::path& root,
                               std::vector<SafetensorsFile> files);
  // A tensor of a renamed view: rows [row_begin, row_end) of `source`'s first dimension (both 0:
  // the whole tensor) under `name`. A row block of a row-major tensor is contiguous, so the view
  // reads the same mapped bytes (no copy).
  struct ViewTensor {
    std::string name;
    std::string source;
    uint64_t row_begin = 0, row_end = 0;
  };
  // The same files seen as exactly the tensors `view` lists (an architecture whose checkpoints
  // fuse or name modules differently seen under the canonical names: chatglm_names.h). A source
  // that is absent, a row range outside it, or a name listed twice is an Error.
  static Checkpoint renamed(Checkpoint raw, const std::vector<ViewTensor>& view);
  // `base` with the tensors of `over` (an in-memory image) in place of the same-named ones: what
  // an engine that re-lays some tensors out holds (gpu_engine/rope_layout.h). A tensor of `over`
  // that replaces nothing is an Error.
  static Checkpoint overlaid(Checkpoint base, SafetensorsFile over);
  // `base` without the tensors named in `consumed`, with the tensors of `derived` (an in-memory
  // image computed from them) added: a checkpoint whose layout no row view can show (gpt-oss's
  // input-major, gate/up-interleaved expert stacks, gpt_oss_names.h). A consumed name that is
  // absent, or a derived name already present, is an Error. `why` goes into origin().
  // `source_of` names, for each derived tensor, the consumed tensor it was computed from
  // (disk_file() reports that tensor's file).
  static Checkpoint derived(Checkpoint base, SafetensorsFile derived,
                            const std::vector<std::string>& consumed,
                            const std::map<std::string, std::string>& source_of,
                            const std::string& why);
  // The file on disk a tensor's bytes come from: its own, or for a derived tensor its source's.
  const SafetensorsFile& disk_file(const std::string& name) const;
  // Where a tensor's bytes come from, for messages: its own name, or for a view "<source>"
  // / "<source> rows [b, e)".
  std::string origin(const std::string& name) const;

  // TensorRefs point into files_ and views_: moving keeps them valid, copying would not.
  Checkpoint(Checkpoint&&) noexcept = default;
  Checkpoint& operator=(Checkpoint&&) noexcept = default;
  Checkpoint(const Checkpoint&) = delete;
  Checkpoint& operator=(const Checkpoint&) = delete;

  const std::filesystem::path& root() const { return root_; }
  bool is_directory() const { return is_dir_; }
  const std::filesystem::path& index_path() const { return index_path_; }  // empty if none
  const std::vector<SafetensorsFile>& files() const { return files_; }
  const std::map<std::string, TensorRef>& tensors() const { return tensors_; }

  bool contains(const std::string& name) const { return tensors_.count(name) != 0; }
  // Throws naming the checkpoint and the tensor when absent.
  const TensorRef& at(const std::string& name) const;

 private:
  Checkpoint() = default;
  std::filesystem::path root_;
  std::filesystem::path index_path_;
  bool is_dir_ = false;
  std::vector<SafetensorsFile> files_;
  std::map<std::string, TensorRef> tensors_;
  std::deque<TensorInfo> views_;  // a deque: its elements never move
  std::map<std::string, std::string> origins_;
  std::map<std::string, size_t> derived_disk_file_;  // derived tensor -> index into files_
};

}  // namespace qparity
