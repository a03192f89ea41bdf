#include "core/safetensors/checkpoint.h"

#include <algorithm>

#include "core/error.h"

namespace qparity {

namespace fs = std::filesystem;

std::map<std::string, std::string> parse_safetensors_index(const Json& j,
                                                           const std::string& where) {
  require_object(j, where);
  if (auto it = j.find("metadata"); it != j.end() && !it->is_null() && !it->is_object())
    throw Error(where, "key 'metadata' must be an object");
  const Json& wm = require_key(j, "weight_map", where);
  if (!wm.is_object()) throw Error(where, "key 'weight_map' must be an object");
  std::map<std::string, std::string> out;
  for (auto it = wm.begin(); it != wm.end(); ++it) {
    const std::string shard = as_string(*it, where + ": weight_map['" + it.key() + "']");
    if (shard.empty() || shard.find('/') != std::string::npos ||
        shard.find('\\') != std::string::npos || shard == "." || shard == "..")
      throw Error(where, "weight_map['" + it.key() + "'] names shard '" + shard +
                             "', which is not a plain file name in the checkpoint directory");
    out[it.key()] = shard;
  }
  return out;
}

const TensorRef& Checkpoint::at(const std::string& name) const {
  auto it = tensors_.find(name);
  if (it == tensors_.end()) throw Error(root_.string(), "checkpoint has no tensor '" + name + "'");
  return it->second;
}

Checkpoint Checkpoint::open(const fs::path& path) {
  Checkpoint c;
  c.root_ = path;
  std::error_code ec;
  if (!fs::exists(path, ec)) throw Error(path.string(), "no such file or directory");
  c.is_dir_ = fs::is_directory(path, ec);
  std::map<std::string, std::string> weight_map;

  if (!c.is_dir_) {
    c.files_.push_back(SafetensorsFile::open(path));
  } else {
    std::vector<fs::path> indexes, shards;
    for (const auto& e : fs::directory_iterator(path)) {
      const std::string n = e.path().filename().string();
      if (n.size() > 23 && n.ends_with(".safetensors.index.json"))
        indexes.push_back(e.path());
      else if (n.ends_with(".safetensors") && e.is_regular_file())
        shards.push_back(e.path());
    }
    std::sort(indexes.begin(), indexes.end());
    std::sort(shards.begin(), shards.end());
    if (indexes.size() > 1)
      throw Error(path.string(),
                  "more than one *.safetensors.index.json: " + indexes[0].filename().string() +
                      ", " + indexes[1].filename().string());
    if (!indexes.empty()) {
      c.index_path_ = indexes[0];
      weight_map = parse_safetensors_index(read_json_file(indexes[0]), indexes[0].string());
      std::vector<std::string> listed;
      for (const auto& [_, shard] : weight_map)
        listed.push_back(shard);
      std::sort(listed.begin(), listed.end());
      listed.erase(std::unique(listed.begin(), listed.end()), listed.end());
      shards.clear();
      for (const auto& s : listed) {
        if (!fs::is_regular_file(path / s))
          throw Error(indexes[0].string(), "shard '" + s + "' is listed but missing");
        shards.push_back(path / s);
      }
    }
    if (shards.empty()) throw Error(path.string(), "no *.safetensors files in the directory");
    c.files_.reserve(shards.size());
    for (const auto& s : shards)
      c.files_.push_back(SafetensorsFile::open(s));
  }

  // files_ no longer grows: pointers into it stay valid.
  for (const SafetensorsFile& f : c.files_) {
    for (const TensorInfo& t : f.tensors()) {
      auto [it, inserted] = c.tensors_.emplace(t.name, TensorRef{&f, &t});
      if (!inserted)
        throw Error(path.string(), "tensor '" + t.name + "' appears in both " +
                                       it->second.file->path().filename().string() + " and " +
                                       f.path().filename().string());
    }
  }
  if (!c.index_path_.empty()) {
    const std::string where = c.index_path_.string();
    for (const auto& [name, shard] : weight_map) {
      auto it = c.tensors_.find(name);
      if (it == c.tensors_.end())
        throw Error(where,
                    "tensor '" + name + "' is listed in shard '" + shard + "' but not found there");
      if (it->second.file->path().filename().string() != shard)
        throw Error(where, "tensor '" + name + "' is listed in shard '" + shard +
                               "' but found in '" + it->second.file->path().filename().string() +
                               "'");
    }
    for (const auto& [name, ref] : c.tensors_) {
      if (!weight_map.count(name))
        throw Error(where, "tensor '" + name + "' in shard '" +
                               ref.file->path().filename().string() +
                               "' is not listed in the index");
    }
  }
  return c;
}

Checkpoint Checkpoint::from_files(const fs::path& root, std::vector<SafetensorsFile> files) {
  Checkpoint c;
  c.root_ = root;
  c.is_dir_ = true;
  c.files_ = std::move(files);
  for (const SafetensorsFile& f : c.files_)
    for (const TensorInfo& t : f.tensors()) {
      auto [it, inserted] = c.tensors_.emplace(t.name, TensorRef{&f, &t});
      if (!inserted)
        throw Error(root.string(), "tensor '" + t.name + "' appears in both " +
                                       it->second.file->path().filename().string() + " and " +
                                       f.path().filename().string());
    }
  return c;
}

Checkpoint Checkpoint::renamed(Checkpoint raw, const std::vector<ViewTensor>& view) {
  Checkpoint c;
  c.root_ = raw.root_;
  c.index_path_ = raw.index_path_;
  c.is_dir_ = raw.is_dir_;
  c.files_ = std::move(raw.files_);  // the vector's buffer moves: raw's refs stay valid
  const std::string where = c.root_.string();
  for (const ViewTensor& v : view) {
    auto src = raw.tensors_.find(v.source);
    if (src == raw.tensors_.end())
      throw Error(where, "checkpoint has no tensor '" + v.source + "' (for '" + v.name + "')");
    const TensorInfo& s = *src->second.info;
    TensorInfo t = s;
    t.name = v.name;
    std::string origin = v.source;
    if (v.row_begin != 0 || v.row_end != 0) {
      if (s.shape.empty())
        throw Error(where + ": tensor '" + v.source + "'", "a scalar has no rows to take");
      if (!(v.row_begin < v.row_end) || v.row_end > s.shape[0])
        throw Error(where + ": tensor '" + v.source + "'",
                    "rows [" + std::to_string(v.row_begin) + ", " + std::to_string(v.row_end) +
                        ") are outside its " + std::to_string(s.shape[0]) + " rows");
      const uint64_t row_bytes = s.nbytes() / s.shape[0];
      if (row_bytes * s.shape[0] != s.nbytes())
        throw Error(where + ": tensor '" + v.source + "'", "rows are not whole bytes");
      t.shape[0] = v.row_end - v.row_begin;
      t.begin = s.begin + v.row_begin * row_bytes;
      t.end = s.begin + v.row_end * row_bytes;
      origin += " rows [" + std::to_string(v.row_begin) + ", " + std::to_string(v.row_end) + ")";
    }
    c.views_.push_back(std::move(t));
    auto [it, inserted] = c.tensors_.emplace(v.name, TensorRef{src->second.file, &c.views_.back()});
    if (!inserted) throw Error(where, "view names tensor '" + v.name + "' twice");
    c.origins_[v.name] = std::move(origin);
  }
  // Views of an earlier view keep pointing into raw's views_: keep them alive.
  for (TensorInfo& t : raw.views_)
    c.views_.push_back(std::move(t));
  return c;
}

Checkpoint Checkpoint::overlaid(Checkpoint base, SafetensorsFile over) {
  // push_back may move the files: every ref is re-pointed by index afterwards.
  std::map<const SafetensorsFile*, size_t> index;
  for (size_t i = 0; i < base.files_.size(); ++i)
    index[&base.files_[i]] = i;
  base.files_.push_back(std::move(over));
  for (auto& [name, ref] : base.tensors_)
    ref.file = &base.files_[index.at(ref.file)];
  const SafetensorsFile& o = base.files_.back();
  for (const TensorInfo& t : o.tensors()) {
    auto it = base.tensors_.find(t.name);
    if (it == base.tensors_.end())
      throw Error(base.root_.string(), "overlay tensor '" + t.name + "' replaces no tensor");
    it->second = TensorRef{&o, &t};
    base.origins_[t.name] = base.origin(t.name) + ", re-laid out in " + o.path().string();
  }
  return base;
}

Checkpoint Checkpoint::derived(Checkpoint base, SafetensorsFile derived,
                               const std::vector<std::string>& consumed,
                               const std::map<std::string, std::string>& source_of,
                               const std::string& why) {
  std::map<const SafetensorsFile*, size_t> index;
  for (size_t i = 0; i < base.files_.size(); ++i)
    index[&base.files_[i]] = i;
  std::map<std::string, size_t> consumed_file;
  for (const std::string& name : consumed) {
    auto it = base.tensors_.find(name);
    if (it == base.tensors_.end())
      throw Error(base.root_.string(),
                  "derived view consumes tensor '" + name + "', which is absent");
    consumed_file[name] = index.at(it->second.file);
    base.tensors_.erase(it);
  }
  base.files_.push_back(std::move(derived));
  for (auto& [name, ref] : base.tensors_)
    ref.file = &base.files_[index.at(ref.file)];
  const SafetensorsFile& d = base.files_.back();
  for (const TensorInfo& t : d.tensors()) {
    if (!base.tensors_.emplace(t.name, TensorRef{&d, &t}).second)
      throw Error(base.root_.string(), "derived tensor '" + t.name + "' is already present");
    const auto src = source_of.find(t.name);
    if (src == source_of.end() || !consumed_file.count(src->second))
      throw Error(base.root_.string(), "derived tensor '" + t.name + "' names no consumed source");
    base.origins_[t.name] = src->second + " (" + why + ")";
    base.derived_disk_file_[t.name] = consumed_file.at(src->second);
  }
  return base;
}

const SafetensorsFile& Checkpoint::disk_file(const std::string& name) const {
  if (auto it = derived_disk_file_.find(name); it != derived_disk_file_.end())
    return files_[it->second];
  return *at(name).file;
}

std::string Checkpoint::origin(const std::string& name) const {
  auto it = origins_.find(name);
  return it == origins_.end() ? name : it->second;
}

}  // namespace qparity
