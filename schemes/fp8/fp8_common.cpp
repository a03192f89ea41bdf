#include "schemes/fp8/fp8_common.h"

#include <algorithm>
#include <array>
#include <cmath>
#include <functional>

#include "core/codecs/float_format.h"
#include "core/codecs/ue8m0.h"
#include "core/error.h"
#include "schemes/method/parallel.h"

namespace qparity::reference {

namespace {

int64_t ceil_div(int64_t a, int64_t b) {
  return (a + b - 1) / b;
}

// Quantizes x in tiles of br x bc; scale_of(amax) gives the scale each tile uses (already the
// stored value for weights). Returns the fp8 values and the scale grid.
// amax_quotient: scale_of computes the scale from the set's amax (dynamic activations), so
// an exact rule rounds 448*x/amax; otherwise (stored or static scales) x/s.
Fp8Weight tile_quantize(const Matrix& x, int64_t br, int64_t bc, const Fp8ScaleRule& rule,
                        const std::function<double(double)>& scale_of, bool amax_quotient) {
  if (br <= 0 || bc <= 0) throw Error("fp8", "tile size must be > 0");
  Fp8Weight out;
  out.values = Matrix(x.rows, x.cols);
  out.scales = Matrix(ceil_div(x.rows, br), ceil_div(x.cols, bc));
  // Each row's amax per tile column, in parallel over rows; a tile's amax is the largest of its
  // rows' (a max is exact in any order), its scale then decided once; then every element, in
  // parallel over rows. Each value depends on its element and its tile's scale alone, so the
  // bits do not depend on the thread count.
  Matrix row_amax(x.rows, out.scales.cols);
  parallel_chunks(x.rows, x.rows * x.cols, [&](int64_t r0, int64_t r1) {
    for (int64_t r = r0; r < r1; ++r)
      for (int64_t bj = 0; bj < out.scales.cols; ++bj) {
        double amax = 0.0;
        for (int64_t c = bj * bc; c < std::min(x.cols, bj * bc + bc); ++c)
          amax = std::max(amax, std::fabs(in(rule.arith, x(r, c))));
        row_amax(r, bj) = amax;
      }
  });
  Matrix tile_amax(out.scales.rows, out.scales.cols);
  for (int64_t bi = 0; bi < out.scales.rows; ++bi)
    for (int64_t bj = 0; bj < out.scales.cols; ++bj) {
      double amax = 0.0;
      for (int64_t r = bi * br; r < std::min(x.rows, bi * br + br); ++r)
        amax = std::max(amax, row_amax(r, bj));
      tile_amax(bi, bj) = amax;
      out.scales(bi, bj) = scale_of(amax);
    }
  parallel_chunks(x.rows, 4 * x.rows * x.cols, [&](int64_t r0, int64_t r1) {
    for (int64_t r = r0; r < r1; ++r)
      for (int64_t bj = 0; bj < out.scales.cols; ++bj) {
        const double s = out.scales(r / br, bj), amax = tile_amax(r / br, bj);
        // The exact quotient: 448*x/amax while s is amax/448 itself (no floor, eps or UE8M0
        // changed it), else x/s.
        const bool exact = rule.exact_quotient && s > 0;
        const bool by_amax = amax_quotient && amax > 0 && s == amax / kFp8Max;
        for (int64_t c = bj * bc; c < std::min(x.cols, bj * bc + bc); ++c)
          out.values(r, c) = !exact    ? fp8_value(x(r, c), s, rule)
                             : by_amax ? e4m3_of_quotient(x(r, c), kFp8Max, amax)
                                       : e4m3_of_quotient(x(r, c), 1.0, s);
      }
  });
  return out;
}

}  // namespace

std::string_view to_string(Fp8File f) {
  switch (f) {
    case Fp8File::kCompressedTensors:
      return "compressed-tensors";
    case Fp8File::kFp8Config:
      return "fp8";
    case Fp8File::kMsModelSlim:
      return "msmodelslim";
  }
  return "?";
}

Fp8File fp8_file_of(const MethodConfig& c) {
  if (c.format == "fp8") return Fp8File::kFp8Config;
  if (c.format == "msmodelslim") return Fp8File::kMsModelSlim;
  return Fp8File::kCompressedTensors;
}

Fp8File default_fp8_file(Dialect d) {
  return d == Dialect::kMsModelSlim ? Fp8File::kMsModelSlim : Fp8File::kCompressedTensors;
}

DType fp8_scale_dtype(Fp8File f, DType model_dtype) {
  return f == Fp8File::kCompressedTensors ? model_dtype : DType::kF32;
}

std::string_view to_string(Fp8Act a) {
  switch (a) {
    case Fp8Act::kNone:
      return "none";
    case Fp8Act::kStatic:
      return "static per-tensor";
    case Fp8Act::kDynamicTensor:
      return "dynamic per-tensor";
    case Fp8Act::kDynamicToken:
      return "dynamic per-token";
    case Fp8Act::kDynamicGroup:
      return "dynamic per-token-group 1x128";
  }
  return "?";
}

Fp8Rules fp8_rules(Dialect d) {
  Fp8Rules r;
  r.dialect = d;
  switch (d) {
    case Dialect::kIdeal:
      break;  // fp64, x/s everywhere, no floors, zero sets -> codes 0
    case Dialect::kCompressedTensors:
      r.weight_in_model_dtype = true;
      r.act_in_model_dtype = true;
      r.group_needs_aligned_k = true;  // helpers.py compute_dynamic_scales_and_zp (group)
      break;
    case Dialect::kVllm:
    case Dialect::kSglang:
    case Dialect::kMsModelSlim:
      // vLLM's kernels (§3.1, §3.2, §3.6); SGLang and msModelSlim differ below.
      r.weight_arith = Arith::kFp32;
      r.weight_tensor_use = ScaleUse::kMultiplyReciprocal;
      r.weight_channel_use = ScaleUse::kDivide;
      r.weight_block_use = ScaleUse::kDivide;
      r.weight_channel_min_scale = kVllmTokenMinScale;
      r.weight_block_amax_floor = kGroupAmaxEps;
      r.weight_tensor_zero_saturates = true;
      r.requant_via_fp16 = true;
      r.act_arith = Arith::kFp32;
      r.static_use = ScaleUse::kMultiplyReciprocal;
      r.tensor_use = ScaleUse::kMultiplyReciprocal;
      r.tensor_zero_saturates = true;
      r.token_use = ScaleUse::kDivide;
      r.token_min_scale = kVllmTokenMinScale;
      r.group_use = ScaleUse::kDivide;
      r.group_amax_floor = kGroupAmaxEps;
      r.check_merged_block_n = true;
      r.group_needs_aligned_k = true;  // fp8_utils.py / fp8_kernel.py per_token_group_quant_fp8
      if (d == Dialect::kSglang) {
        // sgl-kernel per_token_quant_fp8.cu: s = amax/448, x * (1/s), no floor, zero row -> 0.
        r.token_use = ScaleUse::kMultiplyReciprocal;
        r.token_min_scale = 0.0;
        // fp8_kernel.py _per_token_group_quant_8bit (row-major): y * (1/s).
        r.group_use = ScaleUse::kMultiplyReciprocal;
        r.moe_block_needs_aligned_intermediate = true;
      }
      if (d == Dialect::kMsModelSlim) {
        // msModelSlim WFP8AFP8_DYNAMIC producer: fp32, x/s, scale >= FLT_EPSILON (its integer
        // rule, §5.2; the fp8 quantizer itself is UNCONFIRMED). No fused requantization (one
        // scale per channel). NPU activation ops: vLLM's rules (UNCONFIRMED).
        r.weight_tensor_use = ScaleUse::kDivide;
        r.weight_min_scale = kFltEpsilon;
        r.weight_channel_min_scale = 0.0;
        r.weight_block_amax_floor = 0.0;
        r.weight_tensor_zero_saturates = false;
        r.requant_via_fp16 = false;
        r.check_merged_block_n = false;
        r.group_needs_aligned_k = false;  // no block fp8 in msModelSlim
      }
      break;
  }
  return r;
}

double dtype_eps(DType d) {
  switch (d) {
    case DType::kBF16:
      return 0x1p-7;
    case DType::kF16:
      return 0x1p-10;
    case DType::kF32:
      return 0x1p-23;
    case DType::kF64:
      return 0x1p-52;
    default:
      throw Error("dtype_eps", std::string(dtype_name(d)) + " is not a float dtype");
  }
}

Fp8ScaleRule Fp8Rules::weight_rule(Fp8Granularity g, DType storage_dtype, DType model_dtype) const {
  Fp8ScaleRule r;
  if (weight_in_model_dtype) {
    r.arith = arith_of(model_dtype, "fp8 weight scale");
    r.use = ScaleUse::kDivide;
    r.zero_scale = dtype_eps(model_dtype);
    return r;
  }
  r.arith = weight_arith;
  r.use = g == Fp8Granularity::kTensor    ? weight_tensor_use
          : g == Fp8Granularity::kChannel ? weight_channel_use
                                          : weight_block_use;
  r.min_scale =
      std::max(weight_min_scale, g == Fp8Granularity::kChannel ? weight_channel_min_scale : 0.0);
  r.amax_floor = g == Fp8Granularity::kBlock ? weight_block_amax_floor : 0.0;
  r.zero_saturates = g == Fp8Granularity::kTensor && weight_tensor_zero_saturates;
  // ideal: an all-zero set still needs a positive stored scale; the storage dtype's eps.
  if (dialect == Dialect::kIdeal) r.zero_scale = dtype_eps(storage_dtype);
  r.exact_quotient = dialect == Dialect::kIdeal;
  return r;
}

Fp8ScaleRule Fp8Rules::activation_rule(Fp8Act a, DType model_dtype) const {
  Fp8ScaleRule r;
  if (act_in_model_dtype) {
    r.arith = arith_of(model_dtype, "fp8 activation scale");
    r.use = ScaleUse::kDivide;
    r.zero_scale = dtype_eps(model_dtype);
    r.ue8m0 = a == Fp8Act::kDynamicGroup && group_ue8m0;
    return r;
  }
  r.arith = act_arith;
  switch (a) {
    case Fp8Act::kNone:
    case Fp8Act::kStatic:
      r.use = static_use;
      break;
    case Fp8Act::kDynamicTensor:
      r.use = tensor_use;
      r.zero_saturates = tensor_zero_saturates;
      break;
    case Fp8Act::kDynamicToken:
      r.use = token_use;
      r.min_scale = token_min_scale;
      break;
    case Fp8Act::kDynamicGroup:
      r.use = group_use;
      r.amax_floor = group_amax_floor;
      r.ue8m0 = group_ue8m0;
      break;
  }
  r.exact_quotient = dialect == Dialect::kIdeal;
  return r;
}

double fp8_saturate(double t, const std::string& where) {
  if (std::isnan(t)) throw Error(where, "NaN reached the fp8 cast");
  return codec::round_to(codec::kE4M3FN, std::clamp(t, -kFp8Max, kFp8Max),
                         codec::Overflow::kSaturate);
}

double fp8_scale(double amax, const Fp8ScaleRule& r) {
  double a = in(r.arith, amax);
  if (r.amax_floor > 0) a = std::max(a, in(r.arith, r.amax_floor));
  double s = div_in(r.arith, a, kFp8Max);
  if (r.min_scale > 0) s = std::max(s, in(r.arith, r.min_scale));
  if (r.ue8m0 && s > 0)
    s = codec::ue8m0_to_double(
        codec::double_to_ue8m0(s, codec::Ue8m0Rounding::kUp, codec::Overflow::kSaturate));
  if (s == 0 && r.zero_scale > 0) s = r.zero_scale;
  return s;
}

double fp8_value(double x, double s, const Fp8ScaleRule& r) {
  if (s == 0) {
    if (!r.zero_saturates) return 0.0;
    return x < 0 ? -kFp8Max : kFp8Max;  // x*(1/0) = +-inf or NaN; fminf/fmaxf give +-448
  }
  return fp8_saturate(apply_scale(x, s, r.use, r.arith));
}

double round_to_dtype(double s, DType d) {
  switch (d) {
    case DType::kF64:
      return s;
    case DType::kF32:
      return static_cast<double>(static_cast<float>(s));
    case DType::kBF16:
      return codec::round_to(codec::kBF16, s, codec::Overflow::kNonSaturating);
    case DType::kF16:
      return codec::round_to(codec::kFP16, s, codec::Overflow::kNonSaturating);
    default:
      throw Error("fp8 scale", std::string(dtype_name(d)) + " is not a float dtype");
  }
}

Fp8Weight quantize_weight_fp8(const Matrix& w, int64_t block_rows, int64_t block_cols,
                              const Fp8ScaleRule& rule, DType scale_dtype) {
  require_finite(w.data, "weight");
  return tile_quantize(
      w, block_rows, block_cols, rule,
      [&](double amax) { return round_to_dtype(fp8_scale(amax, rule), scale_dtype); }, false);
}

std::vector<int64_t> fp8_lattice_codes(std::span<const double> values) {
  std::vector<int64_t> c(values.size());
  // Element by element in parallel chunks; a value off the lattice is the lowest chunk's error,
  // so the first in order whatever the thread count.
  const auto n = static_cast<int64_t>(values.size());
  parallel_chunks(n, n, [&](int64_t b, int64_t e) {
    for (int64_t i = b; i < e; ++i)
      c[static_cast<size_t>(i)] = lattice_code(values[static_cast<size_t>(i)], kFp8Lattice);
  });
  return c;
}

QuantizedMatrix quantize_activation_fp8(const Matrix& x, Fp8Act mode, const Fp8ScaleRule& rule,
                                        double static_scale, int64_t group) {
  require_finite(x.data, "activations");
  int64_t br = 1, bc = std::max<int64_t>(x.cols, 1);
  std::function<double(double)> scale_of = [&](double amax) { return fp8_scale(amax, rule); };
  switch (mode) {
    case Fp8Act::kNone:
      throw Error("fp8 activations", "quantization mode 'none'");
    case Fp8Act::kStatic:
      br = std::max<int64_t>(x.rows, 1);
      scale_of = [&](double) { return static_scale; };
      break;
    case Fp8Act::kDynamicTensor:
      br = std::max<int64_t>(x.rows, 1);
      break;
    case Fp8Act::kDynamicToken:
      break;
    case Fp8Act::kDynamicGroup:
      bc = group;
      break;
  }
  const Fp8Weight t = tile_quantize(x, br, bc, rule, scale_of, mode != Fp8Act::kStatic);
  QuantizedMatrix q;
  q.rows = x.rows;
  q.cols = x.cols;
  q.codes = fp8_lattice_codes(t.values.data);
  q.lattice = kFp8Lattice;
  q.block_rows = br;
  q.block_cols = bc;
  q.scales = t.scales;
  return q;
}

std::vector<double> load_fp8_values(const HostTensor& t, const std::string& where) {
  auto v = decode(t.view(), where);
  for (size_t i = 0; i < v.size(); ++i)
    if (std::isnan(v[i]))
      throw Error(where, "NaN fp8 code (0x7F/0xFF) at element " + std::to_string(i));
  return v;
}

std::vector<double> load_fp8_scales(const HostTensor& t, const std::string& where) {
  auto v = decode(t.view(), where);
  require_finite(v, where);
  for (size_t i = 0; i < v.size(); ++i)
    if (v[i] < 0 || std::signbit(v[i]))
      throw Error(where, "negative scale " + std::to_string(v[i]) + " at element " +
                             std::to_string(i) + " (scales must be >= 0)");
  return v;
}

Fp8Act fp8_act_of(const MethodConfig& c, std::span<const Fp8Act> allowed,
                  const std::string& where) {
  Fp8Act mode = Fp8Act::kNone;
  if (c.input_activations) {
    const QuantArgs& a = *c.input_activations;
    if (a.type != QuantType::kFloat || a.num_bits != 8)
      throw Error(where,
                  "input activations must be float 8-bit for fp8 schemes, got " + describe(a));
    if (!a.symmetric) throw Error(where, "fp8 input activations must be symmetric");
    if (!a.is_dynamic()) {
      if (a.strategy != QuantStrategy::kTensor)
        throw Error(where, "static fp8 input activations must be per tensor, got " + describe(a));
      mode = Fp8Act::kStatic;
    } else if (a.strategy == QuantStrategy::kTensor) {
      mode = Fp8Act::kDynamicTensor;
    } else if (a.strategy == QuantStrategy::kToken) {
      mode = Fp8Act::kDynamicToken;
    } else if (a.strategy == QuantStrategy::kGroup && a.effective_group_size() == kFp8BlockSize) {
      mode = Fp8Act::kDynamicGroup;
    } else {
      throw Error(where, "fp8 input activations " + describe(a) + " are not implemented");
    }
  }
  if (std::find(allowed.begin(), allowed.end(), mode) == allowed.end()) {
    std::string names;
    for (Fp8Act m : allowed)
      names += (names.empty() ? "" : ", ") + std::string(to_string(m));
    throw Error(where, "activations '" + std::string(to_string(mode)) + "' with scheme " +
                           to_string(c.scheme) + " (it supports: " + names + ")");
  }
  return mode;
}

Matrix fp8_linear_apply(const Matrix& x, const QuantizedMatrix& w, Fp8Act mode,
                        const Fp8ScaleRule& act_rule, double static_scale,
                        const std::vector<double>& bias) {
  Matrix y = mode == Fp8Act::kNone
                 ? weight_only_gemm(x, w)
                 : scaled_gemm(quantize_activation_fp8(x, mode, act_rule, static_scale), w);
  for (int64_t t = 0; t < y.rows; ++t)
    for (int64_t n = 0; n < y.cols; ++n)
      y(t, n) += bias[static_cast<size_t>(n)];
  return y;
}

}  // namespace qparity::reference

