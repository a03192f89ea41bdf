#include "schemes/fp4/nvfp4.h"

#include <algorithm>
#include <cmath>
#include <cstring>

#include "core/codecs/float_format.h"
#include "core/codecs/int_packing.h"
#include "core/error.h"
#include "schemes/math/mx_scale.h"
#include "schemes/method/parallel.h"

namespace qparity::reference {

namespace {

constexpr double kE2M1Values[8] = {0, 0.5, 1, 1.5, 2, 3, 4, 6};
constexpr double kE2M1Midpoints[7] = {0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5};

// Sign of a*b - m, exactly, for finite doubles with a*b neither overflowing nor underflowing:
// p + e == a*b exactly (fma); p - m is exact when p and m are within a factor 2 (Sterbenz) and
// dominates e otherwise, so the rounded sum has the sign of the exact one.
int sign_of_product_minus(double a, double b, double m) {
  const double p = a * b;
  const double e = std::fma(a, b, -p);
  const double r = (p - m) + e;
  return (r > 0) - (r < 0);
}

// RNE of the real a*g/div (a, g >= 0) onto e4m3fn, saturating at 448, decided exactly.
double e4m3_of_scaled_exact(double a, double g, double div) {
  if (sign_of_product_minus(a, g, div * 448.0) >= 0) return 448.0;
  // A candidate within one e4m3 step of the true value, then exact comparisons with the
  // midpoints on either side (midpoint * div is exact: <= 5 significant bits times 6).
  const double approx = a * g / div;
  uint32_t c = codec::encode(codec::kE4M3FN, std::min(approx, 448.0), codec::Overflow::kSaturate);
  for (int iter = 0; iter < 3; ++iter) {
    const double v = codec::decode(codec::kE4M3FN, c);
    if (c < 0x7E) {
      const double up = codec::decode(codec::kE4M3FN, c + 1);
      const int s = sign_of_product_minus(a, g, div * (v + up) / 2);
      if (s > 0 || (s == 0 && (c & 1u))) {
        ++c;
        continue;
      }
    }
    if (c > 0) {
      const double down = codec::decode(codec::kE4M3FN, c - 1);
      const int s = sign_of_product_minus(a, g, div * (v + down) / 2);
      if (s < 0 || (s == 0 && (c & 1u))) {
        --c;
        continue;
      }
    }
    break;
  }
  return codec::decode(codec::kE4M3FN, c);
}

double e4m3_saturating(double v) {
  return codec::round_to(codec::kE4M3FN, std::min(v, 448.0), codec::Overflow::kSaturate);
}

double fp32_global_scale(double v) {
  return (!std::isfinite(v) || v == 0) ? 1.0 : v;
}

void check_group_args(const std::optional<QuantArgs>& a, int64_t group_size, const std::string& w) {
  if (group_size != 0 && group_size != kNvfp4GroupSize)
    throw Error(w, "NVFP4 has group size 16, not " + std::to_string(group_size));
  if (!a) return;
  if (a->type != QuantType::kFloat || a->num_bits != 4)
    throw Error(w, "NVFP4 needs 4-bit float args, got " + describe(*a));
  if (a->effective_group_size() != kNvfp4GroupSize)
    throw Error(w, "NVFP4 needs group_size 16 in the args, got " + describe(*a));
}

std::vector<double> decode_e2m1_nibbles(const HostTensor& t, int64_t count, const std::string& w) {
  const auto nib = codec::unpack_nibbles(t.bytes, static_cast<size_t>(count), w);
  std::vector<double> v(nib.size());
  for (size_t i = 0; i < nib.size(); ++i)
    v[i] = codec::e2m1_to_double(nib[i]);
  return v;
}

std::vector<double> decode_scales_checked(const HostTensor& t, const std::string& w) {
  for (size_t i = 0; i < t.bytes.size(); ++i)
    if ((t.bytes[i] & 0x7Fu) == 0x7Fu)
      throw Error(w, "element " + std::to_string(i) + " is NaN (byte 0x" +
                         (t.bytes[i] == 0x7F ? std::string("7F") : std::string("FF")) +
                         "): NVFP4 block scales must be finite");
  return decode(t.view(), w);
}

double decode_global_scale(const HostTensor& t, const std::string& w) {
  const double g = decode(t.view(), w).at(0);
  if (!std::isfinite(g) || !(g > 0))
    throw Error(w, "global scale " + std::to_string(g) + " must be finite and > 0");
  return g;
}

// The e2m1 codes (two a byte, low nibble = even element) under `packed_name` and the e4m3 block
// scales as weight_scale: what both producers' layouts store alike.
TensorMap nvfp4_code_tensors(const std::vector<uint8_t>& nibbles, const std::vector<double>& scales,
                             int64_t rows, int64_t cols, const std::string& packed_name,
                             const std::string& where) {
  TensorMap out;
  HostTensor packed;
  packed.dtype = DType::kU8;
  packed.shape = {rows, cols / 2};
  packed.bytes = codec::pack_nibbles(nibbles, where + "." + packed_name);
  out[packed_name] = std::move(packed);
  out["weight_scale"] = encode(DType::kF8E4M3, {rows, cols / kNvfp4GroupSize}, scales,
                               Encoding::kExact, where + ".weight_scale");
  return out;
}

}  // namespace

Nvfp4Rules nvfp4_rules(Dialect d) {
  Nvfp4Rules r;
  switch (d) {
    case Dialect::kIdeal:
      break;
    case Dialect::kCompressedTensors:
    case Dialect::kMsModelSlim:
      r.global_scale_arith = Arith::kFp32;
      r.block_scale = Nvfp4BlockScale::kDivideFp32;
      r.element = Nvfp4ElementScaling::kDivideFp32;
      break;
    case Dialect::kVllm:
    case Dialect::kSglang:
      r.global_scale_arith = Arith::kFp32;
      r.block_scale = Nvfp4BlockScale::kReciprocalSixFp32;
      r.element = Nvfp4ElementScaling::kReciprocalFp32;
      r.zero_block_scale = 0.0;
      r.dense_fused = Nvfp4FusedGlobal::kMax;
      r.moe_fused = Nvfp4FusedGlobal::kShardZeroMinInput;
      break;
  }
  return r;
}

Nvfp4Rules nvfp4_producer_rules(Dialect d, DType model_dtype) {
  Nvfp4Rules r = nvfp4_rules(d);
  if (d == Dialect::kCompressedTensors || d == Dialect::kMsModelSlim)
    r.observer_arith = arith_of(model_dtype, "NVFP4 observer");
  return r;
}

double nvfp4_global_scale(double amax, const Nvfp4Rules& r) {
  if (!(amax >= 0)) throw Error("NVFP4 global scale", "amax must be >= 0");
  if (r.global_scale_arith == Arith::kFp64)
    return fp32_global_scale(in(Arith::kFp32, kNvfp4GlobalNumerator / amax));
  if (r.observer_arith != Arith::kFp32)  // in the observer's dtype, then .to(float32)
    return fp32_global_scale(
        in(Arith::kFp32,
           mul_in(r.observer_arith, div_in(r.observer_arith, 1.0, amax), kNvfp4GlobalNumerator)));
  // compressed-tensors' generate_gparam and vLLM's nvfp4_utils both write
  // `448.0 * 6.0 / amax` with a Python float over a tensor: torch evaluates float / Tensor as
  // amax.reciprocal() * 2688 (Tensor.__rtruediv__), two fp32 roundings, not one division. The
  // device cross-check found the 1-ulp difference (tools/device/crosscheck_quant.py).
  return fp32_global_scale(
      mul_in(Arith::kFp32, div_in(Arith::kFp32, 1.0, amax), kNvfp4GlobalNumerator));
}

double nvfp4_block_scale(double amax16, double gs, const Nvfp4Rules& r) {
  double s = 0.0;
  switch (r.block_scale) {
    case Nvfp4BlockScale::kExact:
      s = e4m3_of_scaled_exact(amax16, gs, 6.0);
      break;
    case Nvfp4BlockScale::kDivideFp32:
      // amax/6 in the observer's dtype, the product with the fp32 global scale in fp32.
      s = e4m3_saturating(mul_in(Arith::kFp32, gs, div_in(r.observer_arith, amax16, 6.0)));
      break;
    case Nvfp4BlockScale::kReciprocalSixFp32:
      s = e4m3_saturating(
          mul_in(Arith::kFp32, gs, mul_in(Arith::kFp32, amax16, in(Arith::kFp32, 1.0 / 6.0))));
      break;
  }
  return s == 0 ? r.zero_block_scale : s;
}

double e2m1_of_scaled_exact(double x, double g, double s) {
  const double a = std::fabs(x);
  int code = 0;
  for (int i = 0; i < 7; ++i) {
    const int c = sign_of_product_minus(a, g, kE2M1Midpoints[i] * s);
    if (c < 0) break;
    if (c == 0) {  // a tie: the even code of the two neighbours
      code = (i % 2 == 0) ? i : i + 1;
      break;
    }
    code = i + 1;
  }
  const double v = kE2M1Values[code];
  return std::signbit(x) ? -v : v;
}

double nvfp4_quantize_element(double x, double s, double gs, const Nvfp4Rules& r) {
  double t = 0.0;
  switch (r.element) {
    case Nvfp4ElementScaling::kExact:
      if (s == 0) return std::signbit(x) ? -0.0 : 0.0;
      return e2m1_of_scaled_exact(x, gs, s);
    case Nvfp4ElementScaling::kDivideFp32:
      t = div_in(Arith::kFp32, x, div_in(Arith::kFp32, s, gs));
      break;
    case Nvfp4ElementScaling::kReciprocalFp32: {
      const double m = mul_in(Arith::kFp32, s, div_in(Arith::kFp32, 1.0, gs));
      const double os = m == 0 ? 0.0 : div_in(Arith::kFp32, 1.0, m);  // get_reciprocal(0) = 0
      t = mul_in(Arith::kFp32, x, os);
      break;
    }
  }
  if (std::isnan(t)) t = 0.0;
  return codec::round_to(codec::kE2M1, std::clamp(t, -6.0, 6.0), codec::Overflow::kSaturate);
}

QuantizedMatrix nvfp4_quantize_activation(const Matrix& x, double gs_in, const Nvfp4Rules& r,
                                          double dequant_multiplier) {
  if (x.cols % kNvfp4GroupSize != 0)
    throw Error("NVFP4 activations", std::to_string(x.cols) + " features: not a multiple of 16");
  QuantizedMatrix q;
  q.rows = x.rows;
  q.cols = x.cols;
  q.lattice = 0.5;
  q.block_cols = kNvfp4GroupSize;
  q.codes.resize(x.data.size());
  const int64_t groups = x.cols / kNvfp4GroupSize;
  q.scales = Matrix(x.rows, groups);
  for (int64_t t = 0; t < x.rows; ++t)
    for (int64_t g = 0; g < groups; ++g) {
      const auto block =
          x.row(t).subspan(static_cast<size_t>(g * kNvfp4GroupSize), kNvfp4GroupSize);
      const double s = nvfp4_block_scale(absmax(block), gs_in, r);
      q.scales(t, g) = dequant_multiplier > 0 ? s * dequant_multiplier : s / gs_in;
      for (int64_t k = 0; k < kNvfp4GroupSize; ++k) {
        const size_t i = static_cast<size_t>(t * x.cols + g * kNvfp4GroupSize + k);
        q.codes[i] = lattice_code(nvfp4_quantize_element(x.data[i], s, gs_in, r), 0.5);
      }
    }
  return q;
}

TensorMap quantize_nvfp4(const QuantizeRequest& req) {
  const Matrix& w = req.weight;
  check_group_args(req.weights, req.group_size, req.where + ".weight_scale");
  if (w.cols % kNvfp4GroupSize != 0)
    throw Error(req.where + ".weight_packed",
                "in_features " + std::to_string(w.cols) + " is not a multiple of 16 (NVFP4)");
  require_finite(w.data, req.where);
  const Nvfp4Rules r = nvfp4_producer_rules(req.dialect, req.model_dtype);
  const double own_amax = absmax(w.data);
  if (req.fused_weight_amax && !(*req.fused_weight_amax >= own_amax))
    throw Error(req.where + ".weight_global_scale",
                "the fused layer's amax " + std::to_string(*req.fused_weight_amax) +
                    " is below this partition's own " + std::to_string(own_amax));
  const double gs = nvfp4_global_scale(req.fused_weight_amax.value_or(own_amax), r);
  const int64_t groups = w.cols / kNvfp4GroupSize;
  std::vector<double> scales(static_cast<size_t>(w.rows * groups));
  std::vector<uint8_t> nibbles(w.data.size());
  // In parallel over rows: a block's scale and codes depend on its own values and the global
  // scale alone, so nothing depends on the thread count.
  parallel_chunks(w.rows, 16 * w.rows * w.cols, [&](int64_t n0, int64_t n1) {
    for (int64_t n = n0; n < n1; ++n)
      for (int64_t g = 0; g < groups; ++g) {
        const auto block =
            w.row(n).subspan(static_cast<size_t>(g * kNvfp4GroupSize), kNvfp4GroupSize);
        const double s = nvfp4_block_scale(absmax(block), gs, r);
        scales[static_cast<size_t>(n * groups + g)] = s;
        for (int64_t k = 0; k < kNvfp4GroupSize; ++k) {
          const size_t i = static_cast<size_t>(n * w.cols + g * kNvfp4GroupSize + k);
          nibbles[i] = codec::double_to_e2m1(nvfp4_quantize_element(w.data[i], s, gs, r));
        }
      }
  });
  TensorMap out = nvfp4_code_tensors(nibbles, scales, w.rows, w.cols, "weight_packed", req.where);
  const double gsv[1] = {gs};
  out["weight_global_scale"] =
      encode(DType::kF32, {1}, gsv, Encoding::kExact, req.where + ".weight_global_scale");
  if (req.input_activations) {
    check_group_args(req.input_activations, 0, req.where + ".input_global_scale");
    if (!req.activations)
      throw Error(req.where + ".input_global_scale",
                  "NVFP4 W4A4 needs calibration statistics of the input (activations)");
    const double amax = std::max(std::fabs(req.activations->min), std::fabs(req.activations->max));
    if (!std::isfinite(amax))
      throw Error(req.where + ".input_global_scale", "calibration amax is not finite");
    const double gi[1] = {nvfp4_global_scale(amax, r)};
    out["input_global_scale"] =
        encode(DType::kF32, {1}, gi, Encoding::kExact, req.where + ".input_global_scale");
  }
  add_bias(out, req, req.model_dtype);
  return out;
}

TensorMap quantize_nvfp4_modelopt(const QuantizeRequest& req) {
  const Matrix& w = req.weight;
  check_group_args(req.weights, req.group_size, req.where + ".weight_scale");
  if (w.cols % kNvfp4GroupSize != 0)
    throw Error(req.where + ".weight",
                "in_features " + std::to_string(w.cols) + " is not a multiple of 16 (NVFP4)");
  require_finite(w.data, req.where);
  const Arith f = Arith::kFp32;
  const double own_amax = absmax(w.data);
  if (req.fused_weight_amax && !(*req.fused_weight_amax >= own_amax))
    throw Error(req.where + ".weight_scale_2",
                "the fused layer's amax " + std::to_string(*req.fused_weight_amax) +
                    " is below this partition's own " + std::to_string(own_amax));
  // weight_scale_2 = amax / (6 * 448) in fp32 (ModelOpt >= 0.35: one divisor); amax of the
  // fused group (preprocess_linear_fusion), exact in fp32 for a bf16 / fp16 weight.
  const double amax = in(f, req.fused_weight_amax.value_or(own_amax));
  if (!(amax > 0)) throw Error(req.where + ".weight_scale_2", "the weight is all zeros");
  const double ws2 = div_in(f, amax, kNvfp4GlobalNumerator);
  const double six_ws2 = mul_in(f, 6.0, ws2);
  const int64_t groups = w.cols / kNvfp4GroupSize;
  std::vector<double> scales(static_cast<size_t>(w.rows * groups));
  std::vector<uint8_t> nibbles(w.data.size());
  // In parallel over rows: a block's scale and codes depend on its own values and the global
  // scale alone, so nothing depends on the thread count.
  parallel_chunks(w.rows, 16 * w.rows * w.cols, [&](int64_t n0, int64_t n1) {
    for (int64_t n = n0; n < n1; ++n)
      for (int64_t g = 0; g < groups; ++g) {
        const auto block =
            w.row(n).subspan(static_cast<size_t>(g * kNvfp4GroupSize), kNvfp4GroupSize);
        // block_amax / (6 * ws2) in fp32; 0 -> 1.0; clamp [2^-9, 448] (>= 0.45); RNE to e4m3.
        double sf = div_in(f, in(f, absmax(block)), six_ws2);
        if (sf == 0) sf = 1.0;
        sf = std::clamp(sf, 0x1p-9, 448.0);
        const double sb = e4m3_of_quotient(sf, 1.0, 1.0);
        scales[static_cast<size_t>(n * groups + g)] = sb;
        const double denom = mul_in(f, sb, ws2);
        for (int64_t k = 0; k < kNvfp4GroupSize; ++k) {
          const size_t i = static_cast<size_t>(n * w.cols + g * kNvfp4GroupSize + k);
          nibbles[i] =
              codec::double_to_e2m1(e2m1_of_scaled_exact(div_in(f, w.data[i], denom), 1, 1));
        }
      }
  });
  TensorMap out = nvfp4_code_tensors(nibbles, scales, w.rows, w.cols, "weight", req.where);
  const double v[1] = {ws2};
  out["weight_scale_2"] =
      encode(DType::kF32, {}, v, Encoding::kExact, req.where + ".weight_scale_2");
  if (req.input_activations) {
    if (!req.activations)
      throw Error(req.where + ".input_scale",
                  "NVFP4 W4A4 needs calibration statistics of the input (activations)");
    const double xa = std::max(std::fabs(req.activations->min), std::fabs(req.activations->max));
    if (!std::isfinite(xa) || !(xa > 0))
      throw Error(req.where + ".input_scale", "calibration amax is not finite and > 0");
    const double is[1] = {div_in(f, in(f, xa), kNvfp4GlobalNumerator)};
    out["input_scale"] = encode(DType::kF32, {}, is, Encoding::kExact, req.where + ".input_scale");
  }
  add_bias(out, req, req.model_dtype);
  return out;
}

Matrix dequantize_nvfp4(const TensorMap& tensors, const std::string& where) {
  const auto get = [&](const std::string& name) -> const HostTensor& {
    return tensor_in(tensors, name, where);
  };
  const HostTensor& packed = get("weight_packed");
  const HostTensor& scale = get("weight_scale");
  if (packed.shape.size() != 2 || scale.shape.size() != 2)
    throw Error(where + ".weight_packed", "NVFP4 tensors are 2-D");
  const int64_t n = packed.shape[0], k = packed.shape[1] * 2;
  const std::vector<int64_t> scale_shape{n, k / kNvfp4GroupSize};
  require_shape(scale.view(), scale_shape, where + ".weight_scale");
  const auto v = decode_e2m1_nibbles(packed, n * k, where + ".weight_packed");
  const auto s = decode_scales_checked(scale, where + ".weight_scale");
  const double gs = decode_global_scale(get("weight_global_scale"), where + ".weight_global_scale");
  Matrix out(n, k);
  for (int64_t r = 0; r < n; ++r)
    for (int64_t c = 0; c < k; ++c)
      out(r, c) = v[static_cast<size_t>(r * k + c)] *
                  (s[static_cast<size_t>(r * (k / kNvfp4GroupSize) + c / kNvfp4GroupSize)] / gs);
  return out;
}

Nvfp4LinearMethod::Nvfp4LinearMethod(LinearShape shape, MethodConfig config)
    : LinearMethod(std::move(shape), std::move(config)),
      rules_(nvfp4_rules(dialect())),
      act_(this->config().input_activations.has_value()),
      modelopt_(this->config().format == "modelopt") {
  if (this->shape().in_features % kNvfp4GroupSize != 0)
    throw Error(where("weight_packed", 0, 0), "in_features " +
                                                  std::to_string(this->shape().in_features) +
                                                  " is not a multiple of 16 (NVFP4 group size)");
  check_group_args(this->config().weights, 0, where("weight_scale", 0, 0));
  check_group_args(this->config().input_activations, 0, where("input_global_scale", 0, 0));
}

std::vector<ParamSpec> Nvfp4LinearMethod::create_weights(int64_t partition) const {
  const auto& s = shape();
  const int64_t n = s.partitions.at(static_cast<size_t>(partition));
  const int64_t k = s.in_features;
  if (modelopt_) {
    const std::vector<std::vector<int64_t>> scalar = {std::vector<int64_t>{}};
    std::vector<ParamSpec> mo{
        {"weight", {DType::kU8}, {n, k / 2}, true, "e2m1 pairs, low nibble = even element"},
        {"weight_scale", {DType::kF8E4M3}, {n, k / kNvfp4GroupSize}, true, "times weight_scale_2"},
        {"weight_scale_2", {DType::kF32}, {1}, true, "multiplier amax / 2688 (0-dim)", scalar}};
    if (act_)
      mo.push_back({"input_scale", {DType::kF32}, {1}, true, "multiplier (0-dim; W4A4)", scalar});
    mo.push_back(bias_spec(s, partition));
    return mo;
  }
  std::vector<ParamSpec> specs{
      {"weight_packed", {DType::kU8}, {n, k / 2}, true, "e2m1 pairs, low nibble = even element"},
      {"weight_scale", {DType::kF8E4M3}, {n, k / kNvfp4GroupSize}, true, "times the global scale"},
      {"weight_global_scale", {DType::kF32}, {1}, true, "divisor"}};
  if (act_) specs.push_back({"input_global_scale", {DType::kF32}, {1}, true, "divisor (W4A4)"});
  specs.push_back(bias_spec(s, partition));
  return specs;
}

void Nvfp4LinearMethod::process() {
  const auto& s = shape();
  const int64_t k = s.in_features;
  const int64_t groups = k / kNvfp4GroupSize;
  const Nvfp4FusedGlobal fused = s.partition_count() == 1
                                     ? Nvfp4FusedGlobal::kPerPartition
                                     : (s.num_experts > 0 ? rules_.moe_fused : rules_.dense_fused);
  for (int64_t e = 0; e < s.expert_count(); ++e) {
    Expert ex;
    std::vector<std::vector<double>> values, scales;
    for (int64_t p = 0; p < s.partition_count(); ++p) {
      const int64_t n = s.partitions[static_cast<size_t>(p)];
      const char* packed = modelopt_ ? "weight" : "weight_packed";
      values.push_back(decode_e2m1_nibbles(loaded(packed, p, e), n * k, where(packed, p, e)));
      scales.push_back(
          decode_scales_checked(loaded("weight_scale", p, e), where("weight_scale", p, e)));
      // ModelOpt's multipliers go in as they are; decode_global_scale checks finite and > 0.
      const char* wg = modelopt_ ? "weight_scale_2" : "weight_global_scale";
      const char* ig = modelopt_ ? "input_scale" : "input_global_scale";
      ex.weight_gs.push_back(decode_global_scale(loaded(wg, p, e), where(wg, p, e)));
      if (act_) ex.input_gs.push_back(decode_global_scale(loaded(ig, p, e), where(ig, p, e)));
    }
    ex.weight_gs_eff = ex.weight_gs;
    ex.input_gs_eff = ex.input_gs;
    if (modelopt_) {
      // vLLM's ModelOpt NVFP4: a dense fused layer takes the largest weight_scale_2 and
      // input_scale (a warning when they differ), an expert's gate/up the gate's weight_scale_2.
      if (fused != Nvfp4FusedGlobal::kPerPartition) {
        const double w = fused == Nvfp4FusedGlobal::kMax
                             ? *std::max_element(ex.weight_gs.begin(), ex.weight_gs.end())
                             : ex.weight_gs[0];
        std::fill(ex.weight_gs_eff.begin(), ex.weight_gs_eff.end(), w);
        if (act_)
          std::fill(ex.input_gs_eff.begin(), ex.input_gs_eff.end(),
                    *std::max_element(ex.input_gs.begin(), ex.input_gs.end()));
      }
      // Multipliers kept for the exact products; the divisors an engine's kernels take.
      ex.input_mult_eff = ex.input_gs_eff;
      for (int64_t p = 0; p < s.partition_count(); ++p) {
        const size_t pi = static_cast<size_t>(p);
        const double m = ex.weight_gs_eff[pi];
        for (double& v : scales[pi])
          v *= m;  // exact: e4m3 (4 significant bits) times an F32 value
        ex.weight_gs_eff[pi] = in(Arith::kFp32, 1.0 / m);
        if (act_) ex.input_gs_eff[pi] = in(Arith::kFp32, 1.0 / ex.input_mult_eff[pi]);
      }
    } else if (fused == Nvfp4FusedGlobal::kMax) {
      std::fill(ex.weight_gs_eff.begin(), ex.weight_gs_eff.end(),
                *std::max_element(ex.weight_gs.begin(), ex.weight_gs.end()));
      if (act_)
        std::fill(ex.input_gs_eff.begin(), ex.input_gs_eff.end(),
                  *std::max_element(ex.input_gs.begin(), ex.input_gs.end()));
    } else if (fused == Nvfp4FusedGlobal::kShardZeroMinInput) {
      std::fill(ex.weight_gs_eff.begin(), ex.weight_gs_eff.end(), ex.weight_gs[0]);
      if (act_)
        std::fill(ex.input_gs_eff.begin(), ex.input_gs_eff.end(),
                  *std::min_element(ex.input_gs.begin(), ex.input_gs.end()));
    }
    for (int64_t p = 0; p < s.partition_count(); ++p) {
      const size_t pi = static_cast<size_t>(p);
      QuantizedMatrix q;
      q.rows = s.partitions[pi];
      q.cols = k;
      q.lattice = 0.5;
      q.block_cols = kNvfp4GroupSize;
      q.codes.resize(values[pi].size());
      for (size_t i = 0; i < q.codes.size(); ++i)
        q.codes[i] = lattice_code(values[pi][i], 0.5);
      q.scales = Matrix(q.rows, groups);
      for (size_t i = 0; i < q.scales.data.size(); ++i)
        q.scales.data[i] = modelopt_ ? scales[pi][i] : scales[pi][i] / ex.weight_gs_eff[pi];
      q.compact();
      ex.parts.push_back(std::move(q));
    }
    ex.bias = loaded_bias(e);
    experts_.push_back(std::move(ex));
  }
}

double Nvfp4LinearMethod::effective_weight_global_scale(int64_t expert, int64_t partition) const {
  return experts_.at(static_cast<size_t>(expert)).weight_gs_eff.at(static_cast<size_t>(partition));
}

double Nvfp4LinearMethod::effective_input_global_scale(int64_t expert, int64_t partition) const {
  if (!act_) throw Error(shape().prefix, "NVFP4A16 has no input global scale");
  return experts_.at(static_cast<size_t>(expert)).input_gs_eff.at(static_cast<size_t>(partition));
}

QuantizedMatrix Nvfp4LinearMethod::processed_codes(int64_t expert) const {
  const auto& s = shape();
  const Expert& ex = experts_.at(static_cast<size_t>(expert));
  const int64_t k = s.in_features, groups = k / kNvfp4GroupSize;
  QuantizedMatrix q;
  q.rows = s.out_features();
  q.cols = k;
  q.lattice = 0.5;
  q.block_cols = kNvfp4GroupSize;
  q.codes.resize(static_cast<size_t>(q.rows * k));
  q.scales = Matrix(q.rows, groups);
  for (int64_t p = 0; p < s.partition_count(); ++p) {
    const QuantizedMatrix& part = ex.parts[static_cast<size_t>(p)];
    const int64_t off = s.partition_offset(p);
    const std::vector<int64_t> codes = part.code_vector();
    std::copy(codes.begin(), codes.end(), q.codes.begin() + off * k);
    // The loaded block scales are retained after processing (retained_after_processing).
    const auto sw =
        decode_scales_checked(loaded("weight_scale", p, expert), where("weight_scale", p, expert));
    std::copy(sw.begin(), sw.end(), q.scales.data.begin() + off * groups);
  }
  return q;
}

Matrix Nvfp4LinearMethod::do_apply(const Matrix& x, int64_t expert) const {
  const auto& s = shape();
  const Expert& ex = experts_[static_cast<size_t>(expert)];
  Matrix y(x.rows, s.out_features());
  std::optional<QuantizedMatrix> xq;
  double xq_gs = 0.0;
  for (int64_t p = 0; p < s.partition_count(); ++p) {
    const size_t pi = static_cast<size_t>(p);
    Matrix yp;
    if (act_) {
      if (!xq || xq_gs != ex.input_gs_eff[pi]) {
        xq_gs = ex.input_gs_eff[pi];
        xq = nvfp4_quantize_activation(x, xq_gs, rules_, modelopt_ ? ex.input_mult_eff[pi] : 0.0);
      }
      yp = scaled_gemm(*xq, ex.parts[pi]);
    } else {
      yp = weight_only_gemm(x, ex.parts[pi]);
    }
    const int64_t off = s.partition_offset(p);
    for (int64_t t = 0; t < y.rows; ++t)
      for (int64_t n = 0; n < yp.cols; ++n)
        y(t, off + n) = yp(t, n);
  }
  for (int64_t t = 0; t < y.rows; ++t)
    for (int64_t n = 0; n < y.cols; ++n)
      y(t, n) += ex.bias[static_cast<size_t>(n)];
  return y;
}

Matrix Nvfp4LinearMethod::do_dequantized_weight(int64_t expert) const {
  const auto& s = shape();
  const Expert& ex = experts_[static_cast<size_t>(expert)];
  Matrix w(s.out_features(), s.in_features);
  for (int64_t p = 0; p < s.partition_count(); ++p) {
    const Matrix d = dequantize(ex.parts[static_cast<size_t>(p)]);
    std::copy(d.data.begin(), d.data.end(), w.data.begin() + s.partition_offset(p) * s.in_features);
  }
  return w;
}

std::optional<QuantizedMatrix> Nvfp4LinearMethod::do_quantize_input(const Matrix& x,
                                                                    int64_t expert) const {
  if (!act_) return std::nullopt;
  // Partition 0's input global scale; equal for every partition unless the dialect keeps
  // differing per-partition scales (ideal), where apply() quantizes x once per partition.
  const Expert& ex = experts_[static_cast<size_t>(expert)];
  return nvfp4_quantize_activation(x, ex.input_gs_eff[0], rules_,
                                   modelopt_ ? ex.input_mult_eff[0] : 0.0);
}

TensorMap Nvfp4LinearMethod::runtime_tensors() const {
  const auto& s = shape();
  if (s.num_experts == 0) return {};
  if (modelopt_)
    throw Error(s.prefix,
                "SGLang's stacked runtime tensors are written for compressed-tensors' "
                "NVFP4 names, not ModelOpt's");
  const std::string pre = s.partition_count() > 1 ? "w13_" : "w2_";
  TensorMap out;
  HostTensor shard;  // weight_packed of shard (e, p), re-encoded from the run-time codes
  out[pre + "weight_packed"] =
      stack_expert_shards(s, [&](int64_t e, int64_t p) -> const HostTensor& {
        const QuantizedMatrix& q = experts_[static_cast<size_t>(e)].parts[static_cast<size_t>(p)];
        shard = encode_element_rows(q, 0, q.rows, MxElem::kE2M1, where("weight_packed", p, e));
        return shard;
      });
  std::vector<std::string> names{"weight_scale", "weight_global_scale"};
  if (act_) names.push_back("input_global_scale");
  for (const auto& name : names)
    out[pre + name] = stack_expert_shards(
        s, [&](int64_t e, int64_t p) -> const HostTensor& { return loaded(name, p, e); });
  const bool unified =
      s.partition_count() == 1 || rules_.moe_fused != Nvfp4FusedGlobal::kPerPartition;
  if (unified) {
    std::vector<double> w2(static_cast<size_t>(s.expert_count())), a2(w2.size());
    for (size_t e = 0; e < w2.size(); ++e) {
      w2[e] = div_in(Arith::kFp32, 1.0, experts_[e].weight_gs_eff[0]);
      if (act_) a2[e] = div_in(Arith::kFp32, 1.0, experts_[e].input_gs_eff[0]);
    }
    out[pre + "weight_scale_2"] =
        encode(DType::kF32, {s.expert_count()}, w2, Encoding::kExact, pre + "weight_scale_2");
    if (act_)
      out[pre + "input_scale"] =
          encode(DType::kF32, {s.expert_count()}, a2, Encoding::kExact, pre + "input_scale");
  }
  return out;
}

std::unique_ptr<LinearMethod> make_nvfp4_method(LinearShape shape, MethodConfig config) {
  return std::make_unique<Nvfp4LinearMethod>(std::move(shape), std::move(config));
}

}  // namespace qparity::reference
