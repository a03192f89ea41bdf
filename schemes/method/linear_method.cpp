#include "schemes/method/linear_method.h"

#include <algorithm>

#include <cmath>

#include "core/error.h"
#include "schemes/math/numeric.h"

namespace qparity::reference {

ProcessedIntWeight int_weight_of(const QuantizedMatrix& m, int64_t group, int bits,
                                 IntCodes which) {
  ProcessedIntWeight w;
  w.rows = m.rows;
  w.cols = m.cols;
  w.group = group;
  w.bits = bits;
  w.stored.resize(static_cast<size_t>(w.rows * w.cols));
  std::vector<int64_t> q(static_cast<size_t>(w.cols));
  for (int64_t r = 0; r < w.rows; ++r) {
    if (which == IntCodes::kStored)
      m.stored_row(r, q);
    else
      m.row_codes(r, q);
    for (int64_t c = 0; c < w.cols; ++c)
      w.stored[static_cast<size_t>(r * w.cols + c)] =
          static_cast<int8_t>(q[static_cast<size_t>(c)]);
  }
  return w;
}

int64_t LinearShape::out_features() const {
  int64_t n = 0;
  for (int64_t p : partitions)
    n += p;
  return n;
}

int64_t LinearShape::partition_offset(int64_t p) const {
  int64_t off = 0;
  for (int64_t i = 0; i < p; ++i)
    off += partitions[static_cast<size_t>(i)];
  return off;
}

std::string LinearShape::shard_prefix(int64_t expert, int64_t partition) const {
  std::string s = prefix;
  if (num_experts > 0) s += "." + std::to_string(expert);
  const auto& name = partition_names.at(static_cast<size_t>(partition));
  if (!name.empty()) s += (s.empty() ? "" : ".") + name;
  return s;
}

LinearShape LinearShape::dense(std::string prefix, int64_t out_features, int64_t in_features,
                               DType model_dtype, bool has_bias) {
  LinearShape s;
  s.prefix = std::move(prefix);
  s.partitions = {out_features};
  s.in_features = in_features;
  s.model_dtype = model_dtype;
  s.has_bias = has_bias;
  return s;
}

ParamSpec bias_spec(const LinearShape& s, int64_t partition) {
  return {"bias",
          {s.model_dtype, DType::kF32, DType::kBF16, DType::kF16},
          {s.partitions.at(static_cast<size_t>(partition))},
          false,
          "present when the layer has a bias"};
}

LinearMethod::LinearMethod(LinearShape shape, MethodConfig config)
    : shape_(std::move(shape)), config_(std::move(config)) {
  if (shape_.partitions.empty() || shape_.partition_names.size() != shape_.partitions.size())
    throw Error(shape_.prefix, "a linear needs one name per output partition");
  for (int64_t p : shape_.partitions)
    if (p <= 0) throw Error(shape_.prefix, "output partition of size " + std::to_string(p));
  if (shape_.in_features <= 0)
    throw Error(shape_.prefix, "in_features " + std::to_string(shape_.in_features));
  if (shape_.num_experts < 0)
    throw Error(shape_.prefix, "num_experts " + std::to_string(shape_.num_experts));
}

std::string LinearMethod::where(const std::string& name, int64_t partition, int64_t expert) const {
  const std::string p = shape_.shard_prefix(expert, partition);
  return p.empty() ? name : p + "." + name;
}

void LinearMethod::load(const std::string& name, const TensorView& t, int64_t partition,
                        int64_t expert) {
  if (processed_)
    throw Error(where(name, partition, expert), "loaded after process_weights_after_loading");
  if (partition < 0 || partition >= shape_.partition_count())
    throw Error(where(name, 0, expert), "partition " + std::to_string(partition) +
                                            " of a layer with " +
                                            std::to_string(shape_.partition_count()));
  if (expert < 0 || expert >= shape_.expert_count())
    throw Error(where(name, partition, 0), "expert " + std::to_string(expert) + " of " +
                                               std::to_string(shape_.expert_count()));
  const std::string w = where(name, partition, expert);
  const auto specs = create_weights(partition);
  const ParamSpec* spec = nullptr;
  for (const auto& s : specs)
    if (s.name == name) spec = &s;
  if (!spec) {
    std::string names;
    for (const auto& s : specs)
      names += (names.empty() ? "" : ", ") + s.name;
    throw Error(w, "unexpected tensor for scheme " + to_string(config_.scheme) +
                       " (it expects: " + names + ")");
  }
  require_dtype(t, spec->dtypes, w);
  bool alt = false;
  for (const auto& a : spec->alt_shapes)
    alt = alt || t.shape == a;
  if (!alt) require_shape(t, spec->shape, w);
  if (t.bytes.size() != storage_bytes(t.dtype, t.numel()))
    throw Error(w, "byte size does not match dtype and shape");
  const auto key = std::make_tuple(name, partition, expert);
  if (loaded_.count(key)) throw Error(w, "loaded twice");
  HostTensor h;
  h.dtype = t.dtype;
  h.shape = t.shape;
  h.bytes.assign(t.bytes.begin(), t.bytes.end());
  loaded_.emplace(key, std::move(h));
}

void LinearMethod::load_all(const TensorMap& tensors, int64_t partition, int64_t expert) {
  for (const auto& [name, t] : tensors)
    load(name, t.view(), partition, expert);
}

void LinearMethod::process_weights_after_loading() {
  if (processed_) throw Error(shape_.prefix, "process_weights_after_loading called twice");
  for (int64_t e = 0; e < shape_.expert_count(); ++e)
    for (int64_t p = 0; p < shape_.partition_count(); ++p)
      for (const auto& s : create_weights(p))
        if (s.required && !loaded_.count(std::make_tuple(s.name, p, e)))
          throw Error(where(s.name, p, e),
                      "missing: scheme " + to_string(config_.scheme) + " needs it (" +
                          std::string(dtype_name(s.dtypes[0])) + " " + shape_string(s.shape) + ")");
  check_shape();
  process();
  processed_ = true;
  // The run-time form now holds the weights; keep only what the scheme still reads.
  const auto keep = retained_after_processing();
  for (auto it = loaded_.begin(); it != loaded_.end();) {
    if (std::find(keep.begin(), keep.end(), std::get<0>(it->first)) == keep.end())
      it = loaded_.erase(it);
    else
      ++it;
  }
}

size_t LinearMethod::loaded_bytes() const {
  size_t n = 0;
  for (const auto& [key, t] : loaded_)
    n += t.bytes.capacity();
  return n;
}

Matrix LinearMethod::apply(const Matrix& x, int64_t expert) const {
  if (!processed_) throw Error(shape_.prefix, "apply before process_weights_after_loading");
  if (x.cols != shape_.in_features)
    throw Error(shape_.prefix, "input has " + std::to_string(x.cols) + " features, layer takes " +
                                   std::to_string(shape_.in_features));
  if (expert < 0 || expert >= shape_.expert_count())
    throw Error(shape_.prefix, "expert " + std::to_string(expert) + " of " +
                                   std::to_string(shape_.expert_count()));
  require_finite(x.data, shape_.prefix + " input");
  if (config_.transforms.empty()) return do_apply(x, expert);
  Matrix y = do_apply(transformed_input(x), expert);
  if (transforms_.output.empty()) return y;
  // Each partition's columns y[:, off : off + N_p] through its own output transform.
  for (int64_t p = 0; p < shape_.partition_count(); ++p) {
    const auto& u = transforms_.output[static_cast<size_t>(p)];
    if (!u) continue;
    const int64_t off = shape_.partition_offset(p), n = shape_.partitions[static_cast<size_t>(p)];
    Matrix part(y.rows, n);
    for (int64_t i = 0; i < y.rows; ++i)
      for (int64_t j = 0; j < n; ++j)
        part(i, j) = y(i, off + j);
    const Matrix r = apply_transform(part, *u);
    for (int64_t i = 0; i < y.rows; ++i)
      for (int64_t j = 0; j < n; ++j)
        y(i, off + j) = r(i, j);
  }
  return y;
}

Matrix LinearMethod::transformed_input(const Matrix& x) const {
  if (transforms_.empty())
    throw Error(shape_.prefix, "its online transforms (" + config_.transforms.front().key +
                                   ") have no matrices: the loader did not set them");
  return transforms_.input ? apply_transform(x, *transforms_.input) : x;
}

void LinearMethod::set_online_transforms(LinearTransforms t) {
  if (config_.transforms.empty() && !t.empty())
    throw Error(shape_.prefix, "online transform matrices for a layer whose plan has none");
  if (!t.output.empty() && static_cast<int64_t>(t.output.size()) != shape_.partition_count())
    throw Error(shape_.prefix, "output transforms for " + std::to_string(t.output.size()) +
                                   " partitions of a layer with " +
                                   std::to_string(shape_.partition_count()));
  if (t.input && shape_.in_features % t.input->block != 0)
    throw Error(shape_.prefix, "an input transform of order " + std::to_string(t.input->block) +
                                   " on " + std::to_string(shape_.in_features) + " features");
  for (size_t p = 0; p < t.output.size(); ++p)
    if (t.output[p] && shape_.partitions[p] % t.output[p]->block != 0)
      throw Error(shape_.prefix, "an output transform of order " +
                                     std::to_string(t.output[p]->block) + " on partition " +
                                     std::to_string(p) + "'s " +
                                     std::to_string(shape_.partitions[p]) + " features");
  transforms_ = std::move(t);
}

std::optional<QuantizedMatrix> LinearMethod::quantize_input(const Matrix& x, int64_t expert) const {
  if (!processed_)
    throw Error(shape_.prefix, "quantize_input before process_weights_after_loading");
  if (x.cols != shape_.in_features)
    throw Error(shape_.prefix, "input has " + std::to_string(x.cols) + " features, layer takes " +
                                   std::to_string(shape_.in_features));
  if (expert < 0 || expert >= shape_.expert_count())
    throw Error(shape_.prefix, "expert " + std::to_string(expert) + " of " +
                                   std::to_string(shape_.expert_count()));
  require_finite(x.data, shape_.prefix + " input");
  if (config_.transforms.empty()) return do_quantize_input(x, expert);
  return do_quantize_input(transformed_input(x), expert);
}

Matrix LinearMethod::dequantized_weight(int64_t expert) const {
  if (!processed_) throw Error(shape_.prefix, "weights read before process_weights_after_loading");
  if (expert < 0 || expert >= shape_.expert_count())
    throw Error(shape_.prefix, "expert " + std::to_string(expert) + " of " +
                                   std::to_string(shape_.expert_count()));
  return do_dequantized_weight(expert);
}

const HostTensor* LinearMethod::find_loaded(const std::string& name, int64_t partition,
                                            int64_t expert) const {
  const auto it = loaded_.find(std::make_tuple(name, partition, expert));
  return it == loaded_.end() ? nullptr : &it->second;
}

const HostTensor& LinearMethod::loaded(const std::string& name, int64_t partition,
                                       int64_t expert) const {
  const HostTensor* t = find_loaded(name, partition, expert);
  if (!t) throw Error(where(name, partition, expert), "missing");
  return *t;
}

std::vector<double> LinearMethod::loaded_bias(int64_t expert) const {
  std::vector<double> b(static_cast<size_t>(shape_.out_features()), 0.0);
  for (int64_t p = 0; p < shape_.partition_count(); ++p) {
    const HostTensor* t = find_loaded("bias", p, expert);
    if (!t) continue;
    const auto v = decode(t->view(), where("bias", p, expert));
    require_finite(v, where("bias", p, expert));
    const int64_t off = shape_.partition_offset(p);
    for (size_t i = 0; i < v.size(); ++i)
      b[static_cast<size_t>(off) + i] = v[i];
  }
  return b;
}

}  // namespace qparity::reference
