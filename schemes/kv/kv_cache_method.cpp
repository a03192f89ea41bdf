#include "schemes/kv/kv_cache_method.h"

#include <cmath>

#include "core/codecs/float_format.h"
#include "core/error.h"
#include "schemes/math/numeric.h"

namespace qparity::reference {

std::string_view to_string(KvWhich w) {
  switch (w) {
    case KvWhich::kKey:
      return "key";
    case KvWhich::kValue:
      return "value";
  }
  return "?";
}

KvCacheMethod::KvCacheMethod(KvShape shape, MethodConfig config)
    : shape_(std::move(shape)), config_(std::move(config)) {
  if (shape_.num_kv_heads <= 0 || shape_.head_dim <= 0)
    throw Error(shape_.prefix, "KV cache needs num_kv_heads > 0 and head_dim > 0");
}

std::string KvCacheMethod::where(const std::string& name) const {
  return shape_.prefix.empty() ? name : shape_.prefix + "." + name;
}

void KvCacheMethod::load(const std::string& name, const TensorView& t) {
  if (processed_) throw Error(where(name), "loaded after process_weights_after_loading");
  const auto specs = create_weights();
  const ParamSpec* spec = nullptr;
  for (const auto& s : specs)
    if (s.name == name) spec = &s;
  if (!spec) {
    std::string names;
    for (const auto& s : specs)
      names += (names.empty() ? "" : ", ") + s.name;
    throw Error(where(name), "unexpected tensor for KV scheme " + to_string(config_.scheme) +
                                 " (it expects: " + (names.empty() ? "nothing" : names) + ")");
  }
  require_dtype(t, spec->dtypes, where(name));
  bool alt = false;
  for (const auto& a : spec->alt_shapes)
    alt = alt || t.shape == a;
  if (!alt) require_shape(t, spec->shape, where(name));
  if (loaded_.count(name)) throw Error(where(name), "loaded twice");
  HostTensor h;
  h.dtype = t.dtype;
  h.shape = t.shape;
  h.bytes.assign(t.bytes.begin(), t.bytes.end());
  loaded_.emplace(name, std::move(h));
}

void KvCacheMethod::load_all(const TensorMap& tensors) {
  for (const auto& [name, t] : tensors)
    load(name, t.view());
}

void KvCacheMethod::process_weights_after_loading() {
  if (processed_) throw Error(shape_.prefix, "process_weights_after_loading called twice");
  for (const auto& s : create_weights())
    if (s.required && !loaded_.count(s.name))
      throw Error(where(s.name), "missing: KV scheme " + to_string(config_.scheme) + " needs it (" +
                                     std::string(dtype_name(s.dtypes[0])) + " " +
                                     shape_string(s.shape) + ")");
  process();
  processed_ = true;
}

QuantizedMatrix KvCacheMethod::store(KvWhich which, const Matrix& x) const {
  if (!processed_) throw Error(shape_.prefix, "KV store before process_weights_after_loading");
  if (x.cols != shape_.channels())
    throw Error(shape_.prefix, std::string(to_string(which)) + " rows have " +
                                   std::to_string(x.cols) + " channels, the cache holds " +
                                   std::to_string(shape_.channels()));
  require_finite(x.data, shape_.prefix + " " + std::string(to_string(which)) + " cache input");
  return do_store(which, x);
}

Matrix KvCacheMethod::read(KvWhich which, const QuantizedMatrix& stored) const {
  if (!processed_) throw Error(shape_.prefix, "KV read before process_weights_after_loading");
  if (stored.cols != shape_.channels())
    throw Error(shape_.prefix, "stored rows have " + std::to_string(stored.cols) + " channels");
  return do_read(which, stored);
}

const HostTensor* KvCacheMethod::find_loaded(const std::string& name) const {
  const auto it = loaded_.find(name);
  return it == loaded_.end() ? nullptr : &it->second;
}

const HostTensor& KvCacheMethod::loaded(const std::string& name) const {
  const HostTensor* t = find_loaded(name);
  if (!t) throw Error(where(name), "missing");
  return *t;
}

QuantizedMatrix UnquantizedKvCacheMethod::do_store(KvWhich, const Matrix& x) const {
  // The model dtype's values are all multiples of 2^-149 (fp32) or coarser; a lattice of 2^-133
  // covers bf16/fp16 normal ranges used by activations, but a subnormal fp32 would not fit in
  // int64 codes. Store the rounded values with one scale per element instead: code 1 * value.
  const Arith a = arith_of(shape().model_dtype, shape().prefix);
  QuantizedMatrix q;
  q.rows = x.rows;
  q.cols = x.cols;
  q.codes.assign(x.data.size(), 1);
  q.lattice = 1.0;
  q.block_rows = 1;
  q.block_cols = 1;
  q.scales = Matrix(x.rows, x.cols);
  for (size_t i = 0; i < x.data.size(); ++i) {
    const double v = a == Arith::kFp64 ? x.data[i]
                     : a == Arith::kFp32
                         ? static_cast<double>(static_cast<float>(x.data[i]))
                         : codec::round_to(a == Arith::kBf16 ? codec::kBF16 : codec::kFP16,
                                           x.data[i], codec::Overflow::kNonSaturating);
    q.scales.data[i] = v;
  }
  return q;
}

Matrix UnquantizedKvCacheMethod::do_read(KvWhich, const QuantizedMatrix& stored) const {
  return dequantize(stored);
}

}  // namespace qparity::reference
