#include "core/safetensors/safetensors_file.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <set>

#include "core/error.h"
#include "core/json_util.h"

namespace qparity {

uint64_t TensorInfo::numel() const {
  uint64_t n = 1;
  for (uint64_t d : shape)
    n *= d;
  return n;
}

namespace {

std::string tensor_where(const std::string& file, const std::string& name) {
  return file + ": tensor '" + name + "'";
}

uint64_t as_u64(const Json& v, const std::string& where) {
  if (v.is_number_unsigned()) return v.get<uint64_t>();
  if (v.is_number_integer()) {
    const auto i = v.get<int64_t>();
    if (i < 0) throw Error(where, "must be non-negative, got " + std::to_string(i));
    return static_cast<uint64_t>(i);
  }
  throw Error(where, "expected a non-negative integer, got " + json_type_name(v));
}

// Parses the header JSON rejecting duplicate keys at any depth: a duplicated tensor name would
// otherwise silently hide one of the tensors.
Json parse_header_json(std::string_view text, const std::string& where) {
  std::vector<std::set<std::string>> open_objects;  // key sets of the objects being parsed
  std::string duplicate;
  auto cb = [&](int /*depth*/, Json::parse_event_t event, Json& parsed) {
    if (event == Json::parse_event_t::object_start) {
      open_objects.emplace_back();
    } else if (event == Json::parse_event_t::object_end) {
      if (!open_objects.empty()) open_objects.pop_back();
    } else if (event == Json::parse_event_t::key && !open_objects.empty()) {
      const auto& k = parsed.get_ref<const std::string&>();
      if (!open_objects.back().insert(k).second && duplicate.empty()) duplicate = k;
    }
    return true;
  };
  Json j;
  try {
    j = Json::parse(text.begin(), text.end(), cb);
  } catch (const Json::exception& e) {
    // parse_error, and out_of_range for numbers beyond double (found by fuzzing: "1e616").
    throw Error(where, "header is not valid UTF-8 JSON: " + json_error_text(e));
  }
  if (!duplicate.empty()) throw Error(where, "header has duplicate key '" + duplicate + "'");
  return j;
}

TensorInfo parse_tensor_entry(const std::string& name, const Json& v, const std::string& file) {
  const std::string where = tensor_where(file, name);
  if (name.empty()) throw Error(file, "header has a tensor with an empty name");
  if (!v.is_object()) throw Error(where, "entry must be an object, got " + json_type_name(v));
  for (auto it = v.begin(); it != v.end(); ++it) {
    if (it.key() != "dtype" && it.key() != "shape" && it.key() != "data_offsets")
      throw Error(where, "unexpected key '" + it.key() + "' (allowed: dtype, shape, data_offsets)");
  }
  TensorInfo t;
  t.name = name;
  const std::string dtype_name_str = as_string(require_key(v, "dtype", where), where + " dtype");
  const auto dt = dtype_from_name(dtype_name_str);
  if (!dt) throw Error(where, "unknown dtype '" + dtype_name_str + "'");
  t.dtype = *dt;

  const Json& shape = require_key(v, "shape", where);
  if (!shape.is_array()) throw Error(where, "shape must be a list, got " + json_type_name(shape));
  for (size_t i = 0; i < shape.size(); ++i)
    t.shape.push_back(as_u64(shape[i], where + " shape[" + std::to_string(i) + "]"));

  const Json& offs = require_key(v, "data_offsets", where);
  if (!offs.is_array() || offs.size() != 2)
    throw Error(where, "data_offsets must be a list of two integers");
  t.begin = as_u64(offs[0], where + " data_offsets[0]");
  t.end = as_u64(offs[1], where + " data_offsets[1]");
  if (t.end < t.begin)
    throw Error(where, "data_offsets [" + std::to_string(t.begin) + ", " + std::to_string(t.end) +
                           "] end before begin");

  // Element count x bits must equal the byte range, with every multiplication checked.
  uint64_t bits = dtype_bits(t.dtype);
  for (uint64_t d : t.shape) {
    if (__builtin_mul_overflow(bits, d, &bits)) throw Error(where, "shape product overflows");
  }
  if (bits % 8 != 0)
    throw Error(where,
                "shape does not fill whole bytes for dtype " + std::string(dtype_name(t.dtype)));
  if (bits / 8 != t.nbytes()) {
    throw Error(where, "shape x dtype size is " + std::to_string(bits / 8) +
                           " bytes but data_offsets span " + std::to_string(t.nbytes()) + " bytes");
  }
  return t;
}

}  // namespace

SafetensorsHeader parse_safetensors(std::span<const uint8_t> file_bytes, const std::string& where) {
  const uint64_t size = file_bytes.size();
  if (size < 8)
    throw Error(where, "file is " + std::to_string(size) +
                           " bytes, shorter than the 8-byte header length field");
  uint64_t n = 0;
  for (int i = 7; i >= 0; --i)
    n = (n << 8) | file_bytes[static_cast<size_t>(i)];
  if (n > size - 8)
    throw Error(where, "header length " + std::to_string(n) + " runs past the end of the file (" +
                           std::to_string(size) + " bytes)");
  if (n > kMaxSafetensorsHeaderBytes)
    throw Error(where, "header length " + std::to_string(n) + " exceeds the limit of " +
                           std::to_string(kMaxSafetensorsHeaderBytes) + " bytes");
  if (n < 2 || file_bytes[8] != '{') throw Error(where, "header does not start with '{'");

  const std::string_view text(reinterpret_cast<const char*>(file_bytes.data() + 8), n);
  const Json j = parse_header_json(text, where);
  if (!j.is_object()) throw Error(where, "header must be a JSON object");

  SafetensorsHeader h;
  h.header_len = n;
  for (auto it = j.begin(); it != j.end(); ++it) {
    if (it.key() == "__metadata__") {
      h.has_metadata = true;
      if (!it->is_object()) throw Error(where, "__metadata__ must be an object of strings");
      for (auto m = it->begin(); m != it->end(); ++m) {
        if (!m->is_string())
          throw Error(where, "__metadata__ key '" + m.key() + "' must map to a string, got " +
                                 json_type_name(*m));
        h.metadata[m.key()] = m->get<std::string>();
      }
      continue;
    }
    h.tensors.push_back(parse_tensor_entry(it.key(), *it, where));
  }

  std::sort(h.tensors.begin(), h.tensors.end(), [](const TensorInfo& a, const TensorInfo& b) {
    return a.begin != b.begin ? a.begin < b.begin : a.end < b.end;
  });
  const uint64_t data_size = size - 8 - n;
  uint64_t cursor = 0;
  const TensorInfo* prev = nullptr;
  for (const TensorInfo& t : h.tensors) {
    if (t.begin < cursor)
      throw Error(tensor_where(where, t.name), "data_offsets [" + std::to_string(t.begin) + ", " +
                                                   std::to_string(t.end) + "] overlap tensor '" +
                                                   (prev ? prev->name : "") + "' ending at " +
                                                   std::to_string(cursor));
    if (t.begin > cursor)
      throw Error(tensor_where(where, t.name),
                  "gap of " + std::to_string(t.begin - cursor) +
                      " bytes before this tensor (data_offsets must tile the data region)");
    if (t.end > data_size)
      throw Error(tensor_where(where, t.name), "data_offsets end " + std::to_string(t.end) +
                                                   " is past the data region (" +
                                                   std::to_string(data_size) + " bytes)");
    cursor = t.end;
    prev = &t;
  }
  if (cursor != data_size)
    throw Error(where, "tensors cover " + std::to_string(cursor) +
                           " bytes but the data region has " + std::to_string(data_size) +
                           " (trailing bytes)");
  return h;
}

struct SafetensorsFile::Mapping {
  const uint8_t* data = nullptr;
  size_t size = 0;
  std::vector<uint8_t> owned;  // from_image: the bytes themselves (data points into them)
  Mapping(const Mapping&) = delete;
  Mapping& operator=(const Mapping&) = delete;
  Mapping() = default;
  ~Mapping() {
    if (data && size && owned.empty()) munmap(const_cast<uint8_t*>(data), size);
  }
};

SafetensorsFile SafetensorsFile::open(const std::filesystem::path& path) {
  const std::string where = path.string();
  // O_NONBLOCK: opening a FIFO must not wait for a writer; it is refused just below.
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK);
  if (fd < 0) throw Error(where, std::string("cannot open: ") + std::strerror(errno));
  struct stat st {};
  if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
    ::close(fd);
    throw Error(where, "not a regular file (a FIFO, device or directory cannot be a checkpoint)");
  }
  auto map = std::make_shared<Mapping>();
  map->size = static_cast<size_t>(st.st_size);
  if (map->size > 0) {
    void* p = mmap(nullptr, map->size, PROT_READ, MAP_PRIVATE, fd, 0);
    if (p == MAP_FAILED) {
      const int err = errno;
      ::close(fd);
      throw Error(where, std::string("mmap failed: ") + std::strerror(err));
    }
    map->data = static_cast<const uint8_t*>(p);
  }
  ::close(fd);

  SafetensorsFile f;
  f.path_ = path;
  f.size_ = map->size;
  f.header_ = parse_safetensors(std::span<const uint8_t>(map->data, map->size), where);
  f.map_ = std::move(map);
  for (size_t i = 0; i < f.header_.tensors.size(); ++i)
    f.index_[f.header_.tensors[i].name] = i;
  return f;
}