namespace qparity::reference {

void check_fp8_weight_args(const std::optional<QuantArgs>& a, QuantStrategy strategy,
                           const std::string& where) {
  if (!a) return;
  if (a->type != QuantType::kFloat || a->num_bits != 8 || !a->symmetric || a->is_dynamic() ||
      a->strategy != strategy)
    throw Error(where, "fp8 " + std::string(to_string(strategy)) +
                           " weights must be float 8-bit, symmetric, static, strategy " +
                           std::string(to_string(strategy)) + "; got " + describe(*a));
}

Fp8LinearBase::Fp8LinearBase(LinearShape shape, MethodConfig config, Fp8Rules rules,
                             std::span<const Fp8Act> allowed)
    : LinearMethod(std::move(shape), std::move(config)), rules_(rules) {
  act_ = fp8_act_of(this->config(), allowed, this->shape().prefix);
  file_ = fp8_file_of(this->config());
}

Matrix Fp8LinearBase::load_fused_values(int64_t expert) const {
  const auto& s = shape();
  Matrix w(s.out_features(), s.in_features);
  for (int64_t p = 0; p < s.partition_count(); ++p) {
    const auto v = load_fp8_values(loaded("weight", p, expert), where("weight", p, expert));
    std::copy(v.begin(), v.end(), w.data.begin() + s.partition_offset(p) * s.in_features);
  }
  return w;
}

std::vector<int64_t> Fp8LinearBase::load_fused_codes(int64_t expert) const {
  const auto& s = shape();
  // The lattice code of every e4m3fn byte (lattice_code of its value, the codes
  // fp8_lattice_codes gives); the two NaN bytes flagged.
  static const auto table = [] {
    std::array<int64_t, 256> t{};
    for (int b = 0; b < 256; ++b)
      if ((b & 0x7F) != 0x7F)
        t[static_cast<size_t>(b)] =
            lattice_code(codec::e4m3fn_to_double(static_cast<uint8_t>(b)), kFp8Lattice);
    return t;
  }();
  std::vector<int64_t> codes(static_cast<size_t>(s.out_features() * s.in_features));
  for (int64_t p = 0; p < s.partition_count(); ++p) {
    const HostTensor& t = loaded("weight", p, expert);
    const std::string w = where("weight", p, expert);
    const int64_t n = s.partitions[static_cast<size_t>(p)] * s.in_features;
    int64_t* out = codes.data() + s.partition_offset(p) * s.in_features;
    if (t.dtype != DType::kF8E4M3 || t.numel() != n ||
        t.bytes.size() != static_cast<size_t>(n)) {  // the general path and its errors
      const auto c = fp8_lattice_codes(load_fp8_values(t, w));
      if (static_cast<int64_t>(c.size()) != n)
        throw Error(w, "holds " + std::to_string(c.size()) + " elements, the layer needs " +
                           std::to_string(n));
      std::copy(c.begin(), c.end(), out);
      continue;
    }
    // (the lowest chunk's NaN is rethrown: the first in order, as load_fp8_values says it)
    parallel_chunks(n, n, [&](int64_t b, int64_t e) {
      for (int64_t i = b; i < e; ++i) {
        const uint8_t byte = t.bytes[static_cast<size_t>(i)];
        if ((byte & 0x7F) == 0x7F)
          throw Error(w, "NaN fp8 code (0x7F/0xFF) at element " + std::to_string(i));
        out[i] = table[byte];
      }
    });
  }
  return codes;
}

Matrix Fp8LinearBase::do_apply(const Matrix& x, int64_t expert) const {
  const auto e = static_cast<size_t>(expert);
  return fp8_linear_apply(x, experts_[e], act_, rules_.activation_rule(act_, shape().model_dtype),
                          static_input_scale_, biases_[e]);
}

Matrix Fp8LinearBase::do_dequantized_weight(int64_t expert) const {
  return dequantize(experts_[static_cast<size_t>(expert)]);
}

std::optional<QuantizedMatrix> Fp8LinearBase::do_quantize_input(const Matrix& x,
                                                                int64_t expert) const {
  (void)expert;
  if (act_ == Fp8Act::kNone) return std::nullopt;
  return quantize_activation_fp8(x, act_, rules_.activation_rule(act_, shape().model_dtype),
                                 static_input_scale_);
}

std::string Fp8LinearBase::moe_name() const {
  return shape().partition_count() == 2 ? "w13" : "w2";
}

HostTensor Fp8LinearBase::runtime_weight() const {
  const auto& s = shape();
  std::vector<double> v;
  for (const auto& q : experts_)
    for (int64_t c : q.code_vector())
      v.push_back(static_cast<double>(c) * kFp8Lattice);
  std::vector<int64_t> sh{s.out_features(), s.in_features};
  if (s.num_experts > 0) sh.insert(sh.begin(), s.num_experts);
  return encode(DType::kF8E4M3, sh, v, Encoding::kExact, s.prefix + " runtime weight");
}

}  // namespace qparity::reference
