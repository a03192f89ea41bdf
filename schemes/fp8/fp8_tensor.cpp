#include "schemes/fp8/fp8_tensor.h"

#include <algorithm>
#include <cmath>

#include "core/error.h"

namespace qparity::reference {

namespace {

constexpr Fp8Act kTensorActs[] = {Fp8Act::kNone, Fp8Act::kStatic, Fp8Act::kDynamicTensor,
                                  Fp8Act::kDynamicToken};

std::vector<DType> scale_dtypes(DType first) {
  std::vector<DType> d{first};
  for (DType t : {DType::kF32, DType::kBF16, DType::kF16})
    if (t != first) d.push_back(t);
  return d;
}

bool wants_static_input(const QuantizeRequest& r) {
  if (r.input_activations) return !r.input_activations->is_dynamic();
  return r.activations.has_value();
}

}  // namespace

double fp8_requantize(double q, double s_i, double max_s, const Fp8Rules& rules) {
  if (max_s == 0) return q;  // every partition is zero: nothing to unify
  if (rules.requant_via_fp16) {
    const double dq = in(Arith::kFp16, q * s_i);  // fp32 product, then fp16 (two roundings)
    return fp8_saturate(apply_scale(dq, max_s, ScaleUse::kMultiplyReciprocal, Arith::kFp32));
  }
  // q * s_i is exact in fp64 (a 4-bit code times a stored scale); its quotient by max_s is
  // rounded once, ties exactly.
  return e4m3_of_quotient(q * s_i, 1.0, max_s);
}

TensorMap quantize_fp8_tensor(const QuantizeRequest& r, const Fp8QuantizeOptions& o) {
  const Fp8File file = o.file.value_or(default_fp8_file(r.dialect));
  if (file == Fp8File::kMsModelSlim)
    throw Error(r.where, "msModelSlim writes fp8 weights per channel only (WFP8AFP8_DYNAMIC)");
  check_fp8_weight_args(r.weights, QuantStrategy::kTensor, r.where);
  const Fp8Rules rules = fp8_rules(r.dialect);
  const DType sd = fp8_scale_dtype(file, r.model_dtype);
  const Fp8ScaleRule rule = rules.weight_rule(Fp8Granularity::kTensor, sd, r.model_dtype);
  const int64_t n = r.weight.rows, k = r.weight.cols;
  if (n <= 0 || k <= 0) throw Error(r.where, "empty weight");
  const Fp8Weight q = quantize_weight_fp8(r.weight, n, k, rule, sd);
  TensorMap out;
  out["weight"] = encode(DType::kF8E4M3, {n, k}, q.values.data, Encoding::kExact, r.where);
  out["weight_scale"] = encode(sd, {1}, q.scales.data, Encoding::kNearest, r.where + "_scale");
  if (wants_static_input(r)) {
    if (!r.activations)
      throw Error(r.where, "static input activations need calibration statistics");
    require_finite(std::vector<double>{r.activations->min, r.activations->max},
                   r.where + " activation statistics");
    const double amax = std::max(std::fabs(r.activations->min), std::fabs(r.activations->max));
    Fp8ScaleRule in_rule = rule;
    in_rule.zero_saturates = false;
    if (in_rule.zero_scale == 0) in_rule.zero_scale = dtype_eps(sd);
    const double s = round_to_dtype(fp8_scale(amax, in_rule), sd);
    out["input_scale"] = encode(sd, {1}, std::vector<double>{s}, Encoding::kExact, "input_scale");
  }
  add_bias(out, r, r.model_dtype);
  return out;
}

TensorMap quantize_fp8_tensor(const QuantizeRequest& r) {
  return quantize_fp8_tensor(r, Fp8QuantizeOptions{});
}

Matrix dequantize_fp8_tensor(const TensorMap& t, const std::string& where) {
  const auto w = t.find("weight");
  const auto s = t.find("weight_scale");
  if (w == t.end() || s == t.end()) throw Error(where, "needs weight and weight_scale");
  require_shape(s->second.view(), std::vector<int64_t>{1}, where + "_scale");
  const auto v = load_fp8_values(w->second, where);
  const double sc = load_fp8_scales(s->second, where + "_scale")[0];
  Matrix m(w->second.shape.at(0), w->second.shape.at(1));
  for (size_t i = 0; i < v.size(); ++i)
    m.data[i] = v[i] * sc;
  return m;
}

Fp8TensorLinearMethod::Fp8TensorLinearMethod(LinearShape shape, MethodConfig config)
    : Fp8LinearBase(std::move(shape), config, fp8_rules(config.dialect), kTensorActs) {
  if (file_ == Fp8File::kMsModelSlim)
    throw Error(this->shape().prefix,
                "msModelSlim has no per-tensor fp8 weights (WFP8AFP8_DYNAMIC is per channel)");
  check_fp8_weight_args(this->config().weights, QuantStrategy::kTensor, this->shape().prefix);
}

// ModelOpt writes its per-tensor scales 0-dim (torch.tensor(amax / 448)), compressed-tensors [1].
const std::vector<std::vector<int64_t>> kScalarShapes = {std::vector<int64_t>{}};

std::vector<ParamSpec> Fp8TensorLinearMethod::create_weights(int64_t partition) const {
  const auto& s = shape();
  const DType sd = fp8_scale_dtype(file_, s.model_dtype);
  std::vector<ParamSpec> p{
      {"weight",
       {DType::kF8E4M3},
       {s.partitions.at(static_cast<size_t>(partition)), s.in_features},
       true,
       ""},
      {"weight_scale", scale_dtypes(sd), {1}, true, "w = q * weight_scale", kScalarShapes}};
  if (act_ == Fp8Act::kStatic)
    p.push_back({"input_scale",
                 scale_dtypes(sd),
                 {1},
                 true,
                 "static per-tensor activations",
                 kScalarShapes});
  p.push_back(bias_spec(s, partition));
  return p;
}

void Fp8TensorLinearMethod::process() {
  const auto& s = shape();
  double in_scale = 0.0;
  for (int64_t e = 0; e < s.expert_count(); ++e) {
    Matrix w = load_fused_values(e);
    std::vector<double> sc(static_cast<size_t>(s.partition_count()));
    for (int64_t p = 0; p < s.partition_count(); ++p)
      sc[static_cast<size_t>(p)] =
          load_fp8_scales(loaded("weight_scale", p, e), where("weight_scale", p, e))[0];
    const double max_s = *std::max_element(sc.begin(), sc.end());
    if (s.partition_count() > 1) {
      for (int64_t p = 0; p < s.partition_count(); ++p) {
        const int64_t r0 = s.partition_offset(p);
        const int64_t r1 = r0 + s.partitions[static_cast<size_t>(p)];
        for (int64_t r = r0; r < r1; ++r)
          for (int64_t c = 0; c < s.in_features; ++c)
            w(r, c) = fp8_requantize(w(r, c), sc[static_cast<size_t>(p)], max_s, rules_);
      }
    }
    QuantizedMatrix q;
    q.rows = w.rows;
    q.cols = w.cols;
    q.codes = fp8_lattice_codes(w.data);
    q.lattice = kFp8Lattice;
    q.block_rows = w.rows;
    q.block_cols = w.cols;
    q.scales = Matrix(1, 1, max_s);
    q.compact();
    experts_.push_back(std::move(q));
    unified_scales_.push_back(max_s);
    biases_.push_back(loaded_bias(e));
    if (act_ == Fp8Act::kStatic)
      for (int64_t p = 0; p < s.partition_count(); ++p) {
        const double v =
            load_fp8_scales(loaded("input_scale", p, e), where("input_scale", p, e))[0];
        if (v == 0) throw Error(where("input_scale", p, e), "a static input scale must be > 0");
        in_scale = std::max(in_scale, v);
      }
  }
  static_input_scale_ = in_scale;
}

TensorMap Fp8TensorLinearMethod::runtime_tensors() const {
  const auto& s = shape();
  TensorMap t;
  const std::string pre = s.num_experts > 0 ? moe_name() + "_" : "";
  t[pre + "weight"] = runtime_weight();
  std::vector<int64_t> sh{s.num_experts > 0 ? s.num_experts : 1};
  t[pre + "weight_scale"] =
      encode(DType::kF32, sh, unified_scales_, Encoding::kExact, pre + "weight_scale");
  if (act_ == Fp8Act::kStatic)
    t[pre + "input_scale"] = encode(DType::kF32, {1}, std::vector<double>{static_input_scale_},
                                    Encoding::kExact, pre + "input_scale");
  return t;
}

std::unique_ptr<LinearMethod> make_fp8_tensor_method(LinearShape shape, MethodConfig config) {
  return std::make_unique<Fp8TensorLinearMethod>(std::move(shape), std::move(config));
}

}  // namespace qparity::reference
