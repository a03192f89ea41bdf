#include "golden/golden_file.h"

#include <hdf5.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <map>
#include <string>

#include <unistd.h>

#include "core/capture/trace.h"
#include "core/error.h"

namespace qparity::golden {

namespace fs = std::filesystem;

namespace {

// Owns one HDF5 identifier; the close function depends on its kind.
class Hid {
 public:
  Hid() = default;
  Hid(hid_t id, herr_t (*close)(hid_t)) : id_(id), close_(close) {}
  Hid(const Hid&) = delete;
  Hid& operator=(const Hid&) = delete;
  Hid(Hid&& o) noexcept : id_(o.id_), close_(o.close_) { o.id_ = H5I_INVALID_HID; }
  Hid& operator=(Hid&& o) noexcept {
    std::swap(id_, o.id_);
    std::swap(close_, o.close_);
    return *this;
  }
  ~Hid() {
    if (id_ >= 0 && close_) close_(id_);
  }
  hid_t get() const { return id_; }
  bool valid() const { return id_ >= 0; }

 private:
  hid_t id_ = H5I_INVALID_HID;
  herr_t (*close_)(hid_t) = nullptr;
};

// HDF5 prints its own error stack to stderr by default; we report errors ourselves.
void silence_hdf5() {
  static const bool done = [] {
    H5Eset_auto2(H5E_DEFAULT, nullptr, nullptr);
    return true;
  }();
  (void)done;
}

Hid check(hid_t id, herr_t (*close)(hid_t), const std::string& where, const std::string& what) {
  if (id < 0) throw Error(where, what);
  return Hid(id, close);
}

void check(herr_t rc, const std::string& where, const std::string& what) {
  if (rc < 0) throw Error(where, what);
}

Hid string_type() {
  Hid t(H5Tcopy(H5T_C_S1), H5Tclose);
  H5Tset_size(t.get(), H5T_VARIABLE);
  H5Tset_cset(t.get(), H5T_CSET_UTF8);
  return t;
}

void write_string_attr(hid_t obj, const std::string& name, const std::string& value,
                       const std::string& where) {
  const Hid type = string_type();
  const Hid space(H5Screate(H5S_SCALAR), H5Sclose);
  const Hid a =
      check(H5Acreate2(obj, name.c_str(), type.get(), space.get(), H5P_DEFAULT, H5P_DEFAULT),
            H5Aclose, where, "cannot create attribute " + name);
  const char* p = value.c_str();
  check(H5Awrite(a.get(), type.get(), &p), where, "cannot write attribute " + name);
}

void write_string_array_attr(hid_t obj, const std::string& name,
                             const std::vector<std::string>& values, const std::string& where) {
  const Hid type = string_type();
  const hsize_t n = values.size();
  const Hid space(H5Screate_simple(1, &n, nullptr), H5Sclose);
  const Hid a =
      check(H5Acreate2(obj, name.c_str(), type.get(), space.get(), H5P_DEFAULT, H5P_DEFAULT),
            H5Aclose, where, "cannot create attribute " + name);
  std::vector<const char*> p;
  for (const auto& v : values)
    p.push_back(v.c_str());
  check(H5Awrite(a.get(), type.get(), p.data()), where, "cannot write attribute " + name);
}

// A 1-D array of strings (variable or fixed length, as h5py writes a list of str or a numpy
// bytes array), or a single string (one entry).
std::vector<std::string> read_string_array_attr(hid_t obj, const std::string& name,
                                                const std::string& where) {
  const Hid a = check(H5Aopen(obj, name.c_str(), H5P_DEFAULT), H5Aclose, where,
                      "cannot open attribute " + name);
  const Hid ftype(H5Aget_type(a.get()), H5Tclose);
  if (H5Tget_class(ftype.get()) != H5T_STRING)
    throw Error(where, "attribute '" + name + "' must hold strings");
  const Hid space(H5Aget_space(a.get()), H5Sclose);
  const int rank = H5Sget_simple_extent_ndims(space.get());
  if (rank > 1) throw Error(where, "attribute '" + name + "' must be a 1-D array of strings");
  const hssize_t n = H5Sget_simple_extent_npoints(space.get());
  if (n < 0 || n > (1 << 20)) throw Error(where, "attribute '" + name + "': bad size");
  std::vector<std::string> out;
  if (H5Tis_variable_str(ftype.get()) > 0) {
    const Hid type = string_type();
    std::vector<char*> p(static_cast<size_t>(n), nullptr);
    check(H5Aread(a.get(), type.get(), p.data()), where, "cannot read attribute " + name);
    for (char* c : p) {
      out.emplace_back(c ? c : "");
      H5free_memory(c);
    }
    return out;
  }
  const size_t len = H5Tget_size(ftype.get());
  std::vector<char> buf(len * static_cast<size_t>(n) + 1, '\0');
  const Hid mtype(H5Tcopy(ftype.get()), H5Tclose);
  check(H5Aread(a.get(), mtype.get(), buf.data()), where, "cannot read attribute " + name);
  for (hssize_t i = 0; i < n; ++i) {
    const char* c = buf.data() + static_cast<size_t>(i) * len;
    out.emplace_back(c, strnlen(c, len));
  }
  return out;
}

template <typename T>
void write_scalar_attr(hid_t obj, const std::string& name, hid_t type, T value,
                       const std::string& where) {
  const Hid space(H5Screate(H5S_SCALAR), H5Sclose);
  const Hid a = check(H5Acreate2(obj, name.c_str(), type, space.get(), H5P_DEFAULT, H5P_DEFAULT),
                      H5Aclose, where, "cannot create attribute " + name);
  check(H5Awrite(a.get(), type, &value), where, "cannot write attribute " + name);
}

std::string read_string_attr(hid_t obj, const std::string& name, const std::string& where) {
  if (H5Aexists(obj, name.c_str()) <= 0) throw Error(where, "missing attribute '" + name + "'");
  const Hid a = check(H5Aopen(obj, name.c_str(), H5P_DEFAULT), H5Aclose, where,
                      "cannot open attribute " + name);
  const Hid ftype(H5Aget_type(a.get()), H5Tclose);
  if (H5Tget_class(ftype.get()) != H5T_STRING)
    throw Error(where, "attribute '" + name + "' is not a string");
  if (H5Tis_variable_str(ftype.get()) > 0) {
    const Hid type = string_type();
    char* p = nullptr;
    check(H5Aread(a.get(), type.get(), &p), where, "cannot read attribute " + name);
    std::string s = p ? p : "";
    H5free_memory(p);
    return s;
  }
  const size_t n = H5Tget_size(ftype.get());
  std::string s(n, '\0');
  const Hid mtype(H5Tcopy(ftype.get()), H5Tclose);
  check(H5Aread(a.get(), mtype.get(), s.data()), where, "cannot read attribute " + name);
  s.resize(std::strlen(s.c_str()));
  return s;
}

template <typename T>
T read_scalar_attr(hid_t obj, const std::string& name, hid_t type, const std::string& where) {
  if (H5Aexists(obj, name.c_str()) <= 0) throw Error(where, "missing attribute '" + name + "'");
  const Hid a = check(H5Aopen(obj, name.c_str(), H5P_DEFAULT), H5Aclose, where,
                      "cannot open attribute " + name);
  T v{};
  check(H5Aread(a.get(), type, &v), where, "cannot read attribute " + name);
  return v;
}

// A chunked, shuffled, gzip-compressed dataset; chunks of whole rows, about 1 MiB each, so one
// capture point (or a few tokens of it) reads without the rest of the file.
void write_dataset(hid_t parent, const std::string& name, const std::vector<hsize_t>& dims,
                   hid_t file_type, hid_t mem_type, const void* data, const std::string& where) {
  const Hid space = check(H5Screate_simple(static_cast<int>(dims.size()), dims.data(), nullptr),
                          H5Sclose, where, "cannot create dataspace for " + name);
  const Hid dcpl(H5Pcreate(H5P_DATASET_CREATE), H5Pclose);
  // No object timestamps: the same golden written twice is the same bytes (golden merge).
  check(H5Pset_obj_track_times(dcpl.get(), 0), where, "cannot untime " + name);
  hsize_t total = 1;
  for (hsize_t d : dims)
    total *= d;
  if (total > 0) {
    std::vector<hsize_t> chunk = dims;
    const hsize_t row = dims.size() > 1 ? dims[1] : 1;
    const hsize_t rows_per_chunk =
        std::max<hsize_t>(1, (hsize_t{1} << 17) / std::max<hsize_t>(row, 1));
    chunk[0] = std::min<hsize_t>(dims[0], rows_per_chunk);
    check(H5Pset_chunk(dcpl.get(), static_cast<int>(chunk.size()), chunk.data()), where,
          "cannot chunk " + name);
    check(H5Pset_shuffle(dcpl.get()), where, "cannot set shuffle on " + name);
    // Level 1: activations' fp64 mantissas barely compress, and level 4 cost a third of a large
    // golden run's time for a few per cent of size.
    check(H5Pset_deflate(dcpl.get(), 1), where, "cannot set gzip on " + name);
  }
  const Hid ds = check(H5Dcreate2(parent, name.c_str(), file_type, space.get(), H5P_DEFAULT,
                                  dcpl.get(), H5P_DEFAULT),
                       H5Dclose, where, "cannot create dataset " + name);
  if (total > 0)
    check(H5Dwrite(ds.get(), mem_type, H5S_ALL, H5S_ALL, H5P_DEFAULT, data), where,
          "cannot write dataset " + name);
}

std::vector<hsize_t> dataset_dims(hid_t ds, const std::string& where) {
  const Hid space(H5Dget_space(ds), H5Sclose);
  const int rank = H5Sget_simple_extent_ndims(space.get());
  if (rank < 0) throw Error(where, "cannot read the dataspace");
  std::vector<hsize_t> dims(static_cast<size_t>(rank));
  H5Sget_simple_extent_dims(space.get(), dims.data(), nullptr);
  return dims;
}

// A vector of rows x cols elements, after checking that the declared shape fits in this machine's
// memory: a crafted header ([16, 2^34]) gets a named error, not std::bad_alloc.
template <typename T>
std::vector<T> allocate(hsize_t rows, hsize_t cols, const std::string& where) {
  const auto shape = "[" + std::to_string(rows) + ", " + std::to_string(cols) + "]";
  const uint64_t limit = [] {
    const long pages = sysconf(_SC_PHYS_PAGES), page = sysconf(_SC_PAGESIZE);
    return pages > 0 && page > 0 ? static_cast<uint64_t>(pages) * static_cast<uint64_t>(page)
                                 : uint64_t{1} << 40;
  }();
  if (cols != 0 && rows > limit / sizeof(T) / cols)
    throw Error(where, "declares shape " + shape + ", more than this machine's " +
                           std::to_string(limit >> 20) + " MiB of memory");
  try {
    return std::vector<T>(static_cast<size_t>(rows * cols));
  } catch (const std::bad_alloc&) {
    throw Error(where, "declares shape " + shape + ": not enough memory to read it");
  }
}

// The name of a group's i-th link; a corrupt group (the length query fails) is an Error, not a
// std::string of size_t(-1).
std::string link_name(hid_t group, hsize_t i, const std::string& where) {
  const ssize_t len =
      H5Lget_name_by_idx(group, ".", H5_INDEX_NAME, H5_ITER_INC, i, nullptr, 0, H5P_DEFAULT);
  if (len < 0) throw Error(where, "cannot read the name of entry " + std::to_string(i));
  std::string name(static_cast<size_t>(len), '\0');
  if (H5Lget_name_by_idx(group, ".", H5_INDEX_NAME, H5_ITER_INC, i, name.data(), name.size() + 1,
                         H5P_DEFAULT) < 0)
    throw Error(where, "cannot read the name of entry " + std::to_string(i));
  return name;
}

std::string rows_note(int64_t got, int64_t want) {
  return "has " + std::to_string(got) + " rows, the inputs have S*T = " + std::to_string(want);
}

}  // namespace

AbsentPoint parse_absent_point(const std::string& entry, const std::string& where) {
  AbsentPoint a;
  const size_t colon = entry.find(": ");
  a.glob = entry.substr(0, colon);
  if (colon != std::string::npos) a.reason = entry.substr(colon + 2);
  while (!a.glob.empty() && a.glob.back() == ' ')
    a.glob.pop_back();
  if (a.glob.empty() || a.glob.find('/') != std::string::npos ||
      a.glob.find(' ') != std::string::npos)
    throw Error(where, "absent_points entry '" + entry +
                           "': must be a capture-point name or glob (no spaces, no '/'), "
                           "optionally followed by ': reason'");
  return a;
}

const AbsentPoint* declared_absent(const GoldenMeta& meta, const std::string& point) {
  for (const auto& a : meta.absent_points)
    if (glob_match(a.glob, point)) return &a;
  return nullptr;
}

const char* to_string(RunMode m) {
  return m == RunMode::kFree ? "free-run" : "layer-local";
}

const char* to_string(PointPrecision p) {
  return p == PointPrecision::kF32 ? "float32" : "float64";
}

const std::vector<MetaStringField>& meta_string_fields() {
  static const std::vector<MetaStringField> fields = {
      {"producer", &GoldenMeta::producer},
      {"producer_version", &GoldenMeta::producer_version},
      {"model", &GoldenMeta::model},
      {"architecture", &GoldenMeta::architecture},
      {"model_config_hash", &GoldenMeta::model_config_hash},
      {"checkpoint_hash", &GoldenMeta::checkpoint_hash},
      {"scheme", &GoldenMeta::scheme},
      {"dialect", &GoldenMeta::dialect},
      {"precision_mode", &GoldenMeta::precision_mode},
      {"input_set", &GoldenMeta::input_set},
      {"device", &GoldenMeta::device},
      {"created", &GoldenMeta::created}};
  return fields;
}

std::string utc_now_iso8601() {
  // SOURCE_DATE_EPOCH (reproducible-builds.org): a fixed time, so that runs are byte-identical.
  std::time_t t = std::time(nullptr);
  if (const char* e = std::getenv("SOURCE_DATE_EPOCH"); e && *e) {
    char* end = nullptr;
    const long long v = std::strtoll(e, &end, 10);
    if (*end != '\0' || v < 0)
      throw Error("SOURCE_DATE_EPOCH", std::string("'") + e + "' is not a non-negative integer");
    t = static_cast<std::time_t>(v);
  }
  std::tm tm{};
  gmtime_r(&t, &tm);
  char buf[32];
  std::strftime(buf, sizeof buf, "%Y-%m-%dT%H:%M:%SZ", &tm);
  return buf;
}

int64_t GoldenImages::tokens_of(int64_t image) const {
  const auto i = static_cast<size_t>(image);
  return grid_thw[3 * i] * grid_thw[3 * i + 1] * grid_thw[3 * i + 2] / (merge * merge);
}

void check_golden_images(const GoldenImages& im, int64_t sequences, const std::string& where) {
  const std::string w = where + ":images/";
  const auto n = static_cast<size_t>(im.images());
  if (im.grid_thw.size() != 3 * n)
    throw Error(w + "image_grid_thw",
                "needs [n, 3] for the " + std::to_string(n) + " images of images/sequence");
  if (im.merge <= 0) throw Error(w + "merge", "must be positive");
  int64_t patches = 0, rows = 0;
  for (size_t i = 0; i < n; ++i) {
    const int64_t t = im.grid_thw[3 * i], h = im.grid_thw[3 * i + 1], wd = im.grid_thw[3 * i + 2];
    if (t <= 0 || h <= 0 || wd <= 0 || h % im.merge != 0 || wd % im.merge != 0)
      throw Error(w + "image_grid_thw", "row " + std::to_string(i) +
                                            ": positive, h and w multiples of merge " +
                                            std::to_string(im.merge));
    if (im.sequence[i] < 0 || im.sequence[i] >= sequences ||
        (i > 0 && im.sequence[i] < im.sequence[i - 1]))
      throw Error(w + "sequence", "entry " + std::to_string(i) + " = " +
                                      std::to_string(im.sequence[i]) + ": sequences in [0, " +
                                      std::to_string(sequences) + "), non-decreasing");
    patches += t * h * wd;
    rows += im.tokens_of(static_cast<int64_t>(i));
  }
  auto check_matrix = [&](const Array2D& a, const std::string& name, int64_t want_rows) {
    if (a.rows != want_rows || a.cols <= 0 ||
        static_cast<int64_t>(a.data.size()) != a.rows * a.cols)
      throw Error(w + name, "[" + std::to_string(a.rows) + ", " + std::to_string(a.cols) +
                                "]: the grids need " + std::to_string(want_rows) + " rows");
    for (size_t i = 0; i < a.data.size(); ++i)
      if (!std::isfinite(a.data[i]))
        throw Error(w + name,
                    "not finite at row " + std::to_string(static_cast<int64_t>(i) / a.cols));
  };
  check_matrix(im.pixels, "pixel_values", patches);
  check_matrix(im.embeds, "embeds", rows);
  for (size_t j = 0; j < im.deepstack.size(); ++j) {
    check_matrix(im.deepstack[j], "deepstack." + std::to_string(j), rows);
    if (im.deepstack[j].cols != im.embeds.cols)
      throw Error(w + "deepstack." + std::to_string(j), "width differs from images/embeds");
  }
}

void write_golden(const fs::path& path, const Golden& g, OverwritePolicy policy) {
  silence_hdf5();
  const std::string where = path.string();
  const int64_t n = g.sequences * g.seq_len;
  if (g.sequences <= 0 || g.seq_len <= 0)
    throw Error(where, "a golden needs at least one sequence of at least one token");
  if (static_cast<int64_t>(g.tokens.size()) != n || static_cast<int64_t>(g.targets.size()) != n)
    throw Error(where, "inputs/tokens and inputs/targets need S*T = " + std::to_string(n) +
                           " entries (got " + std::to_string(g.tokens.size()) + ", " +
                           std::to_string(g.targets.size()) + ")");
  if (g.logits.rows != n || g.logits.cols <= 0 ||
      static_cast<int64_t>(g.logits.data.size()) != g.logits.rows * g.logits.cols)
    throw Error(where, "outputs/logits " + rows_note(g.logits.rows, n));
  for (int64_t t : g.targets)
    if (t < -1 || t >= g.logits.cols)
      throw Error(where, "inputs/targets holds " + std::to_string(t) + ", outside [-1, vocab " +
                             std::to_string(g.logits.cols) + ")");
  if (static_cast<int64_t>(g.target_logprobs.size()) != n)
    throw Error(where, "outputs/target_logprobs needs " + std::to_string(n) + " entries");
  if (static_cast<int64_t>(g.sequence_nll.size()) != g.sequences ||
      static_cast<int64_t>(g.sequence_ppl.size()) != g.sequences)
    throw Error(where, "outputs/sequence_nll and sequence_ppl need one entry per sequence");
  std::map<std::string, int> seen;
  for (const auto& p : g.points) {
    if (p.name.empty() || p.name.find('/') != std::string::npos)
      throw Error(where, "capture point name '" + p.name + "' (must be non-empty, without '/')");
    if (seen[p.name]++) throw Error(where, "capture point '" + p.name + "' given twice");
    if (p.values.rows != n ||
        static_cast<int64_t>(p.values.data.size()) != p.values.rows * p.values.cols)
      throw Error(where, "points/" + p.name + " " + rows_note(p.values.rows, n));
  }
  if (!g.images.empty()) check_golden_images(g.images, g.sequences, where);
  if (g.meta.shard_count > 0) {
    const GoldenMeta& m = g.meta;
    if (m.shard_index < 0 || m.shard_index >= m.shard_count || m.shard_total < 1 ||
        g.sequences != (m.shard_total - m.shard_index + m.shard_count - 1) / m.shard_count)
      throw Error(where, "shard " + std::to_string(m.shard_index) + "/" +
                             std::to_string(m.shard_count) + " of " +
                             std::to_string(m.shard_total) + " sequences cannot hold " +
                             std::to_string(g.sequences));
  }

  // Build the file in memory, then land it atomically.
  const Hid fapl(H5Pcreate(H5P_FILE_ACCESS), H5Pclose);
  // Grown 64 MiB at a time: a golden of real-size logits runs to gigabytes.
  check(H5Pset_fapl_core(fapl.get(), size_t{64} << 20, 0), where,
        "cannot set up the in-memory file");
  std::vector<uint8_t> image;
  {
    const Hid file = check(H5Fcreate("golden-in-memory.h5", H5F_ACC_TRUNC, H5P_DEFAULT, fapl.get()),
                           H5Fclose, where, "cannot create the HDF5 file");
    const hid_t f = file.get();
    const Hid gcpl(H5Pcreate(H5P_GROUP_CREATE), H5Pclose);
    check(H5Pset_obj_track_times(gcpl.get(), 0), where, "cannot untime the groups");
    const GoldenMeta& m = g.meta;
    write_scalar_attr<int32_t>(f, "schema_version", H5T_STD_I32LE, kSchemaVersion, where);
    for (const auto& [name, field] : meta_string_fields())
      write_string_attr(
          f, name,
          field == &GoldenMeta::created && m.created.empty() ? utc_now_iso8601() : m.*field, where);
    write_string_attr(f, "point_dtype", to_string(m.point_precision), where);
    write_string_attr(f, "run", to_string(m.run_mode), where);
    if (!m.model_dtype.empty()) write_string_attr(f, "model_dtype", m.model_dtype, where);
    if (!m.absent_points.empty()) {
      std::vector<std::string> entries;
      for (const auto& a : m.absent_points) {
        const std::string e = a.reason.empty() ? a.glob : a.glob + ": " + a.reason;
        parse_absent_point(e, where);  // the same rule the reader applies
        entries.push_back(e);
      }
      write_string_array_attr(f, "absent_points", entries, where);
    }
    write_scalar_attr<uint64_t>(f, "seed", H5T_STD_U64LE, m.seed, where);
    if (m.shard_count > 0) {
      write_string_attr(f, "shard",
                        std::to_string(m.shard_index) + "/" + std::to_string(m.shard_count), where);
      write_scalar_attr<int64_t>(f, "shard_sequences", H5T_STD_I64LE, m.shard_total, where);
    }

    const auto s = static_cast<hsize_t>(g.sequences), t = static_cast<hsize_t>(g.seq_len);
    const Hid inputs = check(H5Gcreate2(f, "inputs", H5P_DEFAULT, gcpl.get(), H5P_DEFAULT),
                             H5Gclose, where, "cannot create group inputs");
    write_dataset(inputs.get(), "tokens", {s, t}, H5T_STD_I64LE, H5T_NATIVE_INT64, g.tokens.data(),
                  where);
    write_dataset(inputs.get(), "targets", {s, t}, H5T_STD_I64LE, H5T_NATIVE_INT64,
                  g.targets.data(), where);

    const Hid points = check(H5Gcreate2(f, "points", H5P_DEFAULT, gcpl.get(), H5P_DEFAULT),
                             H5Gclose, where, "cannot create group points");
    const hid_t point_type =
        m.point_precision == PointPrecision::kF32 ? H5T_IEEE_F32LE : H5T_IEEE_F64LE;
    for (size_t i = 0; i < g.points.size(); ++i) {
      const auto& p = g.points[i];
      write_dataset(points.get(), p.name,
                    {static_cast<hsize_t>(p.values.rows), static_cast<hsize_t>(p.values.cols)},
                    point_type, H5T_NATIVE_DOUBLE, p.values.data.data(), where);
      const Hid ds(H5Dopen2(points.get(), p.name.c_str(), H5P_DEFAULT), H5Dclose);
      write_scalar_attr<int64_t>(ds.get(), "order", H5T_STD_I64LE, static_cast<int64_t>(i), where);
    }

    const Hid outputs = check(H5Gcreate2(f, "outputs", H5P_DEFAULT, gcpl.get(), H5P_DEFAULT),
                              H5Gclose, where, "cannot create group outputs");
    write_dataset(outputs.get(), "logits",
                  {static_cast<hsize_t>(g.logits.rows), static_cast<hsize_t>(g.logits.cols)},
                  H5T_IEEE_F64LE, H5T_NATIVE_DOUBLE, g.logits.data.data(), where);
    write_dataset(outputs.get(), "target_logprobs", {s * t}, H5T_IEEE_F64LE, H5T_NATIVE_DOUBLE,
                  g.target_logprobs.data(), where);
    write_dataset(outputs.get(), "sequence_nll", {s}, H5T_IEEE_F64LE, H5T_NATIVE_DOUBLE,
                  g.sequence_nll.data(), where);
    write_dataset(outputs.get(), "sequence_ppl", {s}, H5T_IEEE_F64LE, H5T_NATIVE_DOUBLE,
                  g.sequence_ppl.data(), where);

    if (!g.images.empty()) {
      const GoldenImages& im = g.images;
      const Hid ig = check(H5Gcreate2(f, "images", H5P_DEFAULT, gcpl.get(), H5P_DEFAULT), H5Gclose,
                           where, "cannot create group images");
      const auto images = static_cast<hsize_t>(im.images());
      auto matrix = [&](const std::string& name, const Array2D& a) {
        write_dataset(ig.get(), name, {static_cast<hsize_t>(a.rows), static_cast<hsize_t>(a.cols)},
                      H5T_IEEE_F64LE, H5T_NATIVE_DOUBLE, a.data.data(), where);
      };
      matrix("pixel_values", im.pixels);
      write_dataset(ig.get(), "image_grid_thw", {images, 3}, H5T_STD_I64LE, H5T_NATIVE_INT64,
                    im.grid_thw.data(), where);
      write_dataset(ig.get(), "sequence", {images}, H5T_STD_I64LE, H5T_NATIVE_INT64,
                    im.sequence.data(), where);
      matrix("embeds", im.embeds);
      for (size_t j = 0; j < im.deepstack.size(); ++j)
        matrix("deepstack." + std::to_string(j), im.deepstack[j]);
      write_scalar_attr<int64_t>(ig.get(), "merge", H5T_STD_I64LE, im.merge, where);
      write_scalar_attr<int64_t>(ig.get(), "deepstack", H5T_STD_I64LE,
                                 static_cast<int64_t>(im.deepstack.size()), where);
    }

    if (!g.activation_stats.empty()) {
      const Hid qs = check(H5Gcreate2(f, "quant_stats", H5P_DEFAULT, gcpl.get(), H5P_DEFAULT),
                           H5Gclose, where, "cannot create group quant_stats");
      for (size_t i = 0; i < g.activation_stats.size(); ++i) {
        const auto& a = g.activation_stats[i];
        if (a.name.empty() || a.name.find('/') != std::string::npos)
          throw Error(where, "quant_stats name '" + a.name + "' (non-empty, without '/')");
        const int64_t v[4] = {a.codes, a.saturated, a.scales, a.zero_scales};
        write_dataset(qs.get(), a.name, {4}, H5T_STD_I64LE, H5T_NATIVE_INT64, v, where);
        const Hid ds(H5Dopen2(qs.get(), a.name.c_str(), H5P_DEFAULT), H5Dclose);
        write_scalar_attr<int64_t>(ds.get(), "order", H5T_STD_I64LE, static_cast<int64_t>(i),
                                   where);
      }
    }
    check(H5Fflush(f, H5F_SCOPE_GLOBAL), where, "cannot flush the in-memory file");
    const ssize_t size = H5Fget_file_image(f, nullptr, 0);
    if (size <= 0) throw Error(where, "cannot size the in-memory file image");
    image.resize(static_cast<size_t>(size));
    if (H5Fget_file_image(f, image.data(), image.size()) != size)
      throw Error(where, "cannot copy the in-memory file image");
  }
  write_file_atomic(path, image, policy);
}

struct GoldenReader::Handle {
  Hid file;
};

GoldenReader::GoldenReader(GoldenReader&&) noexcept = default;
GoldenReader& GoldenReader::operator=(GoldenReader&&) noexcept = default;
GoldenReader::~GoldenReader() = default;

GoldenReader GoldenReader::open(const fs::path& path) {
  silence_hdf5();
  const std::string where = path.string();
  if (!fs::exists(path)) throw Error(where, "no such file");
  // A FIFO or a device would block or stream forever: only regular files are read.
  if (!fs::is_regular_file(path))
    throw Error(where, "not a regular file (a golden is an HDF5 file)");
  if (H5Fis_hdf5(path.c_str()) <= 0) throw Error(where, "not an HDF5 file");
  GoldenReader r;
  r.path_ = path;
  r.h_ = std::make_unique<Handle>();
  r.h_->file = check(H5Fopen(path.c_str(), H5F_ACC_RDONLY, H5P_DEFAULT), H5Fclose, where,
                     "cannot open the HDF5 file");
  const hid_t f = r.h_->file.get();
  if (H5Aexists(f, "schema_version") <= 0)
    throw Error(where, "not a qparity golden file (no schema_version attribute)");
  const auto version = read_scalar_attr<int32_t>(f, "schema_version", H5T_NATIVE_INT32, where);
  if (version != kSchemaVersion)
    throw Error(where, "golden schema version " + std::to_string(version) +
                           "; this qparity reads version " + std::to_string(kSchemaVersion));
  std::vector<std::string> missing;
  for (const char* d : {"inputs/tokens", "inputs/targets", "outputs/logits",
                        "outputs/target_logprobs", "outputs/sequence_nll", "outputs/sequence_ppl"})
    if (H5Lexists(f, d[0] == 'i' ? "inputs" : "outputs", H5P_DEFAULT) <= 0 ||
        H5Lexists(f, d, H5P_DEFAULT) <= 0)
      missing.push_back(d);
  if (H5Lexists(f, "points", H5P_DEFAULT) <= 0) missing.push_back("points (group)");
  if (!missing.empty()) {
    std::string list;
    for (const auto& m : missing)
      list += (list.empty() ? "" : ", ") + m;
    throw Error(where, "schema v1 requires " + list + " (missing)");
  }
  GoldenMeta& m = r.meta_;
  for (const auto& [name, field] : meta_string_fields())
    m.*field = read_string_attr(f, name, where);
  const std::string pd = read_string_attr(f, "point_dtype", where);
  if (pd != "float64" && pd != "float32")
    throw Error(where, "point_dtype '" + pd + "' (float64 or float32)");
  m.point_precision = pd == "float32" ? PointPrecision::kF32 : PointPrecision::kF64;
  m.seed = read_scalar_attr<uint64_t>(f, "seed", H5T_NATIVE_UINT64, where);
  if (H5Aexists(f, "model_dtype") > 0) m.model_dtype = read_string_attr(f, "model_dtype", where);
  if (H5Aexists(f, "shard") > 0) {
    const std::string sh = read_string_attr(f, "shard", where);
    const size_t slash = sh.find('/');
    try {
      if (slash == std::string::npos) throw std::invalid_argument(sh);
      size_t used = 0;
      m.shard_index = std::stoll(sh.substr(0, slash), &used);
      if (used != slash) throw std::invalid_argument(sh);
      m.shard_count = std::stoll(sh.substr(slash + 1), &used);
      if (used != sh.size() - slash - 1) throw std::invalid_argument(sh);
    } catch (const std::exception&) {
      throw Error(where, "attribute 'shard' = '" + sh + "' (I/N)");
    }
    if (m.shard_count < 1 || m.shard_index < 0 || m.shard_index >= m.shard_count)
      throw Error(where, "attribute 'shard' = '" + sh + "': needs 0 <= I < N");
    m.shard_total = read_scalar_attr<int64_t>(f, "shard_sequences", H5T_NATIVE_INT64, where);
  }
  if (H5Aexists(f, "absent_points") > 0)
    for (const auto& e : read_string_array_attr(f, "absent_points", where))
      m.absent_points.push_back(parse_absent_point(e, where));
  if (H5Aexists(f, "run") > 0) {
    const std::string run = read_string_attr(f, "run", where);
    if (run != "free-run" && run != "layer-local")
      throw Error(where, "attribute 'run' = '" + run + "' (free-run or layer-local)");
    m.run_mode = run == "layer-local" ? RunMode::kLayerLocal : RunMode::kFree;
  } else {
    m.run_mode = m.input_set.rfind("layer-local:", 0) == 0 ? RunMode::kLayerLocal : RunMode::kFree;
  }

  const auto read_ints = [&](const char* name, std::vector<int64_t>& out) {
    const Hid ds =
        check(H5Dopen2(f, name, H5P_DEFAULT), H5Dclose, where, std::string("cannot open ") + name);
    const auto dims = dataset_dims(ds.get(), where + ":" + name);
    if (dims.size() != 2) throw Error(where + ":" + name, "must be 2-D [sequences, seq_len]");
    if (dims[0] == 0 || dims[1] == 0)
      throw Error(where + ":" + name, "is empty (" + std::to_string(dims[0]) + " x " +
                                          std::to_string(dims[1]) +
                                          "): a golden needs at least one sequence of one token");
    r.sequences_ = static_cast<int64_t>(dims[0]);
    r.seq_len_ = static_cast<int64_t>(dims[1]);
    out = allocate<int64_t>(dims[0], dims[1], where + ":" + name);
    if (!out.empty())
      check(H5Dread(ds.get(), H5T_NATIVE_INT64, H5S_ALL, H5S_ALL, H5P_DEFAULT, out.data()),
            where + ":" + name, "cannot read");
  };
  read_ints("inputs/targets", r.targets_);
  const int64_t s = r.sequences_, t = r.seq_len_;
  read_ints("inputs/tokens", r.tokens_);
  if (s != r.sequences_ || t != r.seq_len_)
    throw Error(where, "inputs/tokens and inputs/targets differ in shape");
  // Targets index the logits' columns: checked here, where the file is named, rather than
  // deep inside a comparison (compare_logits would name only a row).
  {
    const Hid ds = check(H5Dopen2(f, "outputs/logits", H5P_DEFAULT), H5Dclose, where,
                         "cannot open outputs/logits");
    const auto dims = dataset_dims(ds.get(), where + ":outputs/logits");
    if (dims.size() != 2) throw Error(where + ":outputs/logits", "must be 2-D [S*T, vocab]");
    const auto vocab = static_cast<int64_t>(dims[1]);
    for (size_t i = 0; i < r.targets_.size(); ++i)
      if (r.targets_[i] < -1 || r.targets_[i] >= vocab)
        throw Error(where, "inputs/targets holds " + std::to_string(r.targets_[i]) + " at row " +
                               std::to_string(i) + ", outside [-1, vocab " + std::to_string(vocab) +
                               ") of outputs/logits");
  }

  // Capture points, sorted by their execution order.
  const Hid points =
      check(H5Gopen2(f, "points", H5P_DEFAULT), H5Gclose, where, "cannot open group points");
  H5G_info_t info;
  check(H5Gget_info(points.get(), &info), where, "cannot list points");
  std::vector<std::pair<int64_t, std::string>> order;
  for (hsize_t i = 0; i < info.nlinks; ++i) {
    const std::string name = link_name(points.get(), i, where + ":points");
    const Hid ds = check(H5Dopen2(points.get(), name.c_str(), H5P_DEFAULT), H5Dclose, where,
                         "cannot open points/" + name);
    order.emplace_back(
        read_scalar_attr<int64_t>(ds.get(), "order", H5T_NATIVE_INT64, where + ":points/" + name),
        name);
  }
  std::sort(order.begin(), order.end());
  for (auto& [o, name] : order)
    r.point_names_.push_back(std::move(name));
  return r;
}

bool GoldenReader::has_point(const std::string& name) const {
  return std::find(point_names_.begin(), point_names_.end(), name) != point_names_.end();
}

namespace {

Array2D read_matrix(hid_t file, const std::string& name, int64_t want_rows,
                    const std::string& where, size_t min_float_bytes) {
  const std::string w = where + ":" + name;
  if (H5Lexists(file, name.c_str(), H5P_DEFAULT) <= 0) throw Error(w, "no such dataset");
  const Hid ds = check(H5Dopen2(file, name.c_str(), H5P_DEFAULT), H5Dclose, w, "cannot open");
  {
    const Hid type(H5Dget_type(ds.get()), H5Tclose);
    if (H5Tget_class(type.get()) != H5T_FLOAT)
      throw Error(w, "must be floating point (float32 or float64)");
    if (H5Tget_size(type.get()) < min_float_bytes)
      throw Error(w, "is stored as a " + std::to_string(8 * H5Tget_size(type.get())) +
                         "-bit float; the schema needs at least " +
                         std::to_string(8 * min_float_bytes) + " bits here");
  }
  const auto dims = dataset_dims(ds.get(), w);
  if (dims.size() > 2) throw Error(w, "must be 1-D or 2-D");
  Array2D a;
  a.rows = dims.empty() ? 0 : static_cast<int64_t>(dims[0]);
  a.cols = dims.size() == 2 ? static_cast<int64_t>(dims[1]) : 1;
  if (want_rows >= 0 && a.rows != want_rows) throw Error(w, rows_note(a.rows, want_rows));
  a.data = allocate<double>(dims.empty() ? 0 : dims[0], dims.size() == 2 ? dims[1] : 1, w);
  if (!a.data.empty())
    check(H5Dread(ds.get(), H5T_NATIVE_DOUBLE, H5S_ALL, H5S_ALL, H5P_DEFAULT, a.data.data()), w,
          "cannot read (values must be floating point)");
  return a;
}

}  // namespace

Array2D GoldenReader::point(const std::string& name) const {
  if (!has_point(name)) throw Error(path_.string(), "no capture point '" + name + "'");
  return read_matrix(h_->file.get(), "points/" + name, rows(), path_.string(), 4);
}

Array2D GoldenReader::logits() const {
  // Never 16-bit: a 16-bit logit store puts a KL floor near 5e-4 (SCHEMA.md).
  return read_matrix(h_->file.get(), "outputs/logits", rows(), path_.string(), 4);
}

std::vector<double> GoldenReader::target_logprobs() const {
  return read_matrix(h_->file.get(), "outputs/target_logprobs", rows(), path_.string(), 4).data;
}

std::vector<double> GoldenReader::sequence_nll() const {
  return read_matrix(h_->file.get(), "outputs/sequence_nll", sequences_, path_.string(), 4).data;
}

std::vector<double> GoldenReader::sequence_ppl() const {
  return read_matrix(h_->file.get(), "outputs/sequence_ppl", sequences_, path_.string(), 4).data;
}

std::vector<ActivationCodeStats> GoldenReader::activation_stats() const {
  const hid_t f = h_->file.get();
  const std::string where = path_.string();
  std::vector<ActivationCodeStats> out;
  if (H5Lexists(f, "quant_stats", H5P_DEFAULT) <= 0) return out;
  const Hid qs =
      check(H5Gopen2(f, "quant_stats", H5P_DEFAULT), H5Gclose, where, "cannot open quant_stats");
  H5G_info_t info;
  check(H5Gget_info(qs.get(), &info), where, "cannot list quant_stats");
  std::vector<std::pair<int64_t, ActivationCodeStats>> rows;
  for (hsize_t i = 0; i < info.nlinks; ++i) {
    const std::string name = link_name(qs.get(), i, where + ":quant_stats");
    const std::string w = where + ":quant_stats/" + name;
    const Hid ds = check(H5Dopen2(qs.get(), name.c_str(), H5P_DEFAULT), H5Dclose, w, "cannot open");
    const auto dims = dataset_dims(ds.get(), w);
    if (dims.size() != 1 || dims[0] != 4)
      throw Error(w, "must be int64[4]: codes, saturated, scales, zero_scales");
    int64_t v[4];
    check(H5Dread(ds.get(), H5T_NATIVE_INT64, H5S_ALL, H5S_ALL, H5P_DEFAULT, v), w, "cannot read");
    rows.push_back({read_scalar_attr<int64_t>(ds.get(), "order", H5T_NATIVE_INT64, w),
                    {name, v[0], v[1], v[2], v[3]}});
  }
  std::sort(rows.begin(), rows.end(),
            [](const auto& a, const auto& b) { return a.first < b.first; });
  for (auto& r : rows)
    out.push_back(std::move(r.second));
  return out;
}

bool GoldenReader::has_images() const {
  return H5Lexists(h_->file.get(), "images", H5P_DEFAULT) > 0;
}

GoldenImages GoldenReader::images() const {
  GoldenImages im;
  if (!has_images()) return im;
  const hid_t f = h_->file.get();
  const std::string where = path_.string();
  auto ints = [&](const std::string& name, size_t rank, hsize_t cols) {
    const std::string w = where + ":images/" + name;
    const std::string path = "images/" + name;
    if (H5Lexists(f, path.c_str(), H5P_DEFAULT) <= 0) throw Error(w, "no such dataset");
    const Hid ds = check(H5Dopen2(f, path.c_str(), H5P_DEFAULT), H5Dclose, w, "cannot open");
    const auto dims = dataset_dims(ds.get(), w);
    if (dims.size() != rank || (rank == 2 && dims[1] != cols))
      throw Error(w, rank == 2 ? "must be [n, 3]" : "must be 1-D");
    std::vector<int64_t> v = allocate<int64_t>(dims[0], rank == 2 ? dims[1] : 1, w);
    if (!v.empty())
      check(H5Dread(ds.get(), H5T_NATIVE_INT64, H5S_ALL, H5S_ALL, H5P_DEFAULT, v.data()), w,
            "cannot read");
    return v;
  };
  im.grid_thw = ints("image_grid_thw", 2, 3);
  im.sequence = ints("sequence", 1, 0);
  if (im.sequence.size() * 3 != im.grid_thw.size())
    throw Error(where + ":images/sequence", "needs one entry per image_grid_thw row");
  const Hid ig = check(H5Gopen2(f, "images", H5P_DEFAULT), H5Gclose, where, "cannot open images");
  im.merge = read_scalar_attr<int64_t>(ig.get(), "merge", H5T_NATIVE_INT64, where + ":images");
  const auto taps =
      read_scalar_attr<int64_t>(ig.get(), "deepstack", H5T_NATIVE_INT64, where + ":images");
  if (taps < 0 || taps > 1024) throw Error(where + ":images", "deepstack count out of range");
  im.pixels = read_matrix(f, "images/pixel_values", -1, where, 8);
  im.embeds = read_matrix(f, "images/embeds", -1, where, 8);
  for (int64_t j = 0; j < taps; ++j)
    im.deepstack.push_back(read_matrix(f, "images/deepstack." + std::to_string(j), -1, where, 8));
  check_golden_images(im, sequences_, where);
  return im;
}

Golden GoldenReader::read_all() const {
  Golden g;
  g.meta = meta_;
  g.sequences = sequences_;
  g.seq_len = seq_len_;
  g.tokens = tokens_;
  g.targets = targets_;
  for (const auto& n : point_names_)
    g.points.push_back({n, point(n)});
  g.logits = logits();
  g.target_logprobs = target_logprobs();
  g.sequence_nll = sequence_nll();
  g.sequence_ppl = sequence_ppl();
  g.activation_stats = activation_stats();
  g.images = images();
  return g;
}

}  // namespace qparity::golden
