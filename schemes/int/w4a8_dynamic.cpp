#include "schemes/int/w4a8_dynamic.h"

#include <algorithm>
#include <cmath>

#include "core/codecs/int_packing.h"
#include "core/error.h"
#include "schemes/description/quant_plan.h"
#include "schemes/int/msmodelslim_int.h"
#include "schemes/math/numeric.h"

namespace qparity::reference {

namespace {

size_t sz(int64_t v) {
  return static_cast<size_t>(v);
}

constexpr int kBits = 4;
constexpr int64_t kChunks = 16;  // process_scale's tp_num

std::string last_component(const std::string& name) {
  const size_t dot = name.rfind('.');
  return dot == std::string::npos ? name : name.substr(dot + 1);
}

void check_args(const MethodConfig& c, const std::string& where) {
  const ImpliedArgs preset = implied_args(SchemeId{SchemeKind::kW4A8Dyn, 0});
  const QuantArgs w = c.weights ? *c.weights : *preset.weights;
  const QuantArgs i = c.input_activations ? *c.input_activations : *preset.input_activations;
  if (w.type != QuantType::kInt || w.num_bits != kBits || !w.symmetric || w.is_dynamic() ||
      w.strategy != QuantStrategy::kChannel)
    throw Error(where,
                "w4a8-dyn weights are static symmetric int 4-bit per channel, got " + describe(w));
  if (i.type != QuantType::kInt || i.num_bits != 8 || !i.symmetric || !i.is_dynamic() ||
      i.strategy != QuantStrategy::kToken)
    throw Error(where,
                "w4a8-dyn inputs are dynamic symmetric int 8-bit per token, got " + describe(i));
}

}  // namespace

int64_t w4a8_scale_bias_columns(std::string_view linear_name) {
  for (const char* n : {"gate_proj", "up_proj", "q_proj", "k_proj", "v_proj"})
    if (linear_name == n) return 1;
  for (const char* n : {"down_proj", "o_proj"})
    if (linear_name == n) return kChunks;
  return 0;
}

double w4a8_weight_scale(double amax, Dialect d) {
  return ms_int_qparams(-amax, amax, true, ms_int_rules(d), kBits).scale;
}

int64_t w4a8_weight_code(double w, double scale, Dialect d) {
  return ms_int_quantize(w, MsIntQParams{scale, 0.0}, ms_int_rules(d), ScaleUse::kDivide, kBits);
}

QuantizedMatrix quantize_w4a8_input(const Matrix& x, Dialect d) {
  const bool exact = d == Dialect::kIdeal;
  QuantizedMatrix q;
  q.rows = x.rows;
  q.cols = x.cols;
  q.codes.assign(sz(x.rows * x.cols), 0);
  q.block_rows = 1;
  q.block_cols = std::max<int64_t>(x.cols, 1);
  q.scales = Matrix(x.rows, 1);
  for (int64_t t = 0; t < x.rows; ++t) {
    double amax = 0.0;
    for (int64_t k = 0; k < x.cols; ++k) {
      const double v = exact ? x(t, k) : in(Arith::kFp32, x(t, k));
      if (!std::isfinite(v))
        throw Error("w4a8-dyn activation", "token " + std::to_string(t) + " element " +
                                               std::to_string(k) + " is not finite");
      amax = std::max(amax, std::fabs(v));
    }
    if (amax == 0) {
      q.scales(t, 0) = 0.0;  // codes stay 0 (defined here; npu_dynamic_quant divides by 0)
      continue;
    }
    if (exact) {
      q.scales(t, 0) = amax / 127.0;
      for (int64_t k = 0; k < x.cols; ++k)
        // The exact 127*x/amax rounded once, ties decided exactly (numeric.h).
        q.codes[sz(t * x.cols + k)] =
            static_cast<int64_t>(std::clamp(int_of_quotient(x(t, k), 127.0, amax), -127.0, 127.0));
    } else {
      const double m = div_in(Arith::kFp32, 127.0, amax);
      q.scales(t, 0) = div_in(Arith::kFp32, 1.0, m);
      for (int64_t k = 0; k < x.cols; ++k)
        q.codes[sz(t * x.cols + k)] =
            quantize_int(mul_in(Arith::kFp32, x(t, k), m), IntRound::kHalfEven, -127, 127);
    }
  }
  return q;
}

std::vector<double> w4a8_scale_bias(std::span<const int64_t> q, std::span<const double> s,
                                    int64_t n, int64_t k, int64_t columns) {
  if (columns != 1 && columns != kChunks)
    throw Error("w4a8-dyn scale_bias", "has 1 or 16 columns, not " + std::to_string(columns));
  if (columns == kChunks && k % kChunks != 0)
    throw Error("w4a8-dyn scale_bias", "16 chunks need K % 16 == 0, K = " + std::to_string(k));
  if (static_cast<int64_t>(q.size()) != n * k || static_cast<int64_t>(s.size()) != n)
    throw Error("w4a8-dyn scale_bias", "codes / scales do not match [N, K]");
  const int64_t len = k / columns;
  std::vector<double> out(sz(n * columns));
  for (int64_t r = 0; r < n; ++r)
    for (int64_t c = 0; c < columns; ++c) {
      int64_t sum = 0;  // exact
      for (int64_t j = c * len; j < (c + 1) * len; ++j)
        sum += q[sz(r * k + j)];
      out[sz(r * columns + c)] = 8.0 * static_cast<double>(sum) * s[sz(r)];
    }
  return out;
}

TensorMap quantize_w4a8_dynamic(const QuantizeRequest& req) {
  MethodConfig c;
  c.weights = req.weights;
  c.input_activations = req.input_activations;
  check_args(c, req.where);
  require_finite(req.weight.data, req.where);
  const int64_t n = req.weight.rows;
  const int64_t k = req.weight.cols;
  if (n % 2 != 0)
    throw Error(req.where + ".weight", "N = " + std::to_string(n) +
                                           " output channels is odd: W4A8_DYNAMIC packs two int4 "
                                           "codes a byte along N");
  const std::string name = last_component(req.where);
  const int64_t cols = w4a8_scale_bias_columns(name);
  if (cols == 0)
    throw Error(req.where + ".scale_bias",
                "msModelSlim's process_scale has a scale_bias rule only for gate/up/q/k/v_proj "
                "([N, 1]) and down_proj / o_proj ([N, 16]); '" +
                    name + "' would get the unsummed [N, K]");
  if (cols == kChunks && k % kChunks != 0)
    throw Error(req.where + ".scale_bias", "K = " + std::to_string(k) +
                                               " is not a multiple of 16: " + name +
                                               "'s scale_bias cuts K into 16 chunks");
  std::vector<double> scales(sz(n));
  std::vector<int64_t> codes(sz(n * k));
  std::vector<int8_t> codes8(sz(n * k));
  for (int64_t r = 0; r < n; ++r) {
    scales[sz(r)] = w4a8_weight_scale(absmax(req.weight.row(r)), req.dialect);
    for (int64_t j = 0; j < k; ++j) {
      const int64_t q = w4a8_weight_code(req.weight(r, j), scales[sz(r)], req.dialect);
      codes[sz(r * k + j)] = q;
      codes8[sz(r * k + j)] = static_cast<int8_t>(q);
    }
  }
  const std::vector<int8_t> packed =
      codec::pack_int4_row_pairs(codes8, sz(n), sz(k), req.where + ".weight");
  const std::vector<int64_t> packed64(packed.begin(), packed.end());
  TensorMap out;
  out["weight"] = encode_ints(DType::kI8, {n / 2, k}, packed64, req.where + ".weight");
  out["weight_scale"] =
      encode(DType::kF32, {n, 1}, scales, Encoding::kExact, req.where + ".weight_scale");
  const std::vector<double> zeros(sz(n), 0.0);
  out["weight_offset"] =
      encode(DType::kF32, {n, 1}, zeros, Encoding::kExact, req.where + ".weight_offset");
  const std::vector<double> sb = w4a8_scale_bias(codes, scales, n, k, cols);
  out["scale_bias"] =
      encode(DType::kF32, {n, cols}, sb, Encoding::kNearest, req.where + ".scale_bias");
  add_bias(out, req, DType::kF32);
  return out;
}

W4A8DynamicLinearMethod::W4A8DynamicLinearMethod(LinearShape shape, MethodConfig config)
    : LinearMethod(std::move(shape), std::move(config)) {
  const auto& s = this->shape();
  check_args(this->config(), s.prefix);
  if (this->config().format != "msmodelslim")
    throw Error(s.prefix, "w4a8-dyn is msModelSlim's W4A8_DYNAMIC layout; format '" +
                              this->config().format + "' has no such checkpoint");
  for (int64_t p = 0; p < s.partition_count(); ++p) {
    const std::string w = where("weight", p, 0);
    const int64_t n = s.partitions[sz(p)];
    if (n % 2 != 0)
      throw Error(w, "N = " + std::to_string(n) +
                         " output channels is odd: W4A8_DYNAMIC packs two int4 codes a byte "
                         "along N");
    if (bias_columns(p) == kChunks && s.in_features % kChunks != 0)
      throw Error(where("scale_bias", p, 0),
                  "K = " + std::to_string(s.in_features) +
                      " is not a multiple of 16: a down_proj / o_proj scale_bias is 16 chunks "
                      "of K / 16 columns");
  }
}

int64_t W4A8DynamicLinearMethod::bias_columns(int64_t partition) const {
  const int64_t c = w4a8_scale_bias_columns(last_component(shape().shard_prefix(0, partition)));
  return c == 0 ? 1 : c;  // other names: [N, 1] first, [N, 16] accepted too
}

std::vector<ParamSpec> W4A8DynamicLinearMethod::create_weights(int64_t partition) const {
  const auto& s = shape();
  const int64_t n = s.partitions.at(sz(partition));
  const int64_t k = s.in_features;
  const int64_t cols = bias_columns(partition);
  ParamSpec scale_bias{
      "scale_bias", {DType::kF32}, {n, cols}, true, "8 * sum_k q * s (per K/16 chunk: [N, 16])"};
  // The other spelling is accepted and checked the same way (its sum per row is the same).
  if (cols == 1 && k % kChunks == 0) scale_bias.alt_shapes = {{n, kChunks}};
  if (cols == kChunks) scale_bias.alt_shapes = {{n, 1}};
  return {{"weight",
           {DType::kI8},
           {n / 2, k},
           true,
           "int4 pairs along N",
           {{n, k}}},  // the pre-1.0.0 unpacked layout: refused by name in process()
          {"weight_scale", {DType::kF32}, {n, 1}, true, "fp32 per channel", {{n}}},
          {"weight_offset", {DType::kF32}, {n, 1}, false, "zeros", {{n}}},
          scale_bias,
          bias_spec(s, partition)};
}

void W4A8DynamicLinearMethod::process() {
  const auto& s = shape();
  const int64_t k = s.in_features;
  for (int64_t e = 0; e < s.expert_count(); ++e) {
    QuantizedMatrix w;
    w.rows = s.out_features();
    w.cols = k;
    w.codes.resize(sz(w.rows * k));
    w.block_rows = 1;
    w.block_cols = std::max<int64_t>(k, 1);
    w.scales = Matrix(w.rows, 1);
    for (int64_t p = 0; p < s.partition_count(); ++p) {
      const int64_t off = s.partition_offset(p);
      const int64_t n = s.partitions[sz(p)];
      const std::string ww = where("weight", p, e);
      const HostTensor& wt = loaded("weight", p, e);
      if (wt.shape[0] == n && n > 0)
        throw Error(ww, "shape " + shape_string(wt.shape) +
                            " holds one int4 a byte (the pre-1.0.0 unpacked W4A8 layout); not "
                            "implemented by the qparity reference, which reads version 1.0.0's "
                            "[N/2, K] packed along N");
      const auto raw = decode_ints(wt.view(), ww);
      const std::vector<int8_t> bytes(raw.begin(), raw.end());
      const std::vector<int8_t> q = codec::unpack_int4_row_pairs(bytes, sz(n), sz(k), ww);
      for (size_t i = 0; i < q.size(); ++i)
        w.codes[sz(off * k) + i] = q[i];

      const std::string ws = where("weight_scale", p, e);
      const std::vector<double> sv = decode(loaded("weight_scale", p, e).view(), ws);
      require_finite(sv, ws);
      for (size_t i = 0; i < sv.size(); ++i)
        if (!(sv[i] > 0))
          throw Error(ws, "element " + std::to_string(i) + " = " + std::to_string(sv[i]) +
                              ": scales must be > 0");
      for (int64_t r = 0; r < n; ++r)
        w.scales(off + r, 0) = sv[sz(r)];

      if (const HostTensor* o = find_loaded("weight_offset", p, e)) {
        const std::string wo = where("weight_offset", p, e);
        const auto ov = decode(o->view(), wo);
        for (size_t i = 0; i < ov.size(); ++i)
          if (ov[i] != 0)
            throw Error(wo, "element " + std::to_string(i) + " = " + std::to_string(ov[i]) +
                                ": W4A8_DYNAMIC weights are symmetric, offsets must be 0");
      }

      // scale_bias: what the NPU adds to cancel its int8 split must be 8 * sum q * s.
      const std::string wb = where("scale_bias", p, e);
      const HostTensor& bt = loaded("scale_bias", p, e);
      const int64_t cols = bt.shape.size() == 2 ? bt.shape[1] : 1;
      const std::vector<double> stored = decode(bt.view(), wb);
      require_finite(stored, wb);
      const std::vector<int64_t> q64(q.begin(), q.end());
      const std::vector<double> exact = w4a8_scale_bias(q64, sv, n, k, cols);
      const int64_t len = k / cols;
      for (int64_t r = 0; r < n; ++r)
        for (int64_t c = 0; c < cols; ++c) {
          int64_t abs_sum = 0;
          for (int64_t j = c * len; j < (c + 1) * len; ++j)
            abs_sum += std::abs(static_cast<int64_t>(q[sz(r * k + j)]));
          const double want = exact[sz(r * cols + c)];
          const double got = stored[sz(r * cols + c)];
          const double tol = 1e-6 * std::fabs(want) + static_cast<double>(len + 1) *
                                                          std::ldexp(1.0, -24) * 8.0 * sv[sz(r)] *
                                                          static_cast<double>(abs_sum);
          if (!(std::fabs(got - want) <= tol))
            throw Error(wb, "row " + std::to_string(r) + " column " + std::to_string(c) + " = " +
                                std::to_string(got) +
                                ", but 8 * sum_k q * weight_scale = " + std::to_string(want) +
                                " (|difference| " + std::to_string(std::fabs(got - want)) +
                                " > tolerance " + std::to_string(tol) +
                                "): the NPU kernel adds scale_bias to cancel its int8 split, so "
                                "this checkpoint would compute a wrong output");
        }
    }
    w.compact();
    weights_.push_back(std::move(w));
    biases_.push_back(loaded_bias(e));
  }
}

std::optional<QuantizedMatrix> W4A8DynamicLinearMethod::do_quantize_input(const Matrix& x,
                                                                          int64_t expert) const {
  (void)expert;
  return quantize_w4a8_input(x, dialect());
}

Matrix W4A8DynamicLinearMethod::do_apply(const Matrix& x, int64_t expert) const {
  const QuantizedMatrix xq = quantize_w4a8_input(x, dialect());
  Matrix y = scaled_gemm(xq, weights_[sz(expert)], true);
  const auto& b = biases_[sz(expert)];
  for (int64_t t = 0; t < y.rows; ++t)
    for (int64_t n = 0; n < y.cols; ++n)
      y(t, n) += b[sz(n)];
  return y;
}

std::optional<ProcessedIntWeight> W4A8DynamicLinearMethod::processed_int_weight(
    int64_t expert) const {
  const QuantizedMatrix& m = weights_.at(sz(expert));
  ProcessedIntWeight w = int_weight_of(m, m.cols, 4, IntCodes::kStored);
  w.scale = m.scales.data;
  w.zero.assign(w.scale.size(), 0.0);
  const auto& b = biases_.at(sz(expert));
  if (std::any_of(b.begin(), b.end(), [](double v) { return v != 0.0; })) w.bias = b;
  return w;
}

Matrix W4A8DynamicLinearMethod::do_dequantized_weight(int64_t expert) const {
  return dequantize(weights_[sz(expert)]);
}

std::unique_ptr<LinearMethod> make_w4a8_dynamic_method(LinearShape shape, MethodConfig config) {
  return std::make_unique<W4A8DynamicLinearMethod>(std::move(shape), std::move(config));
}

}  // namespace qparity::reference
