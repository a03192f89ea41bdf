#include "schemes/math/mx_scale.h"

#include <algorithm>
#include <cmath>

#include "core/codecs/float_format.h"
#include "core/codecs/int_packing.h"
#include "core/codecs/ue8m0.h"
#include "core/error.h"

namespace qparity::reference {

namespace {

const codec::FloatFormat& elem_format(MxElem e) {
  return e == MxElem::kE2M1 ? codec::kE2M1 : codec::kE4M3FN;
}

// floor(log2(max finite)) of the type an amax is held in (the bumped power of two above it is
// inf in that type's bits).
int max_exponent(Arith a) {
  switch (a) {
    case Arith::kFp64:
      return 1023;
    case Arith::kFp32:
    case Arith::kBf16:
      return 127;
    case Arith::kFp16:
      return 15;
  }
  return 1023;
}

// msModelSlim's MXFP4 private-exponent offset (mxfp4_quantize: log2(x_biased + 9.6e-7)).
constexpr double kMsModelSlimLog2Offset = 9.6e-7;

}  // namespace

int mx_emax_elem(MxElem e) {
  return e == MxElem::kE2M1 ? 2 : 8;
}

double mx_elem_max(MxElem e) {
  return e == MxElem::kE2M1 ? 6.0 : 448.0;
}

double mx_elem_lattice(MxElem e) {
  return e == MxElem::kE2M1 ? 0.5 : std::ldexp(1.0, -9);
}

MxScaleRules mx_scale_rules(Dialect d, MxElem elem, DType model_dtype) {
  MxScaleRules r;
  r.elem = elem;
  switch (d) {
    case Dialect::kIdeal:
      r.exponent = MxExponentRule::kOcp;
      break;
    case Dialect::kCompressedTensors:
      r.exponent = MxExponentRule::kBump;
      r.amax_arith = r.element_arith = arith_of(model_dtype, "MX scale (model dtype)");
      r.byte_max = 255;
      break;
    case Dialect::kVllm:
    case Dialect::kSglang:
      r.exponent = MxExponentRule::kBump;
      r.amax_arith = r.element_arith = arith_of(model_dtype, "MX scale (model dtype)");
      break;
    case Dialect::kMsModelSlim:
      r.exponent = elem == MxElem::kE2M1 ? MxExponentRule::kMsModelSlimFp4 : MxExponentRule::kOcp;
      r.amax_arith = r.element_arith = Arith::kFp32;
      r.element_round = IntRound::kHalfAway;
      break;
  }
  return r;
}

int floor_log2_exact(double a) {
  if (!(a > 0) || !std::isfinite(a)) throw Error("floor_log2_exact", "needs a finite a > 0");
  int e = 0;
  std::frexp(a, &e);  // a = m * 2^e, m in [0.5, 1): exact, subnormals included
  return e - 1;
}

double mantissa_exact(double a) {
  int e = 0;
  const double m = std::frexp(a, &e);
  return 2.0 * m;
}

MxExponent mx_shared_exponent(double amax, const MxScaleRules& r) {
  if (!(amax >= 0) || !std::isfinite(amax))
    throw Error("MX shared exponent", "block amax must be finite and >= 0");
  const int emax = mx_emax_elem(r.elem);
  MxExponent out;
  auto set_byte = [&](int byte) {
    out.byte = std::clamp(byte, r.byte_min, r.byte_max);
    out.nan = out.byte == 255;
    out.exponent = out.byte - 127;
  };
  switch (r.exponent) {
    case MxExponentRule::kOcp: {
      double a = in(r.amax_arith, amax);
      if (std::isinf(a)) {
        out.nan = true;
        out.byte = 255;
        return out;
      }
      if (a == 0)
        a = std::ldexp(1.0, -126);  // microxcaling: log2(amax + FP32_MIN_NORMAL*(amax==0))
      const int e = floor_log2_exact(a) - emax;
      if (e > 127) {
        out.nan = true;
        out.byte = 255;
        out.exponent = e;
        return out;
      }
      set_byte(std::max(e, -127) + 127);
      return out;
    }
    case MxExponentRule::kBump: {
      const double a = in(r.amax_arith, amax);
      if (a == 0) {  // log2(0) = -inf, clamped to the byte minimum
        set_byte(r.byte_min);
        return out;
      }
      if (std::isinf(a)) {
        set_byte(r.byte_max);
        return out;
      }
      const int p = floor_log2_exact(a) + (mantissa_exact(a) >= 1.75 ? 1 : 0);
      if (p > max_exponent(r.amax_arith)) {  // the bumped power of two is inf in a's type
        set_byte(r.byte_max);
        return out;
      }
      set_byte(p - emax + 127);
      return out;
    }
    case MxExponentRule::kMsModelSlimFp4: {
      const double a = in(Arith::kFp32, amax);
      const double t = add_in(Arith::kFp32, div_in(Arith::kFp32, a, 0.875), kMsModelSlimLog2Offset);
      const int e = std::isinf(t) ? 125 : std::clamp(floor_log2_exact(t) - emax, -129, 125);
      if (e < -127) {
        out.zero_block = true;
        set_byte(0);
        return out;
      }
      set_byte(e + 127);
      return out;
    }
  }
  return out;
}

double mx_quantize_element(double x, int exponent, const MxScaleRules& r) {
  const double maxv = mx_elem_max(r.elem);
  if (r.element_round == IntRound::kHalfEven) {
    double t = r.element_arith == Arith::kFp64
                   ? std::ldexp(x, -exponent)
                   : div_in(r.element_arith, x, std::ldexp(1.0, exponent));
    if (std::isnan(t)) t = 0.0;  // 0 / 0 when 2^E underflows the element arithmetic (fp16)
    t = std::clamp(t, -maxv, maxv);
    return codec::round_to(elem_format(r.elem), t, codec::Overflow::kSaturate);
  }
  if (r.element_round != IntRound::kHalfAway)
    throw Error("MX element", "rounding must be half-even or half-away");
  // msModelSlim / microxcaling, in fp32.
  const bool fp4 = r.elem == MxElem::kE2M1;
  const int man = elem_format(r.elem).man_bits;
  const int emin = 1 - elem_format(r.elem).bias;  // private exponent floor (min normal)
  const double xs = std::fabs(in(Arith::kFp32, std::ldexp(in(Arith::kFp32, x), -exponent)));
  if (xs == 0) return 0.0;
  const double probe = fp4 ? add_in(Arith::kFp32, xs, kMsModelSlimLog2Offset) : xs;
  int pe = std::max(floor_log2_exact(probe), emin);
  if (fp4) pe = std::min(pe, mx_emax_elem(r.elem));
  const double mant = std::ldexp(xs, man - pe);  // exact power-of-two scaling in fp32's range
  const double rounded = std::floor(add_in(Arith::kFp32, in(Arith::kFp32, mant), 0.5));
  const double v = std::min(std::ldexp(rounded, pe - man), maxv);
  return std::signbit(x) ? -v : v;
}

HostTensor stack_expert_shards(const LinearShape& s,
                               const std::function<const HostTensor&(int64_t e, int64_t p)>& get) {
  HostTensor out;
  const HostTensor& first = get(0, 0);
  out.dtype = first.dtype;
  const bool per_shard_scalar = first.shape.size() == 1 && first.shape[0] == 1;
  if (per_shard_scalar) {
    out.shape = {s.expert_count()};
    if (s.partition_count() > 1) out.shape.push_back(s.partition_count());
  } else {
    out.shape = first.shape;
    out.shape[0] = s.out_features();
    out.shape.insert(out.shape.begin(), s.expert_count());
  }
  for (int64_t e = 0; e < s.expert_count(); ++e)
    for (int64_t p = 0; p < s.partition_count(); ++p) {
      const HostTensor& t = get(e, p);
      if (t.dtype != out.dtype)
        throw Error(s.shard_prefix(e, p), "shards of one expert stack have different dtypes");
      out.bytes.insert(out.bytes.end(), t.bytes.begin(), t.bytes.end());
    }
  return out;
}

HostTensor encode_element_rows(const QuantizedMatrix& q, int64_t row0, int64_t n, MxElem elem,
                               const std::string& where) {
  std::vector<int64_t> row(static_cast<size_t>(q.cols));
  std::vector<double> values;
  values.reserve(static_cast<size_t>(n * q.cols));
  for (int64_t r = row0; r < row0 + n; ++r) {
    q.row_codes(r, row);
    for (int64_t c : row)
      values.push_back(static_cast<double>(c) * q.lattice);
  }
  if (elem == MxElem::kE4M3)
    return encode(DType::kF8E4M3, {n, q.cols}, values, Encoding::kExact, where);
  std::vector<uint8_t> nibbles(values.size());
  for (size_t i = 0; i < values.size(); ++i) {
    nibbles[i] = codec::double_to_e2m1(values[i]);
    if (codec::e2m1_to_double(nibbles[i]) != values[i])
      throw Error(where, std::to_string(values[i]) + " is not an e2m1 value");
  }
  HostTensor t;
  t.dtype = DType::kU8;
  t.shape = {n, q.cols / 2};
  t.bytes = codec::pack_nibbles(nibbles, where);
  return t;
}

QuantizedMatrix mx_quantized_matrix(int64_t rows, int64_t cols, MxElem elem,
                                    std::span<const double> values, std::span<const int> bytes) {
  QuantizedMatrix q;
  q.rows = rows;
  q.cols = cols;
  q.lattice = mx_elem_lattice(elem);
  q.block_rows = 1;
  q.block_cols = kMxBlock;
  q.codes.resize(static_cast<size_t>(rows * cols));
  for (size_t i = 0; i < q.codes.size(); ++i)
    q.codes[i] = lattice_code(values[i], q.lattice);
  q.scales = Matrix(rows, cols / kMxBlock);
  for (size_t i = 0; i < q.scales.data.size(); ++i) {
    if (bytes[i] < 0 || bytes[i] > 254)
      throw Error("mx_quantized_matrix", "E8M0 byte out of range");
    q.scales.data[i] = std::ldexp(1.0, bytes[i] - 127);
  }
  return q;
}

MxBlocks mx_quantize_blocks(const Matrix& m, const MxScaleRules& r, const std::string& where) {
  if (m.cols % kMxBlock != 0)
    throw Error(where, std::to_string(m.cols) + " columns: MX needs a multiple of 32");
  MxBlocks out;
  out.values.resize(m.data.size());
  const int64_t groups = m.cols / kMxBlock;
  out.bytes.resize(static_cast<size_t>(m.rows * groups));
  for (int64_t row = 0; row < m.rows; ++row)
    for (int64_t g = 0; g < groups; ++g) {
      const auto block = m.row(row).subspan(static_cast<size_t>(g * kMxBlock), kMxBlock);
      const MxExponent e = mx_shared_exponent(absmax(block), r);
      if (e.nan)
        throw Error(where, "row " + std::to_string(row) + " block " + std::to_string(g) +
                               ": shared exponent above 127 (amax " +
                               std::to_string(absmax(block)) +
                               ") is NaN in E8M0 and cannot be stored");
      out.bytes[static_cast<size_t>(row * groups + g)] = e.byte;
      for (int64_t k = 0; k < kMxBlock; ++k) {
        const size_t i = static_cast<size_t>(row * m.cols + g * kMxBlock + k);
        out.values[i] = e.zero_block ? 0.0 : mx_quantize_element(m.data[i], e.exponent, r);
      }
    }
  return out;
}

void check_mx_args(const std::optional<QuantArgs>& a, int num_bits, int64_t group_size,
                   const std::string& where) {
  if (group_size != 0 && group_size != kMxBlock)
    throw Error(where, "MX formats have group size 32, not " + std::to_string(group_size));
  if (!a) return;
  if (a->type != QuantType::kFloat || a->num_bits != num_bits)
    throw Error(where, "MXFP" + std::to_string(num_bits) + " needs " + std::to_string(num_bits) +
                           "-bit float args, got " + describe(*a));
  if (a->effective_group_size() != kMxBlock)
    throw Error(where, "MX needs group_size 32 in the args, got " + describe(*a));
}

std::vector<int> decode_e8m0_bytes(const HostTensor& t, const std::string& where) {
  std::vector<int> b(t.bytes.size());
  for (size_t i = 0; i < b.size(); ++i) {
    if (t.bytes[i] == codec::kUe8m0Nan)
      throw Error(where, "element " + std::to_string(i) +
                             " is 255, NaN in E8M0: an MX scale byte must be 0..254");
    b[i] = t.bytes[i];
  }
  return b;
}

MxLinearMethodBase::MxLinearMethodBase(LinearShape shape, MethodConfig config, MxElem elem)
    : LinearMethod(std::move(shape), std::move(config)),
      elem_(elem),
      rules_(mx_scale_rules(dialect(), elem, this->shape().model_dtype)),
      act_(this->config().input_activations.has_value()) {
  const int bits = elem == MxElem::kE2M1 ? 4 : 8;
  if (this->shape().in_features % kMxBlock != 0)
    throw Error(where(elem == MxElem::kE2M1 ? "weight_packed" : "weight", 0, 0),
                "in_features " + std::to_string(this->shape().in_features) +
                    " is not a multiple of 32 (MX block)");
  check_mx_args(this->config().weights, bits, 0, where("weight_scale", 0, 0));
  check_mx_args(this->config().input_activations, bits, 0,
                this->shape().prefix + " input_activations");
}

void MxLinearMethodBase::process() {
  const auto& s = shape();
  const int64_t k = s.in_features;
  for (int64_t e = 0; e < s.expert_count(); ++e) {
    std::vector<double> values;
    std::vector<int> bytes;
    for (int64_t p = 0; p < s.partition_count(); ++p) {
      const auto v = weight_values(p, e);
      values.insert(values.end(), v.begin(), v.end());
      const auto b = decode_e8m0_bytes(loaded("weight_scale", p, e), where("weight_scale", p, e));
      bytes.insert(bytes.end(), b.begin(), b.end());
    }
    weights_.push_back(mx_quantized_matrix(s.out_features(), k, elem_, values, bytes));
    weights_.back().compact();
    biases_.push_back(loaded_bias(e));
  }
}

std::optional<QuantizedMatrix> MxLinearMethodBase::do_quantize_input(const Matrix& x,
                                                                     int64_t expert) const {
  (void)expert;
  if (!act_) return std::nullopt;
  const MxBlocks b = mx_quantize_blocks(x, rules_, shape().prefix + " input");
  return mx_quantized_matrix(x.rows, x.cols, elem_, b.values, b.bytes);
}

Matrix MxLinearMethodBase::do_apply(const Matrix& x, int64_t expert) const {
  const QuantizedMatrix& w = weights_[static_cast<size_t>(expert)];
  Matrix y = act_ ? scaled_gemm(*do_quantize_input(x, expert), w) : weight_only_gemm(x, w);
  const auto& b = biases_[static_cast<size_t>(expert)];
  for (int64_t t = 0; t < y.rows; ++t)
    for (int64_t n = 0; n < y.cols; ++n)
      y(t, n) += b[static_cast<size_t>(n)];
  return y;
}

Matrix MxLinearMethodBase::do_dequantized_weight(int64_t expert) const {
  return dequantize(weights_[static_cast<size_t>(expert)]);
}

TensorMap MxLinearMethodBase::runtime_tensors() const {
  const auto& s = shape();
  if (s.num_experts == 0) return {};
  const std::string pre = s.partition_count() > 1 ? "w13_" : "w2_";
  TensorMap out;
  HostTensor shard;  // the weight of shard (e, p), re-encoded from the run-time codes
  out[pre + weight_name()] = stack_expert_shards(s, [&](int64_t e, int64_t p) -> const HostTensor& {
    shard = encode_element_rows(weights_[static_cast<size_t>(e)], s.partition_offset(p),
                                s.partitions[static_cast<size_t>(p)], elem_,
                                where(weight_name(), p, e));
    return shard;
  });
  out[pre + "weight_scale"] = stack_expert_shards(
      s, [&](int64_t e, int64_t p) -> const HostTensor& { return loaded("weight_scale", p, e); });
  return out;
}

}  // namespace qparity::reference
