#include "schemes/int/w8a8_static.h"

#include <algorithm>
#include <climits>
#include <cmath>
#include <cstring>

#include "core/error.h"

namespace qparity::reference {

W8A8StaticRules w8a8_static_rules(Dialect d) {
  W8A8StaticRules r;
  r.producer = ms_int_rules(d);
  switch (d) {
    case Dialect::kIdeal:
      r.act_scale_use = ScaleUse::kDivide;
      r.act_arith = Arith::kFp64;
      break;
    case Dialect::kVllm:
      r.input_scale_in_model_dtype = true;
      [[fallthrough]];
    case Dialect::kMsModelSlim:
    case Dialect::kCompressedTensors:
    case Dialect::kSglang:
      r.act_scale_use = ScaleUse::kMultiplyReciprocal;
      r.act_arith = Arith::kFp32;
      break;
  }
  r.act_round = IntRound::kHalfEven;
  return r;
}

int64_t deq_scale_to_i64(double f32_value) {
  const float f = static_cast<float>(f32_value);
  int32_t bits = 0;
  std::memcpy(&bits, &f, sizeof bits);
  return static_cast<int64_t>(bits);  // sign extension, as np.int32 -> np.int64
}

std::vector<double> decode_deq_scale(const TensorView& t, const std::string& where) {
  std::vector<double> v;
  if (t.dtype == DType::kI64) {
    for (const int64_t x : decode_ints(t, where)) {
      const auto lo = static_cast<uint32_t>(static_cast<uint64_t>(x) & 0xffffffffu);
      const auto lo_signed = static_cast<int32_t>(lo);
      if (x != static_cast<int64_t>(lo_signed) && x != static_cast<int64_t>(lo))
        throw Error(where, "int64 value " + std::to_string(x) + " at element " +
                               std::to_string(v.size()) +
                               " is not an fp32 bit pattern widened to int64");
      float f = 0;
      std::memcpy(&f, &lo, sizeof f);
      v.push_back(static_cast<double>(f));
    }
  } else {
    v = decode(t, where);
  }
  for (size_t i = 0; i < v.size(); ++i)
    if (!std::isfinite(v[i]) || !(v[i] > 0.0))
      throw Error(where, "deq_scale " + std::to_string(v[i]) + " at element " + std::to_string(i) +
                             " (must be finite and > 0)");
  return v;
}

TensorMap quantize_w8a8_static(const QuantizeRequest& req) {
  const Matrix& w = req.weight;
  const int64_t n = w.rows, k = w.cols;
  if (n <= 0 || k <= 0) throw Error(req.where, "w8a8 needs a non-empty weight");
  require_finite(w.data, req.where);
  if (!req.activations)
    throw Error(req.where,
                "w8a8 static needs calibration statistics (request.activations: "
                "min/max of the layer input)");
  if (req.weights && (req.weights->num_bits != 8 || req.weights->type != QuantType::kInt ||
                      !req.weights->symmetric || req.weights->strategy != QuantStrategy::kChannel))
    throw Error(req.where, "msModelSlim W8A8 weights are int8 symmetric per channel (args say " +
                               describe(*req.weights) + ")");
  const MsIntRules pr = w8a8_static_rules(req.dialect).producer;
  const Arith a = pr.arith;
  // Activations: asymmetric per tensor (§5.2); the scale comes back as the stored fp32 value.
  const MsIntQParams in_p = ms_int_qparams(req.activations->min, req.activations->max,
                                           /*symmetric=*/false, pr);
  std::vector<int64_t> codes(static_cast<size_t>(n * k));
  std::vector<double> deq(static_cast<size_t>(n));
  std::vector<int64_t> qbias(static_cast<size_t>(n));
  if (req.bias && static_cast<int64_t>(req.bias->size()) != n)
    throw Error(req.where, "bias has " + std::to_string(req.bias->size()) +
                               " elements, N = " + std::to_string(n));
  if (req.bias) require_finite(*req.bias, req.where + " bias");
  for (int64_t r = 0; r < n; ++r) {
    const double amax = absmax(w.row(r));
    // Weight scale: fp32 (tool) or fp64 (ideal, not stored in v1 files, kept exact).
    const double qmax = 127.0;
    const double sw = std::max(div_in(a, amax, qmax), kFltEpsilon);
    int64_t sum_q = 0;
    for (int64_t c = 0; c < k; ++c) {
      const double scaled = div_in(a, w(r, c), sw);
      const int64_t q = quantize_int(scaled, pr.round, -128, 127);
      codes[static_cast<size_t>(r * k + c)] = q;
      sum_q += q;
    }
    const double d = to_f32(mul_in(a, in_p.scale, sw));
    deq[static_cast<size_t>(r)] = d;
    const double b = req.bias ? (*req.bias)[static_cast<size_t>(r)] : 0.0;
    const double corr = in(a, static_cast<double>(sum_q) * in_p.offset);
    const double qb = round_int(sub_in(a, div_in(a, b, d), corr), pr.round);
    if (!(qb >= INT32_MIN && qb <= INT32_MAX))
      throw Error(req.where, "quant_bias " + std::to_string(qb) + " of output channel " +
                                 std::to_string(r) +
                                 " does not fit int32 (bias/deq_scale too large)");
    qbias[static_cast<size_t>(r)] = static_cast<int64_t>(qb);
  }
  TensorMap out;
  out["weight"] = encode_ints(DType::kI8, {n, k}, codes, req.where);
  const double s_in = in_p.scale, off_in = in_p.offset;
  out["input_scale"] = encode(DType::kF32, {1}, {&s_in, 1}, Encoding::kExact, "input_scale");
  out["input_offset"] = encode(DType::kF32, {1}, {&off_in, 1}, Encoding::kExact, "input_offset");
  if (req.model_dtype == DType::kF16) {
    std::vector<int64_t> bits(deq.size());
    for (size_t i = 0; i < deq.size(); ++i)
      bits[i] = deq_scale_to_i64(deq[i]);
    out["deq_scale"] = encode_ints(DType::kI64, {n}, bits, "deq_scale");
  } else {
    out["deq_scale"] = encode(DType::kF32, {n}, deq, Encoding::kExact, "deq_scale");
  }
  out["quant_bias"] = encode_ints(DType::kI32, {n}, qbias, "quant_bias");
  add_bias(out, req, DType::kF32);  // msModelSlim writes biases as FLOAT
  return out;
}

Matrix dequantize_w8a8_static(const TensorMap& t, const std::string& where) {
  const auto find = [&](const std::string& name) -> const HostTensor& {
    return tensor_in(t, name, where);
  };
  const HostTensor& wt = find("weight");
  if (wt.shape.size() != 2) throw Error(where + ".weight", "expected [N, K]");
  const int64_t n = wt.shape[0], k = wt.shape[1];
  const auto q = decode_ints(wt.view(), where + ".weight");
  const auto deq = decode_deq_scale(find("deq_scale").view(), where + ".deq_scale");
  const double s_in = decode(find("input_scale").view(), where + ".input_scale").at(0);
  if (static_cast<int64_t>(deq.size()) != n)
    throw Error(where + ".deq_scale", "expected " + std::to_string(n) + " elements");
  Matrix out(n, k);
  for (int64_t r = 0; r < n; ++r)
    for (int64_t c = 0; c < k; ++c)
      out(r, c) = static_cast<double>(q[static_cast<size_t>(r * k + c)]) *
                  (deq[static_cast<size_t>(r)] / s_in);
  return out;
}

W8A8StaticLinearMethod::W8A8StaticLinearMethod(LinearShape shape, MethodConfig config)
    : LinearMethod(std::move(shape), std::move(config)) {
  const SchemeId id = this->config().scheme;
  if (id.kind != SchemeKind::kW8A8Static && id.kind != SchemeKind::kW8A8S)
    throw Error(this->shape().prefix, "W8A8StaticLinearMethod built for scheme " + to_string(id));
  rules_ = w8a8_static_rules(dialect());
}

std::vector<ParamSpec> W8A8StaticLinearMethod::create_weights(int64_t partition) const {
  const auto& s = shape();
  const int64_t n = s.partitions.at(static_cast<size_t>(partition));
  const std::vector<DType> fl = {DType::kF32, DType::kF16, DType::kBF16};
  const std::vector<DType> deq = s.model_dtype == DType::kF16
                                     ? std::vector<DType>{DType::kI64, DType::kF32}
                                     : std::vector<DType>{DType::kF32, DType::kI64};
  return {{"weight", {DType::kI8}, {n, s.in_features}, true, "int8 symmetric per channel"},
          {"input_scale", fl, {1}, true, "asymmetric per-tensor activation scale"},
          {"input_offset",
           {DType::kF32, DType::kF16, DType::kBF16, DType::kI8},
           {1},
           true,
           "integral, in [-128, 127]"},
          {"deq_scale", deq, {n}, true, "I64 = fp32 bits (fp16 models), F32 (bf16 models)"},
          {"quant_bias", {DType::kI32}, {n}, true, "bias folded with the input offset"},
          {"weight_scale", fl, {n, 1}, false, "v0 only; informational", {{n}}},
          {"weight_offset", fl, {n, 1}, false, "v0 only; zeros", {{n}}},
          bias_spec(s, partition)};
}

void W8A8StaticLinearMethod::process() {
  const auto& s = shape();
  const int64_t k = s.in_features, n_all = s.out_features();
  for (int64_t e = 0; e < s.expert_count(); ++e) {
    Expert ex;
    ex.weight.rows = n_all;
    ex.weight.cols = k;
    ex.weight.lattice = 1.0;
    ex.weight.block_rows = n_all;
    ex.weight.block_cols = k;
    ex.weight.scales = Matrix(1, 1, 1.0);
    ex.weight.codes.reserve(static_cast<size_t>(n_all * k));
    for (int64_t p = 0; p < s.partition_count(); ++p) {
      const auto q = decode_ints(loaded("weight", p, e).view(), where("weight", p, e));
      ex.weight.codes.insert(ex.weight.codes.end(), q.begin(), q.end());
      const double sc =
          decode(loaded("input_scale", p, e).view(), where("input_scale", p, e)).at(0);
      if (!std::isfinite(sc) || !(sc > 0.0))
        throw Error(where("input_scale", p, e),
                    "input_scale " + std::to_string(sc) + " (must be finite and > 0)");
      const double off =
          decode(loaded("input_offset", p, e).view(), where("input_offset", p, e)).at(0);
      if (!std::isfinite(off) || off != std::floor(off) || off < -128.0 || off > 127.0)
        throw Error(where("input_offset", p, e),
                    "input_offset " + std::to_string(off) +
                        " must be an integer in [-128, 127] (it is loaded as int8)");
      if (p == 0) {
        ex.input_scale = sc;
        ex.input_offset = off;
      } else if (sc != ex.input_scale || off != ex.input_offset) {
        throw Error(where(sc != ex.input_scale ? "input_scale" : "input_offset", p, e),
                    "differs from " + where("input_scale", 0, e) +
                        " / input_offset: the partitions of a fused layer share one input and "
                        "one activation quantization");
      }
      const auto deq = decode_deq_scale(loaded("deq_scale", p, e).view(), where("deq_scale", p, e));
      ex.deq_scale.insert(ex.deq_scale.end(), deq.begin(), deq.end());
      const auto qb = decode_ints(loaded("quant_bias", p, e).view(), where("quant_bias", p, e));
      ex.quant_bias.insert(ex.quant_bias.end(), qb.begin(), qb.end());
      if (const HostTensor* ws = find_loaded("weight_scale", p, e)) {
        const auto v = decode(ws->view(), where("weight_scale", p, e));
        for (size_t i = 0; i < v.size(); ++i)
          if (!std::isfinite(v[i]) || !(v[i] > 0.0))
            throw Error(where("weight_scale", p, e), "scale " + std::to_string(v[i]) +
                                                         " at element " + std::to_string(i) +
                                                         " (scales must be finite and > 0)");
      }
      if (const HostTensor* wo = find_loaded("weight_offset", p, e))
        require_finite(decode(wo->view(), where("weight_offset", p, e)),
                       where("weight_offset", p, e));
      // `bias` (if present) is already inside quant_bias: checked for finiteness only.
      if (const HostTensor* b = find_loaded("bias", p, e))
        require_finite(decode(b->view(), where("bias", p, e)), where("bias", p, e));
    }
    if (rules_.input_scale_in_model_dtype)
      ex.input_scale = in(arith_of(s.model_dtype, s.prefix), ex.input_scale);
    ex.weight.compact();
    experts_.push_back(std::move(ex));
  }
}

W8A8StaticLinearMethod::StaticActivation W8A8StaticLinearMethod::static_activation(
    int64_t expert) const {
  const Expert& ex = experts_.at(static_cast<size_t>(expert));
  const auto& s = shape();
  StaticActivation a;
  a.scale = ex.input_scale;
  a.offset = ex.input_offset;
  a.divide = rules_.act_scale_use == ScaleUse::kDivide;
  a.arith = rules_.act_arith;
  if (!a.divide)
    a.factor = rules_.input_scale_in_model_dtype
                   ? div_in(arith_of(s.model_dtype, s.prefix), 1.0, ex.input_scale)
                   : div_in(rules_.act_arith, 1.0, ex.input_scale);
  return a;
}

std::optional<ProcessedIntWeight> W8A8StaticLinearMethod::processed_int_weight(
    int64_t expert) const {
  const Expert& ex = experts_.at(static_cast<size_t>(expert));
  ProcessedIntWeight w = int_weight_of(ex.weight, ex.weight.cols, 8, IntCodes::kZeroFree);
  // The effective per-row weight scale: what the engine's epilogue multiplies is deq_scale.
  w.scale = ex.deq_scale;
  w.zero.assign(w.scale.size(), 0.0);
  return w;
}

QuantizedMatrix W8A8StaticLinearMethod::quantize_codes(const Matrix& x, const Expert& ex) const {
  const auto& s = shape();
  QuantizedMatrix q;
  q.rows = x.rows;
  q.cols = x.cols;
  q.lattice = 1.0;
  q.block_rows = 1;
  q.block_cols = x.cols;
  q.scales = Matrix(x.rows, 1, ex.input_scale);
  q.codes.resize(x.data.size());
  double scaled_factor = 0.0;  // 1/s in the rule's precision (reciprocal rules)
  if (rules_.act_scale_use == ScaleUse::kMultiplyReciprocal)
    scaled_factor = rules_.input_scale_in_model_dtype
                        ? div_in(arith_of(s.model_dtype, s.prefix), 1.0, ex.input_scale)
                        : div_in(rules_.act_arith, 1.0, ex.input_scale);
  for (size_t i = 0; i < x.data.size(); ++i) {
    const double v = rules_.act_scale_use == ScaleUse::kDivide
                         ? div_in(rules_.act_arith, x.data[i], ex.input_scale)
                         : mul_in(rules_.act_arith, x.data[i], scaled_factor);
    q.codes[i] =
        quantize_int(add_in(rules_.act_arith, v, ex.input_offset), rules_.act_round, -128, 127);
  }
  return q;
}

std::optional<QuantizedMatrix> W8A8StaticLinearMethod::do_quantize_input(const Matrix& x,
                                                                         int64_t expert) const {
  return quantize_codes(x, experts_[static_cast<size_t>(expert)]);
}

Matrix W8A8StaticLinearMethod::do_apply(const Matrix& x, int64_t expert) const {
  const Expert& ex = experts_[static_cast<size_t>(expert)];
  QuantizedMatrix xq = quantize_codes(x, ex);
  xq.scales = Matrix(x.rows, 1, 1.0);  // raw integer codes: the GEMM is the int32 accumulator
  Matrix acc = scaled_gemm(xq, ex.weight, /*int32_accumulator=*/true);
  for (int64_t t = 0; t < acc.rows; ++t)
    for (int64_t n = 0; n < acc.cols; ++n) {
      const double total = acc(t, n) + static_cast<double>(ex.quant_bias[static_cast<size_t>(n)]);
      if (total > INT32_MAX || total < INT32_MIN)
        throw Error(shape().prefix, "int32 accumulator overflow adding quant_bias at output (" +
                                        std::to_string(t) + ", " + std::to_string(n) + ")");
      acc(t, n) = total * ex.deq_scale[static_cast<size_t>(n)];
    }
  return acc;
}

Matrix W8A8StaticLinearMethod::do_dequantized_weight(int64_t expert) const {
  const Expert& ex = experts_[static_cast<size_t>(expert)];
  Matrix w(ex.weight.rows, ex.weight.cols);
  for (int64_t r = 0; r < w.rows; ++r) {
    const double sw = ex.deq_scale[static_cast<size_t>(r)] / ex.input_scale;
    for (int64_t c = 0; c < w.cols; ++c)
      w(r, c) = static_cast<double>(ex.weight.code(r, c)) * sw;
  }
  return w;
}

TensorMap W8A8StaticLinearMethod::runtime_tensors() const {
  const auto& s = shape();
  const int64_t n = s.out_features(), k = s.in_features;
  const bool stack = s.num_experts > 0;
  const std::string pre = !stack ? "" : (s.partition_count() == 2 ? "w13_" : "w2_");
  std::vector<int64_t> codes, qb;
  std::vector<double> in_s, in_o, deq;
  for (const Expert& ex : experts_) {
    const auto c = ex.weight.code_vector();
    codes.insert(codes.end(), c.begin(), c.end());
    qb.insert(qb.end(), ex.quant_bias.begin(), ex.quant_bias.end());
    in_s.push_back(ex.input_scale);
    in_o.push_back(ex.input_offset);
    deq.insert(deq.end(), ex.deq_scale.begin(), ex.deq_scale.end());
  }
  auto shp = [&](std::vector<int64_t> d) {
    if (stack) d.insert(d.begin(), s.num_experts);
    return d;
  };
  const std::vector<int64_t> per =
      stack ? std::vector<int64_t>{s.num_experts} : std::vector<int64_t>{1};
  TensorMap out;
  out[pre + "weight"] = encode_ints(DType::kI8, shp({n, k}), codes, s.prefix + " runtime weight");
  out[pre + "input_scale"] = encode(DType::kF64, per, in_s, Encoding::kExact, "input_scale");
  out[pre + "input_offset"] = encode(DType::kF64, per, in_o, Encoding::kExact, "input_offset");
  out[pre + "deq_scale"] = encode(DType::kF64, shp({n}), deq, Encoding::kExact, "deq_scale");
  out[pre + "quant_bias"] = encode_ints(DType::kI32, shp({n}), qb, "quant_bias");
  return out;
}

std::unique_ptr<LinearMethod> make_w8a8_static_method(LinearShape shape, MethodConfig config) {
  return std::make_unique<W8A8StaticLinearMethod>(std::move(shape), std::move(config));
}

}  // namespace qparity::reference
