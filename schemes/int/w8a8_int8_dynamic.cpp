#include "schemes/int/w8a8_int8_dynamic.h"

#include <algorithm>
#include <cmath>

#include "core/codecs/float_format.h"
#include "core/error.h"
#include "schemes/description/quant_plan.h"
#include "schemes/int/pack_quantized_int.h"

namespace qparity::reference {

namespace {

size_t sz(int64_t v) {
  return static_cast<size_t>(v);
}

QuantArgs preset_weights() {
  return *implied_args(SchemeId{SchemeKind::kW8A8Int8, 0}).weights;
}
QuantArgs preset_inputs() {
  return *implied_args(SchemeId{SchemeKind::kW8A8Int8, 0}).input_activations;
}

void check_weight_args(const QuantArgs& a, bool msmodelslim, const std::string& where) {
  if (a.type != QuantType::kInt || a.num_bits != 8)
    throw Error(where, "w8a8-int8-dyn weights must be int 8-bit, got " + describe(a));
  if (!a.symmetric) throw Error(where, "w8a8-int8-dyn weights must be symmetric");
  if (a.is_dynamic()) throw Error(where, "w8a8-int8-dyn weights must be static");
  if (a.strategy != QuantStrategy::kChannel && a.strategy != QuantStrategy::kTensor)
    throw Error(where, "w8a8-int8-dyn weight strategy must be channel or tensor, got " +
                           std::string(to_string(a.strategy)));
  if (msmodelslim && a.strategy != QuantStrategy::kChannel)
    throw Error(where, "msModelSlim W8A8_DYNAMIC weights are per channel");
}

// Returns true when the inputs are static (strategy tensor).
bool check_input_args(const QuantArgs& a, const std::string& where) {
  if (a.type != QuantType::kInt || a.num_bits != 8)
    throw Error(where, "w8a8-int8-dyn inputs must be int 8-bit, got " + describe(a));
  if (a.is_dynamic()) {
    if (a.strategy != QuantStrategy::kToken)
      throw Error(where, "dynamic inputs must use strategy token, got " +
                             std::string(to_string(a.strategy)));
    if (!a.symmetric) throw Error(where, "dynamic asymmetric per-token inputs are not implemented");
    return false;
  }
  if (a.strategy != QuantStrategy::kTensor)
    throw Error(
        where, "static inputs must use strategy tensor, got " + std::string(to_string(a.strategy)));
  return true;
}

double zero_token_scale(const Int8ActRules& r, DType model_dtype) {
  switch (r.zero_token) {
    case ZeroTokenScale::kOne:
      return 1.0;
    case ZeroTokenScale::kZero:
      return 0.0;
    case ZeroTokenScale::kDtypeEps:
      return int_scale_eps(model_dtype);
  }
  return 1.0;
}

}  // namespace

Int8ActRules int8_act_rules(Dialect d) {
  Int8ActRules r;
  r.dialect = d;
  switch (d) {
    case Dialect::kIdeal:
      break;
    case Dialect::kCompressedTensors:
      r.model_dtype_arith = true;
      r.divisor = 127.5;
      r.zero_token = ZeroTokenScale::kDtypeEps;
      break;
    case Dialect::kVllm:
      r.arith = Arith::kFp32;
      r.multiply_divisor_over_amax = true;
      r.zero_token = ZeroTokenScale::kZero;
      r.static_azp_reciprocal_then_add = true;
      break;
    case Dialect::kSglang:
      r.arith = Arith::kFp32;
      r.multiply_divisor_over_amax = true;
      r.round = IntRound::kHalfAway;
      r.amax_floor = 1e-10;
      r.ignores_static_input = true;
      r.tensor_requant_via_fp8 = true;
      break;
    case Dialect::kMsModelSlim:
      r.arith = Arith::kFp32;
      r.zero_token = ZeroTokenScale::kZero;
      break;
  }
  return r;
}

QuantizedMatrix quantize_int8_per_token(const Matrix& x, const Int8ActRules& r, DType model_dtype) {
  const Arith a = r.model_dtype_arith ? arith_of(model_dtype, "activation") : r.arith;
  QuantizedMatrix q;
  q.rows = x.rows;
  q.cols = x.cols;
  q.codes.assign(sz(x.rows * x.cols), 0);
  q.block_rows = 1;
  q.block_cols = std::max<int64_t>(x.cols, 1);
  q.scales = Matrix(x.rows, 1);
  std::vector<double> xr(sz(x.cols));
  for (int64_t t = 0; t < x.rows; ++t) {
    for (int64_t k = 0; k < x.cols; ++k)
      xr[sz(k)] = in(a, x(t, k));
    double amax = absmax(xr);
    if (r.amax_floor > 0) amax = std::max(amax, in(a, r.amax_floor));
    if (amax == 0) {
      q.scales(t, 0) = zero_token_scale(r, model_dtype);
      continue;
    }
    double s = div_in(a, amax, r.divisor);
    if (s == 0 && r.zero_token == ZeroTokenScale::kDtypeEps) s = int_scale_eps(model_dtype);
    q.scales(t, 0) = s;
    const double m = r.multiply_divisor_over_amax ? div_in(a, r.divisor, amax) : 0.0;
    // ideal: the exact quotient divisor*x/amax rounded once (ties decided exactly), not an fp64
    // quotient rounded a second time (numeric.h int_of_quotient).
    const bool exact = r.dialect == Dialect::kIdeal && a == Arith::kFp64 && s == amax / r.divisor;
    for (int64_t k = 0; k < x.cols; ++k) {
      if (exact) {
        q.codes[sz(t * x.cols + k)] = static_cast<int64_t>(
            std::clamp(int_of_quotient(xr[sz(k)], r.divisor, amax), -128.0, 127.0));
        continue;
      }
      const double v =
          r.multiply_divisor_over_amax ? mul_in(a, xr[sz(k)], m) : div_in(a, xr[sz(k)], s);
      q.codes[sz(t * x.cols + k)] = quantize_int(v, r.round, -128, 127);
    }
  }
  return q;
}

QuantizedMatrix quantize_int8_static(const Matrix& x, double scale, int64_t zero_point,
                                     bool asymmetric, const Int8ActRules& r, DType model_dtype) {
  const Arith a = r.model_dtype_arith ? arith_of(model_dtype, "activation") : r.arith;
  QuantizedMatrix q;
  q.rows = x.rows;
  q.cols = x.cols;
  q.codes.resize(sz(x.rows * x.cols));
  q.block_rows = std::max<int64_t>(x.rows, 1);
  q.block_cols = std::max<int64_t>(x.cols, 1);
  q.scales = Matrix(x.rows > 0 ? 1 : 0, 1, scale);
  const auto z = static_cast<double>(zero_point);
  // ideal: x/s rounded once from the exact quotient (ties decided exactly, numeric.h), then z.
  const bool exact = r.dialect == Dialect::kIdeal && a == Arith::kFp64;
  // vLLM's static_scaled_int8_azp_quant_kernel (an asymmetric config, whatever z's value):
  // x * fp32(1/s) in fp32, rounded to an int32 half-even, z added, saturated to int8.
  const bool reciprocal_then_add = asymmetric && r.static_azp_reciprocal_then_add;
  const double inv = reciprocal_then_add ? div_in(a, 1.0, scale) : 0.0;
  for (int64_t t = 0; t < x.rows; ++t)
    for (int64_t k = 0; k < x.cols; ++k) {
      int64_t code = 0;
      if (exact) {
        code = static_cast<int64_t>(
            std::clamp(int_of_quotient(x(t, k), 1.0, scale) + z, -128.0, 127.0));
      } else if (reciprocal_then_add) {
        // float_to_int32_rn saturates to int32; vLLM's int32 "+ azp" could then wrap (signed
        // overflow, |x/s| >= 2^31 - |z|): not emulated, such a value saturates here as on the GPU.
        const double r32 =
            std::clamp(round_int(mul_in(a, x(t, k), inv), r.round), -2147483648.0, 2147483647.0);
        code = std::clamp<int64_t>(static_cast<int64_t>(r32) + zero_point, -128, 127);
      } else {
        // clamp(round(x/s) + z) == round(clamp(x/s + z)) for an integer z in exact arithmetic;
        // in the dialect's precision the sum is rounded first (compressed-tensors' order).
        const double v = add_in(a, div_in(a, x(t, k), scale), z);
        code = quantize_int(v, r.round, -128, 127);
      }
      q.codes[sz(t * x.cols + k)] = code;
    }
  // The raw int8 codes stay as stored (saturation is visible on them); the zero point is the
  // matrix's, so code() and the GEMM see q - z.
  if (zero_point != 0 && !q.scales.data.empty()) q.zero_points = {zero_point};
  return q;
}

int64_t sglang_int8_requant_code(int64_t q, double s_p, double max_s) {
  const double dq = mul_in(Arith::kFp16, static_cast<double>(q), s_p);
  const double t = mul_in(Arith::kFp32, dq, div_in(Arith::kFp32, 1.0, max_s));
  const double f8 =
      codec::round_to(codec::kE4M3FN, std::clamp(t, -448.0, 448.0), codec::Overflow::kSaturate);
  return std::clamp<int64_t>(static_cast<int64_t>(std::trunc(f8)), -128, 127);
}

TensorMap quantize_w8a8_int8_dynamic(const QuantizeRequest& req) {
  const bool msm = req.dialect == Dialect::kMsModelSlim;
  const QuantArgs wa = req.weights ? *req.weights : preset_weights();
  const QuantArgs ia = req.input_activations ? *req.input_activations : preset_inputs();
  check_weight_args(wa, msm, req.where);
  const bool stat = check_input_args(ia, req.where);
  if (msm && stat) throw Error(req.where, "msModelSlim W8A8_DYNAMIC has dynamic inputs only");
  arith_of(req.model_dtype, req.where);
  require_finite(req.weight.data, req.where);
  const IntWeightRules rules = int_weight_rules(req.dialect);
  const DType sdt = msm ? DType::kF32 : req.model_dtype;
  const int64_t n = req.weight.rows;
  const int64_t k = req.weight.cols;
  const bool channel = wa.strategy == QuantStrategy::kChannel;

  std::vector<IntQParams> qp;
  if (channel) {
    for (int64_t r = 0; r < n; ++r) {
      const auto row = req.weight.row(r);
      const double a = absmax(row);
      qp.push_back(int_qparams(-a, a, 8, true, rules, sdt));
    }
  } else {
    const double a = absmax(req.weight.data);
    qp.push_back(int_qparams(-a, a, 8, true, rules, sdt));
  }
  std::vector<int64_t> codes(sz(n * k));
  for (int64_t r = 0; r < n; ++r)
    for (int64_t c = 0; c < k; ++c)
      codes[sz(r * k + c)] = int_quantize(req.weight(r, c), qp[channel ? sz(r) : 0], 8, rules, sdt);

  TensorMap out;
  out["weight"] = encode_ints(DType::kI8, {n, k}, codes, req.where + ".weight");
  std::vector<double> scales;
  for (const auto& p : qp)
    scales.push_back(p.scale);
  out["weight_scale"] = encode(sdt, channel ? std::vector<int64_t>{n, 1} : std::vector<int64_t>{1},
                               scales, Encoding::kNearest, req.where + ".weight_scale");
  if (msm) {
    const std::vector<double> zeros(sz(n), 0.0);
    out["weight_offset"] =
        encode(DType::kF32, {n, 1}, zeros, Encoding::kExact, req.where + ".weight_offset");
  }
  if (stat) {
    if (!req.activations)
      throw Error(req.where, "static input_activations need calibration statistics");
    const IntQParams ip = int_qparams(req.activations->min, req.activations->max, 8, ia.symmetric,
                                      rules, req.model_dtype);
    const std::vector<double> s = {ip.scale};
    out["input_scale"] =
        encode(req.model_dtype, {1}, s, Encoding::kNearest, req.where + ".input_scale");
    if (!ia.symmetric) {
      const std::vector<int64_t> z = {ip.zero_point};
      out["input_zero_point"] = encode_ints(DType::kI8, {1}, z, req.where + ".input_zero_point");
    }
  }
  add_bias(out, req, msm ? DType::kF32 : req.model_dtype);
  return out;
}

Matrix dequantize_w8a8_int8_dynamic(const TensorMap& tensors, const std::string& where) {
  const auto get = [&](const std::string& name) -> const HostTensor& {
    return tensor_in(tensors, name, where);
  };
  const HostTensor& w = get("weight");
  if (w.shape.size() != 2) throw Error(where + ".weight", "must be [N, K]");
  const auto q = decode_ints(w.view(), where + ".weight");
  const auto s = decode(get("weight_scale").view(), where + ".weight_scale");
  const int64_t n = w.shape[0];
  const int64_t k = w.shape[1];
  if (static_cast<int64_t>(s.size()) != n && s.size() != 1)
    throw Error(where + ".weight_scale", "must have N or 1 elements");
  Matrix out(n, k);
  for (int64_t r = 0; r < n; ++r)
    for (int64_t c = 0; c < k; ++c)
      out(r, c) = static_cast<double>(q[sz(r * k + c)]) * s[s.size() == 1 ? 0 : sz(r)];
  return out;
}

W8A8Int8DynamicLinearMethod::W8A8Int8DynamicLinearMethod(LinearShape shape, MethodConfig config)
    : LinearMethod(std::move(shape), std::move(config)) {
  const std::string& p = this->shape().prefix;
  msmodelslim_ = this->config().format == "msmodelslim";
  const QuantArgs wa = this->config().weights ? *this->config().weights : preset_weights();
  const QuantArgs ia =
      this->config().input_activations ? *this->config().input_activations : preset_inputs();
  check_weight_args(wa, msmodelslim_, p);
  channel_ = wa.strategy == QuantStrategy::kChannel;
  static_input_ = check_input_args(ia, p);
  if (msmodelslim_ && static_input_)
    throw Error(p, "msModelSlim W8A8_DYNAMIC has dynamic inputs only");
  input_symmetric_ = ia.symmetric;
  act_ = int8_act_rules(dialect());
}

std::vector<ParamSpec> W8A8Int8DynamicLinearMethod::create_weights(int64_t partition) const {
  const auto& s = shape();
  const int64_t n = s.partitions.at(sz(partition));
  std::vector<ParamSpec> specs = {{"weight", {DType::kI8}, {n, s.in_features}, true, ""}};
  if (msmodelslim_) {
    specs.push_back(
        {"weight_scale", {DType::kF32, DType::kBF16, DType::kF16}, {n, 1}, true, "fp32"});
    specs.push_back({"weight_offset",
                     {DType::kF32, DType::kBF16, DType::kF16},
                     {n, 1},
                     true,
                     "zeros (symmetric)"});
  } else {
    specs.push_back({"weight_scale",
                     {s.model_dtype, DType::kBF16, DType::kF16, DType::kF32},
                     channel_ ? std::vector<int64_t>{n, 1} : std::vector<int64_t>{1},
                     true,
                     "model dtype"});
    if (static_input_) {
      specs.push_back({"input_scale",
                       {s.model_dtype, DType::kF32, DType::kBF16, DType::kF16},
                       {1},
                       true,
                       "static per-tensor input scale"});
      if (!input_symmetric_)
        specs.push_back({"input_zero_point", {DType::kI8}, {1}, true, "static asymmetric"});
    }
  }
  specs.push_back(bias_spec(s, partition));
  return specs;
}

void W8A8Int8DynamicLinearMethod::process() {
  const auto& s = shape();
  const int64_t k = s.in_features;
  for (int64_t e = 0; e < s.expert_count(); ++e) {
    QuantizedMatrix w;
    w.rows = s.out_features();
    w.cols = k;
    w.codes.resize(sz(w.rows * k));
    w.block_rows = 1;
    w.block_cols = k;
    w.scales = Matrix(w.rows, 1);
    std::vector<double> part_scale;
    for (int64_t p = 0; p < s.partition_count(); ++p) {
      const int64_t off = s.partition_offset(p);
      const int64_t n = s.partitions[sz(p)];
      const auto q = decode_ints(loaded("weight", p, e).view(), where("weight", p, e));
      std::copy(q.begin(), q.end(), w.codes.begin() + off * k);
      const std::string ws = where("weight_scale", p, e);
      const auto sv = decode(loaded("weight_scale", p, e).view(), ws);
      require_finite(sv, ws);
      for (size_t i = 0; i < sv.size(); ++i)
        if (!(sv[i] > 0))
          throw Error(ws, "element " + std::to_string(i) + " = " + std::to_string(sv[i]) +
                              ": scales must be > 0");
      for (int64_t r = 0; r < n; ++r)
        w.scales(off + r, 0) = sv[sv.size() == 1 ? 0 : sz(r)];
      part_scale.push_back(sv[0]);
      if (msmodelslim_) {
        const std::string wo = where("weight_offset", p, e);
        const auto ov = decode(loaded("weight_offset", p, e).view(), wo);
        for (size_t i = 0; i < ov.size(); ++i)
          if (ov[i] != 0)
            throw Error(wo, "element " + std::to_string(i) + " = " + std::to_string(ov[i]) +
                                ": W8A8_DYNAMIC weights are symmetric, offsets must be 0");
      }
    }
    if (!channel_ && act_.tensor_requant_via_fp8) {
      const double max_s = *std::max_element(part_scale.begin(), part_scale.end());
      for (int64_t p = 0; p < s.partition_count(); ++p) {
        const int64_t off = s.partition_offset(p);
        for (int64_t i = off * k; i < (off + s.partitions[sz(p)]) * k; ++i)
          w.codes[sz(i)] = sglang_int8_requant_code(w.codes[sz(i)], part_scale[sz(p)], max_s);
      }
      for (int64_t r = 0; r < w.rows; ++r)
        w.scales(r, 0) = max_s;
    }
    w.compact();
    weights_.push_back(std::move(w));

    double in_s = 1.0;
    int64_t in_z = 0;
    if (static_input_) {
      const Arith a = dialect() == Dialect::kIdeal ? Arith::kFp64 : Arith::kFp32;
      std::vector<double> ss;
      std::vector<int64_t> zs;
      for (int64_t p = 0; p < s.partition_count(); ++p) {
        const std::string wi = where("input_scale", p, e);
        const auto v = decode(loaded("input_scale", p, e).view(), wi);
        require_finite(v, wi);
        if (!(v[0] > 0)) throw Error(wi, "input scale must be > 0, got " + std::to_string(v[0]));
        ss.push_back(v[0]);
        zs.push_back(input_symmetric_ ? 0
                                      : decode_ints(loaded("input_zero_point", p, e).view(),
                                                    where("input_zero_point", p, e))[0]);
      }
      if (input_symmetric_) {
        in_s = *std::max_element(ss.begin(), ss.end());
      } else if (ss.size() == 1) {
        in_s = ss[0];
        in_z = zs[0];
      } else {
        double rmax = -INFINITY, rmin = INFINITY;
        for (size_t i = 0; i < ss.size(); ++i) {
          rmax = std::max(rmax, mul_in(a, ss[i], static_cast<double>(127 - zs[i])));
          rmin = std::min(rmin, mul_in(a, ss[i], static_cast<double>(-128 - zs[i])));
        }
        in_s = div_in(a, sub_in(a, rmax, rmin), 255.0);
        in_z = static_cast<int64_t>(std::trunc(sub_in(a, -128.0, div_in(a, rmin, in_s))));
      }
    }
    input_scale_.push_back(in_s);
    input_zero_.push_back(in_z);
    biases_.push_back(loaded_bias(e));
  }
}

std::optional<QuantizedMatrix> W8A8Int8DynamicLinearMethod::do_quantize_input(
    const Matrix& x, int64_t expert) const {
  if (static_input_ && !act_.ignores_static_input)
    return quantize_int8_static(x, input_scale_[sz(expert)], input_zero_[sz(expert)],
                                !input_symmetric_, act_, shape().model_dtype);
  return quantize_int8_per_token(x, act_, shape().model_dtype);
}

Matrix W8A8Int8DynamicLinearMethod::do_apply(const Matrix& x, int64_t expert) const {
  const QuantizedMatrix xq = *do_quantize_input(x, expert);
  Matrix y = scaled_gemm(xq, weights_[sz(expert)], true);
  const auto& b = biases_[sz(expert)];
  for (int64_t t = 0; t < y.rows; ++t)
    for (int64_t n = 0; n < y.cols; ++n)
      y(t, n) += b[sz(n)];
  return y;
}

Matrix W8A8Int8DynamicLinearMethod::do_dequantized_weight(int64_t expert) const {
  return dequantize(weights_[sz(expert)]);
}

TensorMap W8A8Int8DynamicLinearMethod::runtime_tensors() const {
  const auto& s = shape();
  if (s.num_experts == 0) return {};
  if (s.partition_count() > 2)
    throw Error(s.prefix, "an expert stack has one (w2) or two (w13) partitions");
  const std::string pre = s.partition_count() == 2 ? "w13_" : "w2_";
  std::vector<int64_t> codes;
  std::vector<double> scales;
  for (const auto& w : weights_) {
    const auto c = w.code_vector();
    codes.insert(codes.end(), c.begin(), c.end());
    for (int64_t r = 0; r < w.rows; ++r)
      scales.push_back(w.scales(r, 0));
  }
  const int64_t e = s.expert_count();
  TensorMap out;
  out[pre + "weight"] =
      encode_ints(DType::kI8, {e, s.out_features(), s.in_features}, codes, pre + "weight");
  out[pre + "weight_scale"] = encode(DType::kF32, {e, s.out_features(), 1}, scales,
                                     Encoding::kNearest, pre + "weight_scale");
  return out;
}

std::optional<ProcessedIntWeight> W8A8Int8DynamicLinearMethod::processed_int_weight(
    int64_t expert) const {
  const QuantizedMatrix& m = weights_.at(sz(expert));
  ProcessedIntWeight w = int_weight_of(m, m.cols, 8, IntCodes::kZeroFree);
  w.scale.resize(sz(w.rows));
  for (int64_t r = 0; r < w.rows; ++r)
    w.scale[sz(r)] = m.scale(r, 0);
  w.zero.assign(w.scale.size(), 0.0);
  const auto& b = biases_.at(sz(expert));
  if (std::any_of(b.begin(), b.end(), [](double v) { return v != 0.0; })) w.bias = b;
  return w;
}

std::unique_ptr<LinearMethod> make_w8a8_int8_dynamic_method(LinearShape shape,
                                                            MethodConfig config) {
  return std::make_unique<W8A8Int8DynamicLinearMethod>(std::move(shape), std::move(config));
}

}  // namespace qparity::reference
