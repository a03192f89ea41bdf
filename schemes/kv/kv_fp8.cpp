#include "schemes/kv/kv_fp8.h"

#include <cmath>

#include "core/codecs/float_format.h"
#include "core/error.h"

namespace qparity::reference {

KvFp8Rules kv_fp8_rules(Dialect d) {
  KvFp8Rules r;
  r.dialect = d;
  switch (d) {
    case Dialect::kIdeal:
      break;
    case Dialect::kCompressedTensors:
      r.store_in_model_dtype = true;
      r.read_in_model_dtype = true;
      break;
    case Dialect::kVllm:
    case Dialect::kMsModelSlim:
      r.store_arith = Arith::kFp32;
      r.read_fp32_then_model = true;
      break;
    case Dialect::kSglang:
      r.store_in_model_dtype = true;
      r.store_saturates = false;
      r.read_arith = Arith::kFp32;
      break;
  }
  return r;
}

namespace {

TensorMap kv_fp8_scales(const std::vector<double>& k_amax, const std::vector<double>& v_amax,
                        std::vector<int64_t> shape, DType scale_dtype, DType model_dtype,
                        Dialect dialect) {
  const Fp8Rules rules = fp8_rules(dialect);
  Fp8ScaleRule rule = rules.weight_rule(Fp8Granularity::kTensor, scale_dtype, model_dtype);
  rule.zero_saturates = false;
  if (rule.zero_scale == 0) rule.zero_scale = dtype_eps(scale_dtype);
  TensorMap out;
  for (auto [name, amax] : {std::pair<const char*, const std::vector<double>*>{"k_scale", &k_amax},
                            {"v_scale", &v_amax}}) {
    std::vector<double> s;
    for (double a : *amax) {
      if (!std::isfinite(a) || a < 0) throw Error(name, "calibration amax must be finite and >= 0");
      s.push_back(round_to_dtype(fp8_scale(a, rule), scale_dtype));
    }
    out[name] = encode(scale_dtype, shape, s, Encoding::kExact, name);
  }
  return out;
}

}  // namespace

TensorMap quantize_kv_fp8(double k_amax, double v_amax, DType scale_dtype, DType model_dtype,
                          Dialect dialect) {
  return kv_fp8_scales({k_amax}, {v_amax}, {1}, scale_dtype, model_dtype, dialect);
}

TensorMap quantize_kv_fp8_per_head(const std::vector<double>& k_amax,
                                   const std::vector<double>& v_amax, DType scale_dtype,
                                   DType model_dtype, Dialect dialect) {
  if (k_amax.empty() || k_amax.size() != v_amax.size())
    throw Error("kv-fp8-head", "needs one K and one V amax per KV head, got " +
                                   std::to_string(k_amax.size()) + " and " +
                                   std::to_string(v_amax.size()));
  const int64_t h = static_cast<int64_t>(k_amax.size());
  return kv_fp8_scales(k_amax, v_amax, {h, 1, 1}, scale_dtype, model_dtype, dialect);
}

KvFp8CacheMethod::KvFp8CacheMethod(KvShape shape, MethodConfig config)
    : KvCacheMethod(std::move(shape), std::move(config)),
      rules_(kv_fp8_rules(this->config().dialect)) {
  arith_of(this->shape().model_dtype, this->shape().prefix);
}

std::vector<ParamSpec> KvFp8CacheMethod::create_weights() const {
  const DType m = shape().model_dtype;
  std::vector<DType> d{m};
  for (DType t : {DType::kF32, DType::kBF16, DType::kF16})
    if (t != m) d.push_back(t);
  if (per_head()) {
    const int64_t h = shape().num_kv_heads;
    return {{"k_scale", d, {h, 1, 1}, true, "one scale per KV head", {{h}}},
            {"v_scale", d, {h, 1, 1}, true, "one scale per KV head", {{h}}}};
  }
  const std::vector<std::vector<int64_t>> scalar = {std::vector<int64_t>{}};
  return {{"k_scale", d, {1}, false, "k_scale, k_proj.output_scale or k_proj.k_scale"},
          {"v_scale", d, {1}, false, "v_scale, v_proj.output_scale or v_proj.v_scale"},
          {"k_proj.output_scale", d, {1}, false, "older llm-compressor name of k_scale"},
          {"v_proj.output_scale", d, {1}, false, "older llm-compressor name of v_scale"},
          {"k_proj.k_scale", d, {1}, false, "ModelOpt's name of k_scale (0-dim)", scalar},
          {"v_proj.v_scale", d, {1}, false, "ModelOpt's name of v_scale (0-dim)", scalar}};
}

void KvFp8CacheMethod::process() {
  // The scale under exactly one of its names (compressed-tensors, older llm-compressor, ModelOpt).
  auto pick = [&](const std::string& a, const std::string& b, const std::string& c) {
    const HostTensor* found = nullptr;
    std::string name;
    for (const std::string& n : {a, b, c})
      if (const HostTensor* t = find_loaded(n)) {
        if (found) throw Error(where(n), "both " + name + " and " + n + " are present");
        found = t;
        name = n;
      }
    if (!found)
      throw Error(where(a), "missing: kv-fp8 needs " + a + " (or " + b + ", or " + c + ")");
    const std::string w = where(name);
    const auto v = decode(found->view(), w);
    require_finite(v, w);
    for (size_t i = 0; i < v.size(); ++i)
      if (!(v[i] > 0))
        throw Error(w, "KV scale must be > 0, got " + std::to_string(v[i]) +
                           (v.size() > 1 ? " (head " + std::to_string(i) + ")" : ""));
    return v;
  };
  k_scale_ = pick("k_scale", "k_proj.output_scale", "k_proj.k_scale");
  v_scale_ = pick("v_scale", "v_proj.output_scale", "v_proj.v_scale");
}

double KvFp8CacheMethod::scale(KvWhich which) const {
  if (per_head())
    throw Error(shape().prefix, "kv-fp8-head has one scale per KV head, not per tensor");
  return (which == KvWhich::kKey ? k_scale_ : v_scale_).at(0);
}

double KvFp8CacheMethod::head_scale(KvWhich which, int64_t h) const {
  const std::vector<double>& s = which == KvWhich::kKey ? k_scale_ : v_scale_;
  return per_head() ? s.at(static_cast<size_t>(h)) : s.at(0);
}

QuantizedMatrix KvFp8CacheMethod::do_store(KvWhich which, const Matrix& x) const {
  const int64_t d = shape().head_dim;
  const Arith m = arith_of(shape().model_dtype, shape().prefix);
  const std::string w = shape().prefix + " " + std::string(to_string(which)) + " cache";
  std::vector<double> v(x.data.size());
  for (size_t i = 0; i < v.size(); ++i) {
    const double s = head_scale(which, static_cast<int64_t>(i % static_cast<size_t>(x.cols)) / d);
    double t;
    if (rules_.store_in_model_dtype) {
      t = in(m, div_in(Arith::kFp32, x.data[i], s));  // fp32 quotient rounded to the model dtype
    } else if (rules_.store_arith == Arith::kFp64 && rules_.store_saturates && s > 0) {
      v[i] = e4m3_of_quotient(x.data[i], 1.0, s);  // the exact x/s rounded once (ideal)
      continue;
    } else {
      t = div_in(rules_.store_arith, x.data[i], s);
    }
    if (!rules_.store_saturates) {
      if (std::fabs(t) > 464.0)
        throw Error(w, "element " + std::to_string(i) + ": x/s = " + std::to_string(t) +
                           " is beyond 464; SGLang's unclamped .to(float8_e4m3fn) stores NaN");
      v[i] = codec::round_to(codec::kE4M3FN, t, codec::Overflow::kNonSaturating);
    } else {
      v[i] = fp8_saturate(t, w);
    }
  }
  QuantizedMatrix q;
  q.rows = x.rows;
  q.cols = x.cols;
  q.codes = fp8_lattice_codes(v);
  q.lattice = kFp8Lattice;
  // One scale block per KV head (per tensor: one block of every column).
  q.block_rows = std::max<int64_t>(x.rows, 1);
  q.block_cols = per_head() ? d : std::max<int64_t>(x.cols, 1);
  const int64_t blocks = per_head() ? shape().num_kv_heads : 1;
  q.scales = Matrix(x.rows > 0 ? 1 : 0, blocks);
  for (int64_t h = 0; h < (x.rows > 0 ? blocks : 0); ++h)
    q.scales(0, h) = head_scale(which, h);
  return q;
}

Matrix KvFp8CacheMethod::do_read(KvWhich which, const QuantizedMatrix& stored) const {
  const Arith m = arith_of(shape().model_dtype, shape().prefix);
  const int64_t d = shape().head_dim;
  Matrix out(stored.rows, stored.cols);
  for (int64_t r = 0; r < stored.rows; ++r)
    for (int64_t c = 0; c < stored.cols; ++c) {
      const double s = head_scale(which, c / d);
      const double q = static_cast<double>(stored.code(r, c)) * stored.lattice;
      double v;
      if (rules_.read_in_model_dtype)
        v = mul_in(m, q, s);
      else if (rules_.read_fp32_then_model)
        v = in(m, mul_in(Arith::kFp32, q, s));
      else
        v = mul_in(rules_.read_arith, q, s);
      out(r, c) = v;
    }
  return out;
}

std::unique_ptr<KvCacheMethod> make_kv_fp8_method(KvShape shape, MethodConfig config) {
  return std::make_unique<KvFp8CacheMethod>(std::move(shape), std::move(config));
}

}  // namespace qparity::reference
