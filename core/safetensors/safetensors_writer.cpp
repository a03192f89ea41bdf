#include "core/safetensors/safetensors_writer.h"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <functional>
#include <random>
#include <set>

#include "core/error.h"
#include "core/json_util.h"
#include "core/temp_cleanup.h"

namespace qparity {

namespace {
std::string json_string(const std::string& s) {
  // ensure_ascii off: UTF-8 passes through, control characters are escaped, as serde_json does.
  return Json(s).dump(-1, ' ', false, Json::error_handler_t::strict);
}
}  // namespace

namespace {

// One tensor as the header describes it; `index` is its position in the caller's list.
struct Planned {
  std::string name;
  DType dtype;
  std::vector<uint64_t> shape;
  uint64_t size = 0;
  size_t index = 0;
};

// The checks serialize_safetensors makes of one tensor, except duplicates.
void check_tensor(const std::string& name, DType dtype, const std::vector<uint64_t>& shape,
                  uint64_t size) {
  if (name.empty() || name == "__metadata__")
    throw Error("safetensors writer", "invalid tensor name '" + name + "'");
  uint64_t bits = dtype_bits(dtype);
  for (uint64_t d : shape) {
    if (__builtin_mul_overflow(bits, d, &bits))
      throw Error("safetensors writer: tensor '" + name + "'", "shape product overflows");
  }
  if (bits % 8 != 0 || bits / 8 != size)
    throw Error("safetensors writer: tensor '" + name + "'",
                "shape x dtype size does not match the " + std::to_string(size) + " data bytes");
}

// Sorts `t` into the file's data order (larger-alignment dtypes first, then by name) and returns
// the header: compact JSON, "__metadata__" first, padded with spaces to a multiple of 8 bytes.
std::string plan_header(std::vector<Planned>& t,
                        const std::optional<std::map<std::string, std::string>>& metadata) {
  std::stable_sort(t.begin(), t.end(), [](const Planned& a, const Planned& b) {
    if (a.dtype != b.dtype) return static_cast<int>(a.dtype) > static_cast<int>(b.dtype);
    return a.name < b.name;
  });
  std::string header = "{";
  bool first = true;
  if (metadata) {
    header += "\"__metadata__\":{";
    bool first_m = true;
    for (const auto& [k, v] : *metadata) {
      if (!first_m) header += ",";
      header += json_string(k) + ":" + json_string(v);
      first_m = false;
    }
    header += "}";
    first = false;
  }
  uint64_t offset = 0;
  for (const Planned& e : t) {
    if (!first) header += ",";
    first = false;
    header += json_string(e.name) + ":{\"dtype\":\"" + std::string(dtype_name(e.dtype)) +
              "\",\"shape\":[";
    for (size_t i = 0; i < e.shape.size(); ++i) {
      if (i) header += ",";
      header += std::to_string(e.shape[i]);
    }
    header += "],\"data_offsets\":[" + std::to_string(offset) + "," +
              std::to_string(offset + e.size) + "]}";
    offset += e.size;
  }
  header += "}";
  header.append((8 - header.size() % 8) % 8, ' ');
  return header;
}

// The 8-byte little-endian header length, then the header.
std::vector<uint8_t> header_bytes(const std::string& header) {
  std::vector<uint8_t> out;
  out.reserve(8 + header.size());
  const uint64_t n = header.size();
  for (int i = 0; i < 8; ++i)
    out.push_back(static_cast<uint8_t>(n >> (8 * i)));
  out.insert(out.end(), header.begin(), header.end());
  return out;
}

void write_all(int fd, std::span<const uint8_t> bytes, const std::string& where) {
  size_t done = 0;
  while (done < bytes.size()) {
    const ssize_t w = ::write(fd, bytes.data() + done, bytes.size() - done);
    if (w < 0) {
      if (errno == EINTR) continue;
      throw Error(where, std::string("write failed: ") + std::strerror(errno));
    }
    done += static_cast<size_t>(w);
  }
}

// Writes `path` atomically: `produce` writes the contents into a temporary file beside it
// (through the function it is given), then fsync and rename (kReplace) or link (kRefuse: fails
// if the target appeared meanwhile). The temporary file is removed on every way out that does
// not put it in place, Ctrl-C included.
void write_atomic_with(
    const std::filesystem::path& path, OverwritePolicy policy,
    const std::function<void(const std::function<void(std::span<const uint8_t>)>&)>& produce) {
  const std::string where = path.string();
  if (policy == OverwritePolicy::kRefuse && std::filesystem::exists(path))
    throw Error(where, "file exists; refusing to overwrite it (use --force)");
  std::random_device rd;
  const auto tmp = path.parent_path() / ("." + path.filename().string() + ".tmp-" +
                                         std::to_string(getpid()) + "-" + std::to_string(rd()));
  const int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
  if (fd < 0)
    throw Error(where, std::string("cannot create temporary file: ") + std::strerror(errno));
  // Removed on every way out that does not rename it into place, Ctrl-C included.
  const TempPathGuard guard(tmp, TempPathGuard::OnExit::kRemove);
  try {
    produce([&](std::span<const uint8_t> bytes) { write_all(fd, bytes, where); });
  } catch (...) {
    ::close(fd);
    std::filesystem::remove(tmp);
    throw;
  }
  if (::fsync(fd) != 0 || ::close(fd) != 0) {
    std::filesystem::remove(tmp);
    throw Error(where, std::string("fsync/close failed: ") + std::strerror(errno));
  }
  // Refuse again at the last moment: link() fails if the target appeared meanwhile.
  if (policy == OverwritePolicy::kRefuse) {
    if (::link(tmp.c_str(), path.c_str()) != 0) {
      const int err = errno;
      std::filesystem::remove(tmp);
      throw Error(where, err == EEXIST
                             ? "file exists; refusing to overwrite it (use --force)"
                             : std::string("cannot link into place: ") + std::strerror(err));
    }
    std::filesystem::remove(tmp);
    return;
  }
  if (::rename(tmp.c_str(), path.c_str()) != 0) {
    const int err = errno;
    std::filesystem::remove(tmp);
    throw Error(where, std::string("rename failed: ") + std::strerror(err));
  }
}

}  // namespace

std::vector<uint8_t> serialize_safetensors(
    std::vector<TensorToWrite> tensors,
    const std::optional<std::map<std::string, std::string>>& metadata) {
  std::set<std::string> seen;
  std::vector<Planned> plan;
  plan.reserve(tensors.size());
  for (size_t i = 0; i < tensors.size(); ++i) {
    const TensorToWrite& t = tensors[i];
    if (t.name.empty() || t.name == "__metadata__")
      throw Error("safetensors writer", "invalid tensor name '" + t.name + "'");
    if (!seen.insert(t.name).second)
      throw Error("safetensors writer", "duplicate tensor name '" + t.name + "'");
    check_tensor(t.name, t.dtype, t.shape, t.bytes.size());
    plan.push_back({t.name, t.dtype, t.shape, t.bytes.size(), i});
  }
  const std::string header = plan_header(plan, metadata);
  uint64_t data = 0;
  for (const Planned& p : plan)
    data += p.size;
  std::vector<uint8_t> out = header_bytes(header);
  out.reserve(out.size() + data);
  for (const Planned& p : plan)
    out.insert(out.end(), tensors[p.index].bytes.begin(), tensors[p.index].bytes.end());
  return out;
}

void write_file_atomic(const std::filesystem::path& path, std::span<const uint8_t> bytes,
                       OverwritePolicy policy) {
  write_atomic_with(path, policy, [&](const auto& put) { put(bytes); });
}

void write_safetensors(const std::filesystem::path& path, std::vector<TensorToWrite> tensors,
                       const std::optional<std::map<std::string, std::string>>& metadata,
                       OverwritePolicy policy) {
  const auto bytes = serialize_safetensors(std::move(tensors), metadata);
  write_file_atomic(path, bytes, policy);
}

// --- SafetensorsAssembler ---

struct SafetensorsAssembler::Guard {
  TempPathGuard path;
  explicit Guard(const std::filesystem::path& p) : path(p, TempPathGuard::OnExit::kRemove) {}
};

SafetensorsAssembler::SafetensorsAssembler(std::filesystem::path spill) : spill_(std::move(spill)) {
  spill_fd_ = ::open(spill_.c_str(), O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
  if (spill_fd_ < 0)
    throw Error(spill_.string(),
                std::string("cannot create the spill file: ") + std::strerror(errno));
  guard_ = std::make_unique<Guard>(spill_);
}

SafetensorsAssembler::~SafetensorsAssembler() {
  if (spill_fd_ >= 0) ::close(spill_fd_);
  guard_.reset();  // removes the spill
}

void SafetensorsAssembler::check_new(const std::string& name, DType dtype,
                                     const std::vector<uint64_t>& shape, uint64_t size) {
  if (written_) throw Error(spill_.string(), "internal: tensor '" + name + "' added after write");
  if (name.empty() || name == "__metadata__")
    throw Error("safetensors writer", "invalid tensor name '" + name + "'");
  if (by_name_.count(name))
    throw Error("safetensors writer", "duplicate tensor name '" + name + "'");
  check_tensor(name, dtype, shape, size);
}

void SafetensorsAssembler::add(std::string name, DType dtype, std::vector<uint64_t> shape,
                               std::span<const uint8_t> bytes) {
  check_new(name, dtype, shape, bytes.size());
  Entry e;
  e.size = bytes.size();
  e.spill_offset = spill_bytes_;
  e.spilled = true;
  write_all(spill_fd_, bytes, spill_.string());
  spill_bytes_ += bytes.size();
  data_bytes_ += bytes.size();
  e.name = name;
  e.dtype = dtype;
  e.shape = std::move(shape);
  by_name_.emplace(std::move(name), entries_.size());
  entries_.push_back(std::move(e));
}

void SafetensorsAssembler::add_view(std::string name, DType dtype, std::vector<uint64_t> shape,
                                    std::span<const uint8_t> bytes,
                                    std::function<void()> after_write) {
  check_new(name, dtype, shape, bytes.size());
  Entry e;
  e.size = bytes.size();
  e.view = bytes;
  e.after_write = std::move(after_write);
  data_bytes_ += bytes.size();
  e.name = name;
  e.dtype = dtype;
  e.shape = std::move(shape);
  by_name_.emplace(std::move(name), entries_.size());
  entries_.push_back(std::move(e));
}

std::vector<std::string> SafetensorsAssembler::names() const {
  std::vector<std::string> out;
  out.reserve(entries_.size());
  for (const Entry& e : entries_)
    out.push_back(e.name);
  return out;
}

void SafetensorsAssembler::write(const std::filesystem::path& path,
                                 const std::optional<std::map<std::string, std::string>>& metadata,
                                 OverwritePolicy policy) {
  if (written_) throw Error(path.string(), "internal: safetensors file assembled twice");
  written_ = true;
  std::vector<Planned> plan;
  plan.reserve(entries_.size());
  for (size_t i = 0; i < entries_.size(); ++i)
    plan.push_back({entries_[i].name, entries_[i].dtype, entries_[i].shape, entries_[i].size, i});
  const std::string header = plan_header(plan, metadata);
  // Pieces of at most 64 MiB from the spill: the only data this holds.
  constexpr uint64_t kPiece = uint64_t{64} << 20;
  std::vector<uint8_t> buf;
  write_atomic_with(path, policy, [&](const auto& put) {
    put(header_bytes(header));
    for (const Planned& p : plan) {
      Entry& e = entries_[p.index];
      if (!e.spilled) {
        for (uint64_t at = 0; at < e.size; at += kPiece)
          put(e.view.subspan(at, std::min(kPiece, e.size - at)));
        if (e.after_write) e.after_write();
        continue;
      }
      for (uint64_t at = 0; at < e.size;) {
        const uint64_t n = std::min(kPiece, e.size - at);
        buf.resize(n);
        const ssize_t r =
            ::pread(spill_fd_, buf.data(), n, static_cast<off_t>(e.spill_offset + at));
        if (r < 0 && errno == EINTR) continue;
        if (r <= 0)
          throw Error(spill_.string(), "cannot read back tensor '" + e.name + "': " +
                                           (r < 0 ? std::strerror(errno) : "unexpected end"));
        put(std::span<const uint8_t>(buf.data(), static_cast<size_t>(r)));
        at += static_cast<uint64_t>(r);
      }
    }
  });
  entries_.clear();
  by_name_.clear();
  ::close(spill_fd_);
  spill_fd_ = -1;
  guard_.reset();
}

}  // namespace qparity
