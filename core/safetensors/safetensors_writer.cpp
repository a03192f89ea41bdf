#include "core/safetensors/safetensors_writer.h"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
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

std::vector<uint8_t> serialize_safetensors(
    std::vector<TensorToWrite> tensors,
    const std::optional<std::map<std::string, std::string>>& metadata) {
  std::set<std::string> seen;
  for (const auto& t : tensors) {
    if (t.name.empty() || t.name == "__metadata__")
      throw Error("safetensors writer", "invalid tensor name '" + t.name + "'");
    if (!seen.insert(t.name).second)
      throw Error("safetensors writer", "duplicate tensor name '" + t.name + "'");
    uint64_t bits = dtype_bits(t.dtype);
    for (uint64_t d : t.shape) {
      if (__builtin_mul_overflow(bits, d, &bits))
        throw Error("safetensors writer: tensor '" + t.name + "'", "shape product overflows");
    }
    if (bits % 8 != 0 || bits / 8 != t.bytes.size())
      throw Error("safetensors writer: tensor '" + t.name + "'",
                  "shape x dtype size does not match the " + std::to_string(t.bytes.size()) +
                      " data bytes");
  }
  std::stable_sort(tensors.begin(), tensors.end(),
                   [](const TensorToWrite& a, const TensorToWrite& b) {
                     if (a.dtype != b.dtype)
                       return static_cast<int>(a.dtype) > static_cast<int>(b.dtype);
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
  for (const auto& t : tensors) {
    if (!first) header += ",";
    first = false;
    header += json_string(t.name) + ":{\"dtype\":\"" + std::string(dtype_name(t.dtype)) +
              "\",\"shape\":[";
    for (size_t i = 0; i < t.shape.size(); ++i) {
      if (i) header += ",";
      header += std::to_string(t.shape[i]);
    }
    header += "],\"data_offsets\":[" + std::to_string(offset) + "," +
              std::to_string(offset + t.bytes.size()) + "]}";
    offset += t.bytes.size();
  }
  header += "}";
  header.append((8 - header.size() % 8) % 8, ' ');

  std::vector<uint8_t> out;
  out.reserve(8 + header.size() + offset);
  const uint64_t n = header.size();
  for (int i = 0; i < 8; ++i)
    out.push_back(static_cast<uint8_t>(n >> (8 * i)));
  out.insert(out.end(), header.begin(), header.end());
  for (const auto& t : tensors)
    out.insert(out.end(), t.bytes.begin(), t.bytes.end());
  return out;
}

void write_file_atomic(const std::filesystem::path& path, std::span<const uint8_t> bytes,
                       OverwritePolicy policy) {
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
  size_t done = 0;
  while (done < bytes.size()) {
    const ssize_t w = ::write(fd, bytes.data() + done, bytes.size() - done);
    if (w < 0) {
      if (errno == EINTR) continue;
      const int err = errno;
      ::close(fd);
      std::filesystem::remove(tmp);
      throw Error(where, std::string("write failed: ") + std::strerror(err));
    }
    done += static_cast<size_t>(w);
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

void write_safetensors(const std::filesystem::path& path, std::vector<TensorToWrite> tensors,
                       const std::optional<std::map<std::string, std::string>>& metadata,
                       OverwritePolicy policy) {
  const auto bytes = serialize_safetensors(std::move(tensors), metadata);
  write_file_atomic(path, bytes, policy);
}

}  // namespace qparity