SafetensorsFile SafetensorsFile::from_image(std::vector<uint8_t> image,
                                            const std::filesystem::path& name) {
  auto map = std::make_shared<Mapping>();
  map->owned = std::move(image);
  map->data = map->owned.data();
  map->size = map->owned.size();
  SafetensorsFile f;
  f.path_ = name;
  f.size_ = map->size;
  f.header_ = parse_safetensors(std::span<const uint8_t>(map->data, map->size), name.string());
  f.map_ = std::move(map);
  for (size_t i = 0; i < f.header_.tensors.size(); ++i)
    f.index_[f.header_.tensors[i].name] = i;
  return f;
}

const TensorInfo* SafetensorsFile::find(const std::string& name) const {
  auto it = index_.find(name);
  return it == index_.end() ? nullptr : &header_.tensors[it->second];
}

const TensorInfo& SafetensorsFile::at(const std::string& name) const {
  const TensorInfo* t = find(name);
  if (!t) throw Error(path_.string(), "no tensor named '" + name + "'");
  return *t;
}

std::span<const uint8_t> SafetensorsFile::bytes(const TensorInfo& t) const {
  return std::span<const uint8_t>(map_->data + 8 + header_.header_len + t.begin, t.nbytes());
}

void SafetensorsFile::drop_pages(const TensorInfo& t) const {
  if (t.nbytes() == 0 || !map_->data || !map_->owned.empty()) return;
  const auto page = static_cast<uintptr_t>(sysconf(_SC_PAGESIZE));
  const auto first = reinterpret_cast<uintptr_t>(bytes(t).data());
  const uintptr_t begin = first / page * page;
  const uintptr_t end = std::min((first + t.nbytes() + page - 1) / page * page,
                                 reinterpret_cast<uintptr_t>(map_->data) + map_->size);
  // Advice only: a failure leaves the pages resident, which costs memory, never correctness.
  if (end > begin) madvise(reinterpret_cast<void*>(begin), end - begin, MADV_DONTNEED);
}

}  // namespace qparity
