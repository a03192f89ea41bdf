#include "schemes/int/pack_quantized_int.h"

#include <algorithm>
#include <cmath>
#include <numeric>

#include "core/error.h"
#include "schemes/description/quant_plan.h"
#include "schemes/fp8/fp8_common.h"
#include "schemes/int/awq_layout.h"
#include "schemes/int/gptq_layout.h"
#include "schemes/int/w8a8_int8_dynamic.h"
#include "schemes/method/parallel.h"

namespace qparity::reference {

namespace {

int64_t qmin_of(int bits) {
  return -(int64_t{1} << (bits - 1));
}
int64_t qmax_of(int bits) {
  return (int64_t{1} << (bits - 1)) - 1;
}
size_t sz(int64_t v) {
  return static_cast<size_t>(v);
}

QuantArgs preset_args(SchemeKind kind, const std::string& where) {
  const auto a = implied_args(SchemeId{kind, 0}).weights;
  if (!a) throw Error(where, "scheme has no weight quantization args");
  return *a;
}

}  // namespace

IntWeightRules int_weight_rules(Dialect d) {
  IntWeightRules r;
  r.dialect = d;
  switch (d) {
    case Dialect::kIdeal:
      r.precision = IntScalePrecision::kExactThenStore;
      break;
    case Dialect::kCompressedTensors:
    case Dialect::kVllm:
    case Dialect::kSglang:
      r.precision = IntScalePrecision::kModelDtype;
      break;
    case Dialect::kMsModelSlim:
      r.half_range_divisor = false;
      r.precision = IntScalePrecision::kFp32;
      r.eps_floor = true;
      break;
  }
  return r;
}

IntWeightRules pack_quantized_rules(Dialect d) {
  IntWeightRules r = int_weight_rules(d == Dialect::kMsModelSlim ? Dialect::kCompressedTensors : d);
  r.dialect = d;
  return r;
}

double int_scale_eps(DType scale_dtype) {
  switch (scale_dtype) {
    case DType::kBF16:
      return 0.0078125;
    case DType::kF16:
      return 0.0009765625;
    case DType::kF32:
      return kFltEpsilon;
    case DType::kF64:
      return 2.220446049250313e-16;
    default:
      throw Error("scale",
                  "dtype " + std::string(dtype_name(scale_dtype)) + " is not a float scale dtype");
  }
}

IntQParams int_qparams(double mn, double mx, int bits, bool symmetric, const IntWeightRules& r,
                       DType scale_dtype) {
  mn = std::min(mn, 0.0);
  mx = std::max(mx, 0.0);
  const auto qmin = static_cast<double>(qmin_of(bits));
  const auto qmax = static_cast<double>(qmax_of(bits));
  const double range = qmax - qmin;
  const double divisor = r.half_range_divisor ? range / 2 : qmax;
  const Arith store = arith_of(scale_dtype, "scale");
  const Arith a = r.precision == IntScalePrecision::kExactThenStore ? Arith::kFp64
                  : r.precision == IntScalePrecision::kFp32         ? Arith::kFp32
                                                                    : store;
  double s = 0;
  if (symmetric) {
    s = div_in(a, std::max(-mn, mx), divisor);
  } else if (r.precision == IntScalePrecision::kFp32) {
    s = sub_in(a, div_in(a, mx, range), div_in(a, mn, range));  // msModelSlim: two divisions
  } else {
    s = div_in(a, sub_in(a, mx, mn), range);
  }
  s = in(store, s);
  if (r.eps_floor)
    s = std::max(s, kFltEpsilon);
  else if (s == 0)
    s = int_scale_eps(scale_dtype);
  s = in(store, s);
  IntQParams p;
  p.scale = s;
  if (!symmetric) {
    // compressed-tensors: zp = q_min - min/s; msModelSlim: round(-min/s) + q_min (equal after
    // rounding since q_min is an integer; the arithmetic precision differs).
    const double zf = sub_in(a, qmin, div_in(a, mn, s));
    p.zero_point = quantize_int(zf, IntRound::kHalfEven, qmin_of(bits), qmax_of(bits));
  }
  return p;
}

int64_t int_quantize(double x, const IntQParams& p, int bits, const IntWeightRules& r,
                     DType scale_dtype) {
  const Arith a = r.precision == IntScalePrecision::kExactThenStore ? Arith::kFp64
                  : r.precision == IntScalePrecision::kFp32         ? Arith::kFp32
                                                            : arith_of(scale_dtype, "scale");
  if (a == Arith::kFp64 && r.round == IntRound::kHalfEven && p.scale > 0) {
    // ideal: the exact x/s rounded once, ties decided exactly (numeric.h); an integer zero
    // point moves the rounding grid by whole steps, so adding it after rounding is the same.
    const double q = int_of_quotient(x, 1.0, p.scale) + static_cast<double>(p.zero_point);
    return static_cast<int64_t>(
        std::clamp(q, static_cast<double>(qmin_of(bits)), static_cast<double>(qmax_of(bits))));
  }
  double t = div_in(a, x, p.scale);
  if (p.zero_point != 0) t = add_in(a, t, static_cast<double>(p.zero_point));
  return quantize_int(t, r.round, qmin_of(bits), qmax_of(bits));
}

Matrix dequantize(const IntWeight& w) {
  Matrix out(w.rows, w.cols);
  for (int64_t r = 0; r < w.rows; ++r)
    for (int64_t c = 0; c < w.cols; ++c) {
      const int64_t g = w.group[sz(c)];
      out(r, c) = static_cast<double>(w.q[sz(r * w.cols + c)] - w.zero[sz(r * w.groups + g)]) *
                  w.scales(r, g);
    }
  return out;
}

int64_t pack_quantized_group(const QuantArgs& a, int64_t in_features, const std::string& where) {
  if (a.type != QuantType::kInt)
    throw Error(where,
                "pack-quantized weights must be type int, got " + std::string(to_string(a.type)));
  if (a.num_bits < 2 || a.num_bits > 8)
    throw Error(where,
                "pack-quantized num_bits " + std::to_string(a.num_bits) + " not supported (2..8)");
  if (a.is_dynamic()) throw Error(where, "pack-quantized weights must be static");
  switch (a.strategy) {
    case QuantStrategy::kGroup: {
      const int64_t g = a.effective_group_size();
      if (g <= 0) throw Error(where, "strategy group needs group_size > 0");
      if (in_features % g != 0)
        throw Error(where, "in_features " + std::to_string(in_features) +
                               " is not a multiple of group_size " + std::to_string(g));
      return g;
    }
    case QuantStrategy::kChannel:
    case QuantStrategy::kTensor:
      if (a.actorder == ActOrder::kGroup) throw Error(where, "actorder group needs strategy group");
      return in_features;
    default:
      throw Error(where, "pack-quantized strategy " + std::string(to_string(a.strategy)) +
                             " not supported (group, channel, tensor)");
  }
}

std::vector<int64_t> checked_g_idx(std::span<const int64_t> gi, int64_t groups, int64_t gsize,
                                   const std::string& where) {
  std::vector<int64_t> count(sz(groups), 0);
  for (size_t c = 0; c < gi.size(); ++c) {
    const int64_t g = gi[c];
    if (g < 0 || g >= groups)
      throw Error(where, "element " + std::to_string(c) + " = " + std::to_string(g) +
                             " outside [0, " + std::to_string(groups) + ")");
    ++count[sz(g)];
  }
  for (int64_t g = 0; g < groups; ++g)
    if (count[sz(g)] != gsize)
      throw Error(where, "group " + std::to_string(g) + " has " + std::to_string(count[sz(g)]) +
                             " columns, group_size is " + std::to_string(gsize) +
                             " (compressed-tensors and vLLM group the argsort of g_idx in runs "
                             "of group_size)");
  return {gi.begin(), gi.end()};
}

IntCodeStorage int_code_storage(const std::string& format) {
  if (format == "int-quantized" || format == "naive-quantized") return IntCodeStorage::kUnpacked;
  if (format == "gptq") return IntCodeStorage::kGptqV1;
  if (format == "gptq_v2") return IntCodeStorage::kGptqV2;
  if (format == "awq") return IntCodeStorage::kAwqGemm;
  return IntCodeStorage::kPacked;
}

std::string int_storage_format(IntCodeStorage s) {
  switch (s) {
    case IntCodeStorage::kPacked:
      return "pack-quantized";
    case IntCodeStorage::kUnpacked:
      return "int-quantized";
    case IntCodeStorage::kGptqV1:
      return "gptq";
    case IntCodeStorage::kGptqV2:
      return "gptq_v2";
    case IntCodeStorage::kAwqGemm:
      return "awq";
  }
  return "pack-quantized";
}

bool is_producer_int_storage(IntCodeStorage s) {
  return s == IntCodeStorage::kGptqV1 || s == IntCodeStorage::kGptqV2 ||
         s == IntCodeStorage::kAwqGemm;
}

std::vector<ParamSpec> pack_quantized_specs(const QuantArgs& a, codec::CtPackLayout layout,
                                            int64_t n, int64_t k, std::vector<DType> scale_dtypes,
                                            IntCodeStorage storage) {
  if (storage == IntCodeStorage::kGptqV1 || storage == IntCodeStorage::kGptqV2)
    return gptq_specs(a, n, k, std::move(scale_dtypes));
  if (storage == IntCodeStorage::kAwqGemm) return awq_specs(a, n, k, std::move(scale_dtypes));
  const int64_t g = pack_quantized_group(a, k, "pack-quantized");
  const int64_t groups = k / g;
  std::vector<int64_t> scale_shape = a.strategy == QuantStrategy::kTensor ? std::vector<int64_t>{1}
                                     : a.strategy == QuantStrategy::kChannel
                                         ? std::vector<int64_t>{n, 1}
                                         : std::vector<int64_t>{n, groups};
  if (storage == IntCodeStorage::kUnpacked) {
    std::vector<ParamSpec> specs = {
        {"weight", {DType::kI8}, {n, k}, true, "one signed code per element"},
        {"weight_scale", std::move(scale_dtypes), scale_shape, true, ""}};
    if (!a.symmetric)
      specs.push_back({"weight_zero_point", {DType::kI8}, scale_shape, true, "unpacked int8"});
    if (a.actorder == ActOrder::kGroup)
      specs.push_back({"weight_g_idx", {DType::kI32}, {k}, true, "group of each column"});
    return specs;
  }
  std::vector<ParamSpec> specs = {
      {"weight_packed",
       {DType::kI32},
       {n, static_cast<int64_t>(codec::ct_packed_len(sz(k), a.num_bits, layout))},
       true,
       "u = q + 2^(b-1) packed along K"},
      {"weight_scale", std::move(scale_dtypes), scale_shape, true, ""},
      {"weight_shape", {DType::kI64}, {2}, true, "[N, K]"}};
  if (!a.symmetric) {
    if (a.strategy == QuantStrategy::kTensor)
      specs.push_back({"weight_zero_point", {DType::kI8}, {1}, true, "unpacked int8"});
    else
      specs.push_back(
          {"weight_zero_point",
           {DType::kI32},
           {static_cast<int64_t>(codec::ct_packed_len(sz(n), a.num_bits, layout)), groups},
           true,
           "packed along N"});
  }
  if (a.actorder == ActOrder::kGroup)
    specs.push_back({"weight_g_idx", {DType::kI32}, {k}, true, "group of each column"});
  return specs;
}

IntWeight decode_pack_quantized(const std::function<const HostTensor*(const std::string&)>& get,
                                const std::function<std::string(const std::string&)>& where,
                                const QuantArgs& a, codec::CtPackLayout layout, int64_t n,
                                int64_t k, IntCodeStorage storage) {
  if (storage == IntCodeStorage::kGptqV1 || storage == IntCodeStorage::kGptqV2)
    return decode_gptq(
        get, where, a,
        storage == IntCodeStorage::kGptqV1 ? GptqZeroFormat::kV1 : GptqZeroFormat::kV2, n, k);
  if (storage == IntCodeStorage::kAwqGemm) return decode_awq(get, where, a, n, k);
  const auto need = [&](const std::string& name) -> const HostTensor& {
    const HostTensor* t = get(name);
    if (!t) throw Error(where(name), "missing");
    return *t;
  };
  const int bits = a.num_bits;
  const bool unpacked = storage == IntCodeStorage::kUnpacked;
  const int64_t gsize = pack_quantized_group(a, k, where(unpacked ? "weight" : "weight_packed"));
  IntWeight w;
  w.rows = n;
  w.cols = k;
  w.groups = k / gsize;

  if (unpacked) {
    // One signed code per I8 element, inside the b-bit range (an int4 code of 9 is not one).
    const std::string wq = where("weight");
    const auto q = decode_ints(need("weight").view(), wq);
    if (static_cast<int64_t>(q.size()) != n * k)
      throw Error(wq, "holds " + std::to_string(q.size()) + " codes, the layer expects " +
                          std::to_string(n * k));
    for (size_t i = 0; i < q.size(); ++i)
      if (q[i] < qmin_of(bits) || q[i] > qmax_of(bits))
        throw Error(wq, "element " + std::to_string(i) + " = " + std::to_string(q[i]) +
                            " is outside the " + std::to_string(bits) + "-bit range [" +
                            std::to_string(qmin_of(bits)) + ", " + std::to_string(qmax_of(bits)) +
                            "]");
    w.q = q;
  } else {
    // weight_shape must say what the layer expects.
    const auto shp = decode_ints(need("weight_shape").view(), where("weight_shape"));
    if (shp.size() != 2 || shp[0] != n || shp[1] != k)
      throw Error(where("weight_shape"), "holds " + shape_string(shp) + ", the layer expects [" +
                                             std::to_string(n) + ", " + std::to_string(k) + "]");
  }

  // Codes.
  if (!unpacked) {
    const HostTensor& packed = need("weight_packed");
    const auto words = decode_ints(packed.view(), where("weight_packed"));
    const auto kp = static_cast<int64_t>(codec::ct_packed_len(sz(k), bits, layout));
    if (packed.shape.size() != 2 || packed.shape[0] != n || packed.shape[1] != kp)
      throw Error(where("weight_packed"), "shape " + shape_string(packed.shape) + ", expected [" +
                                              std::to_string(n) + ", " + std::to_string(kp) + "]");
    w.q.resize(sz(n * k));
    std::vector<int32_t> row(sz(kp));
    for (int64_t r = 0; r < n; ++r) {
      for (int64_t j = 0; j < kp; ++j)
        row[sz(j)] = static_cast<int32_t>(words[sz(r * kp + j)]);
      const auto v = codec::ct_unpack(row, sz(k), bits, layout,
                                      where("weight_packed") + " row " + std::to_string(r));
      for (int64_t c = 0; c < k; ++c)
        w.q[sz(r * k + c)] = v[sz(c)];
    }
  }

  // Scales: finite and > 0, expanded to [n, groups].
  const std::string ws = where("weight_scale");
  const auto sv = decode(need("weight_scale").view(), ws);
  require_finite(sv, ws);
  for (size_t i = 0; i < sv.size(); ++i)
    if (!(sv[i] > 0))
      throw Error(ws, "element " + std::to_string(i) + " = " + std::to_string(sv[i]) +
                          ": scales must be > 0");
  w.scales = Matrix(n, w.groups);
  for (int64_t r = 0; r < n; ++r)
    for (int64_t g = 0; g < w.groups; ++g)
      w.scales(r, g) = a.strategy == QuantStrategy::kTensor ? sv[0] : sv[sz(r * w.groups + g)];

  // Zero points.
  w.zero.assign(sz(n * w.groups), 0);
  if (!a.symmetric) {
    const std::string wz = where("weight_zero_point");
    const HostTensor& zt = need("weight_zero_point");
    if (a.strategy == QuantStrategy::kTensor) {
      const auto z = decode_ints(zt.view(), wz);
      if (z[0] < qmin_of(bits) || z[0] > qmax_of(bits))
        throw Error(wz, "zero point " + std::to_string(z[0]) + " outside the " +
                            std::to_string(bits) + "-bit range");
      std::fill(w.zero.begin(), w.zero.end(), z[0]);
    } else if (unpacked) {
      const auto z = decode_ints(zt.view(), wz);  // [N, G] (channel: [N, 1])
      for (size_t i = 0; i < z.size(); ++i)
        if (z[i] < qmin_of(bits) || z[i] > qmax_of(bits))
          throw Error(wz, "element " + std::to_string(i) + " = " + std::to_string(z[i]) +
                              " is outside the " + std::to_string(bits) + "-bit range");
      w.zero = z;
    } else {
      const auto zw = decode_ints(zt.view(), wz);
      const auto np = static_cast<int64_t>(codec::ct_packed_len(sz(n), bits, layout));
      std::vector<int32_t> col(sz(np));
      for (int64_t g = 0; g < w.groups; ++g) {
        for (int64_t j = 0; j < np; ++j)
          col[sz(j)] = static_cast<int32_t>(zw[sz(j * w.groups + g)]);
        const auto v =
            codec::ct_unpack(col, sz(n), bits, layout, wz + " column " + std::to_string(g));
        for (int64_t r = 0; r < n; ++r)
          w.zero[sz(r * w.groups + g)] = v[sz(r)];
      }
    }
  }

  // Column groups.
  w.group.resize(sz(k));
  for (int64_t c = 0; c < k; ++c)
    w.group[sz(c)] = c / gsize;
  if (a.actorder == ActOrder::kGroup) {
    const std::string wg = where("weight_g_idx");
    const auto gi = decode_ints(need("weight_g_idx").view(), wg);
    const bool column_order = std::find(gi.begin(), gi.end(), -1) != gi.end();
    if (!column_order) w.group = checked_g_idx(gi, w.groups, gsize, wg);
  }
  return w;
}

FusedIntWeight fuse_int_weights(const std::vector<IntWeight>& shards, int64_t group_size,
                                const std::string& where) {
  FusedIntWeight f;
  const int64_t k = shards.at(0).cols;
  const auto& group = shards[0].group;
  int64_t rows = 0;
  for (const auto& s : shards) {
    if (s.cols != k || s.groups != shards[0].groups)
      throw Error(where, "fused shards differ in in_features or group count");
    if (s.group != group)
      throw Error(where,
                  "fused shards carry different weight_g_idx (vLLM keeps one g_idx per "
                  "fused layer; the shards must agree)");
    rows += s.rows;
  }
  f.perm.resize(sz(k));
  std::iota(f.perm.begin(), f.perm.end(), 0);
  std::stable_sort(f.perm.begin(), f.perm.end(),
                   [&](int64_t a, int64_t b) { return group[sz(a)] < group[sz(b)]; });
  for (int64_t j = 0; j < k; ++j)
    if (f.perm[sz(j)] != j) f.identity = false;
  f.group = group;
  const int64_t groups = shards[0].groups;
  const int64_t bc = groups == 1 ? k : group_size;
  for (int64_t j = 0; j < k; ++j)  // the scale grid indexes permuted column j by j / bc
    if (group[sz(f.perm[sz(j)])] != j / bc)
      throw Error(where, "weight_g_idx groups are not all of size " + std::to_string(bc));
  QuantizedMatrix& q = f.w;
  q.rows = rows;
  q.cols = k;
  q.codes.resize(sz(rows * k));
  q.block_rows = 1;
  q.block_cols = bc;
  q.scales = Matrix(rows, groups);
  bool any_zero = false;
  for (const auto& s : shards)
    for (int64_t z : s.zero)
      any_zero = any_zero || z != 0;
  if (any_zero) q.zero_points.resize(sz(rows * groups));
  int64_t off = 0;
  for (const auto& s : shards) {
    for (int64_t r = 0; r < s.rows; ++r) {
      for (int64_t j = 0; j < k; ++j)
        q.codes[sz((off + r) * k + j)] = s.q[sz(r * k + f.perm[sz(j)])];
      for (int64_t g = 0; g < groups; ++g) {
        q.scales(off + r, g) = s.scales(r, g);
        if (any_zero) q.zero_points[sz((off + r) * groups + g)] = s.zero[sz(r * groups + g)];
      }
    }
    off += s.rows;
  }
  validate(q, "fused pack-quantized weight");
  q.compact();
  return f;
}

std::vector<IntWeight> unfuse_int_weights(const FusedIntWeight& f,
                                          std::span<const int64_t> partitions) {
  const QuantizedMatrix& q = f.w;
  const int64_t k = q.cols, groups = q.scales.cols;
  std::vector<IntWeight> out;
  std::vector<int64_t> row(sz(k));
  int64_t off = 0;
  for (int64_t n : partitions) {
    IntWeight s;
    s.rows = n;
    s.cols = k;
    s.groups = groups;
    s.group = f.group;
    s.q.resize(sz(n * k));
    s.scales = Matrix(n, groups);
    s.zero.assign(sz(n * groups), 0);
    for (int64_t r = 0; r < n; ++r) {
      q.stored_row(off + r, row);
      for (int64_t j = 0; j < k; ++j)
        s.q[sz(r * k + f.perm[sz(j)])] = row[sz(j)];
      for (int64_t g = 0; g < groups; ++g) {
        s.scales(r, g) = q.scales(off + r, g);
        if (!q.zero_points.empty())
          s.zero[sz(r * groups + g)] = q.zero_points[sz((off + r) * groups + g)];
      }
    }
    out.push_back(std::move(s));
    off += n;
  }
  return out;
}

Matrix permuted_columns(const FusedIntWeight& f, const Matrix& x) {
  if (f.identity) return x;
  Matrix xp(x.rows, x.cols);
  for (int64_t t = 0; t < x.rows; ++t)
    for (int64_t j = 0; j < x.cols; ++j)
      xp(t, j) = x(t, f.perm[sz(j)]);
  return xp;
}

Matrix apply_fused(const FusedIntWeight& f, const Matrix& x) {
  return weight_only_gemm(f.identity ? x : permuted_columns(f, x), f.w);
}

namespace {

// Columns in the order GPTQ's actorder would visit them (descending activation magnitude), or
// column order without statistics; returns the group of each column.
std::vector<int64_t> actorder_groups(const QuantizeRequest& req, int64_t k, int64_t gsize) {
  std::vector<int64_t> perm(sz(k));
  std::iota(perm.begin(), perm.end(), 0);
  if (req.activations && !req.activations->channel_absmax.empty()) {
    const auto& m = req.activations->channel_absmax;
    if (static_cast<int64_t>(m.size()) != k)
      throw Error(req.where, "activation channel_absmax has " + std::to_string(m.size()) +
                                 " entries, in_features is " + std::to_string(k));
    std::stable_sort(perm.begin(), perm.end(),
                     [&](int64_t a, int64_t b) { return m[sz(a)] > m[sz(b)]; });
  }
  std::vector<int64_t> group(sz(k));
  for (int64_t j = 0; j < k; ++j)
    group[sz(perm[sz(j)])] = j / gsize;
  return group;
}

HostTensor pack_rows(const std::vector<int64_t>& codes, int64_t rows, int64_t cols, int bits,
                     codec::CtPackLayout layout, const std::string& where) {
  const auto len = static_cast<int64_t>(codec::ct_packed_len(sz(cols), bits, layout));
  std::vector<int64_t> words(sz(rows * len));
  std::vector<int8_t> row(sz(cols));
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t c = 0; c < cols; ++c)
      row[sz(c)] = static_cast<int8_t>(codes[sz(r * cols + c)]);
    const auto w = codec::ct_pack(row, bits, layout, where);
    for (int64_t j = 0; j < len; ++j)
      words[sz(r * len + j)] = w[sz(j)];
  }
  return encode_ints(DType::kI32, {rows, len}, words, where);
}

}  // namespace

TensorMap quantize_pack_quantized(const QuantizeRequest& req, codec::CtPackLayout layout,
                                  IntCodeStorage storage) {
  const bool unpacked = storage == IntCodeStorage::kUnpacked;
  QuantArgs a = req.weights ? *req.weights : preset_args(SchemeKind::kPackedInt, req.where);
  if (req.group_size > 0 && a.strategy == QuantStrategy::kGroup) a.group_size = req.group_size;
  const int64_t n = req.weight.rows;
  const int64_t k = req.weight.cols;
  const int64_t gsize = pack_quantized_group(a, k, req.where);
  arith_of(req.model_dtype, req.where);
  require_finite(req.weight.data, req.where);
  const IntWeightRules rules = pack_quantized_rules(req.dialect);
  const int bits = a.num_bits;
  if (is_producer_int_storage(storage)) {
    // The producer's own round-to-nearest and layout; scales in fp16 as both store them.
    if (a.strategy == QuantStrategy::kTensor)
      throw Error(req.where, int_storage_format(storage) + " has no per-tensor scale");
    std::vector<int64_t> group;
    if (a.actorder == ActOrder::kGroup) group = actorder_groups(req, k, gsize);
    const bool exact = req.dialect == Dialect::kIdeal;
    TensorMap out;
    if (storage == IntCodeStorage::kAwqGemm) {
      if (a.actorder == ActOrder::kGroup)
        throw Error(req.where, "awq has no act order (no g_idx tensor)");
      out = encode_awq(
          quantize_awq_rtn(req.weight, bits, gsize, a.symmetric, DType::kF16, exact, req.where),
          bits, DType::kF16, req.where);
    } else {
      out = encode_gptq(
          quantize_gptq_rtn(req.weight, bits, gsize, a.symmetric, std::move(group), DType::kF16,
                            exact, req.where),
          bits, storage == IntCodeStorage::kGptqV1 ? GptqZeroFormat::kV1 : GptqZeroFormat::kV2,
          DType::kF16, req.where);
    }
    add_bias(out, req, req.model_dtype);
    return out;
  }

  IntWeight w;
  w.rows = n;
  w.cols = k;
  w.groups = k / gsize;
  w.group.resize(sz(k));
  if (a.actorder == ActOrder::kGroup)
    w.group = actorder_groups(req, k, gsize);
  else
    for (int64_t c = 0; c < k; ++c)
      w.group[sz(c)] = c / gsize;
  w.scales = Matrix(n, w.groups);
  w.zero.assign(sz(n * w.groups), 0);
  w.q.resize(sz(n * k));

  // Extremes per reduction set (tensor: everything; channel: a row; group: row x group).
  const int64_t sets_per_row = a.strategy == QuantStrategy::kTensor ? 1 : w.groups;
  std::vector<double> mn(sz(a.strategy == QuantStrategy::kTensor ? 1 : n * sets_per_row), 0.0);
  std::vector<double> mx(mn.size(), 0.0);
  const auto set_of = [&](int64_t r, int64_t c) -> size_t {
    if (a.strategy == QuantStrategy::kTensor) return 0;
    return sz(r * sets_per_row + w.group[sz(c)]);
  };
  // In parallel over rows: each row's extremes per set (a tensor's set reduced over the rows after:
  // min and max are exact in any order), then each set's parameters, then every code from its
  // element and its set's parameters alone, so nothing depends on the thread count.
  const int64_t row_sets = a.strategy == QuantStrategy::kTensor ? 1 : sets_per_row;
  std::vector<double> row_mn(sz(n * row_sets), 0.0), row_mx(row_mn.size(), 0.0);
  parallel_chunks(n, n * k, [&](int64_t r0, int64_t r1) {
    for (int64_t r = r0; r < r1; ++r)
      for (int64_t c = 0; c < k; ++c) {
        const size_t s = sz(r * row_sets) + (row_sets == 1 ? 0 : sz(w.group[sz(c)]));
        row_mn[s] = std::min(row_mn[s], req.weight(r, c));
        row_mx[s] = std::max(row_mx[s], req.weight(r, c));
      }
  });
  if (a.strategy == QuantStrategy::kTensor) {
    for (int64_t r = 0; r < n; ++r) {
      mn[0] = std::min(mn[0], row_mn[sz(r)]);
      mx[0] = std::max(mx[0], row_mx[sz(r)]);
    }
  } else {
    mn = std::move(row_mn);
    mx = std::move(row_mx);
  }
  std::vector<IntQParams> qp(mn.size());
  const auto sets = static_cast<int64_t>(mn.size());
  parallel_chunks(sets, 64 * sets, [&](int64_t s0, int64_t s1) {
    for (int64_t s = s0; s < s1; ++s)
      qp[sz(s)] = int_qparams(mn[sz(s)], mx[sz(s)], bits, a.symmetric, rules, req.model_dtype);
  });
  parallel_chunks(n, 8 * n * k, [&](int64_t r0, int64_t r1) {
    for (int64_t r = r0; r < r1; ++r) {
      for (int64_t c = 0; c < k; ++c)
        w.q[sz(r * k + c)] =
            int_quantize(req.weight(r, c), qp[set_of(r, c)], bits, rules, req.model_dtype);
      for (int64_t g = 0; g < w.groups; ++g) {
        const IntQParams& p = qp[a.strategy == QuantStrategy::kTensor ? 0 : sz(r * w.groups + g)];
        w.scales(r, g) = p.scale;
        w.zero[sz(r * w.groups + g)] = p.zero_point;
      }
    }
  });

  TensorMap out;
  if (unpacked)
    out["weight"] = encode_ints(DType::kI8, {n, k}, w.q, req.where + ".weight");
  else
    out["weight_packed"] = pack_rows(w.q, n, k, bits, layout, req.where + ".weight_packed");
  std::vector<double> scale_values;
  std::vector<int64_t> scale_shape;
  if (a.strategy == QuantStrategy::kTensor) {
    scale_values = {qp[0].scale};
    scale_shape = {1};
  } else {
    scale_values = w.scales.data;
    scale_shape = {n, w.groups};
  }
  out["weight_scale"] = encode(req.model_dtype, scale_shape, scale_values, Encoding::kNearest,
                               req.where + ".weight_scale");
  const std::vector<int64_t> shape_values = {n, k};
  if (!unpacked)
    out["weight_shape"] = encode_ints(DType::kI64, {2}, shape_values, req.where + ".weight_shape");
  if (!a.symmetric) {
    if (a.strategy == QuantStrategy::kTensor) {
      const std::vector<int64_t> z = {qp[0].zero_point};
      out["weight_zero_point"] = encode_ints(DType::kI8, {1}, z, req.where + ".weight_zero_point");
    } else if (unpacked) {
      out["weight_zero_point"] =
          encode_ints(DType::kI8, {n, w.groups}, w.zero, req.where + ".weight_zero_point");
    } else {
      // [N, G] packed along N: transpose, pack each column's N values, transpose back.
      std::vector<int64_t> zt(sz(w.groups * n));
      for (int64_t r = 0; r < n; ++r)
        for (int64_t g = 0; g < w.groups; ++g)
          zt[sz(g * n + r)] = w.zero[sz(r * w.groups + g)];
      const HostTensor packed_t =
          pack_rows(zt, w.groups, n, bits, layout, req.where + ".weight_zero_point");
      const auto words = decode_ints(packed_t.view(), "weight_zero_point");
      const int64_t np = packed_t.shape[1];
      std::vector<int64_t> zw(sz(np * w.groups));
      for (int64_t g = 0; g < w.groups; ++g)
        for (int64_t j = 0; j < np; ++j)
          zw[sz(j * w.groups + g)] = words[sz(g * np + j)];
      out["weight_zero_point"] =
          encode_ints(DType::kI32, {np, w.groups}, zw, req.where + ".weight_zero_point");
    }
  }
  if (a.actorder == ActOrder::kGroup)
    out["weight_g_idx"] = encode_ints(DType::kI32, {k}, w.group, req.where + ".weight_g_idx");
  add_bias(out, req, req.model_dtype);
  return out;
}

Matrix dequantize_pack_quantized(const TensorMap& tensors, const QuantArgs& args,
                                 codec::CtPackLayout layout, const std::string& where) {
  const auto get = [&](const std::string& name) -> const HostTensor* {
    const auto it = tensors.find(name);
    return it == tensors.end() ? nullptr : &it->second;
  };
  const auto name = [&](const std::string& n) { return where + "." + n; };
  const HostTensor* shp = get("weight_shape");
  if (!shp) throw Error(name("weight_shape"), "missing");
  const auto s = decode_ints(shp->view(), name("weight_shape"));
  if (s.size() != 2) throw Error(name("weight_shape"), "must hold [N, K]");
  return dequantize(decode_pack_quantized(get, name, args, layout, s[0], s[1]));
}

PackQuantizedLinearMethod::PackQuantizedLinearMethod(LinearShape shape, MethodConfig config,
                                                     codec::CtPackLayout layout)
    : LinearMethod(std::move(shape), std::move(config)), layout_(layout) {
  const std::string& p = this->shape().prefix;
  args_ = this->config().weights ? *this->config().weights : preset_args(SchemeKind::kPackedInt, p);
  inputs_ = this->config().scheme.int_inputs;
  const auto& a = this->config().input_activations;
  if (inputs_ == IntWeightInputs::kNone && a)
    throw Error(p, "pack-quantized " + to_string(this->config().scheme) +
                       " is weight-only; input_activations must be absent");
  if (inputs_ != IntWeightInputs::kNone && (!a || int_weight_inputs_of(*a, p) != inputs_))
    throw Error(p, to_string(this->config().scheme) + " needs its per-token input args, got " +
                       (a ? describe(*a) : std::string("none")));
  storage_ = int_code_storage(this->config().format);
  group_size_ = pack_quantized_group(args_, this->shape().in_features, p);
}

std::vector<ParamSpec> PackQuantizedLinearMethod::create_weights(int64_t partition) const {
  const auto& s = shape();
  auto specs =
      pack_quantized_specs(args_, layout_, s.partitions.at(sz(partition)), s.in_features,
                           {s.model_dtype, DType::kBF16, DType::kF16, DType::kF32}, storage_);
  specs.push_back(bias_spec(s, partition));
  return specs;
}

void PackQuantizedLinearMethod::process() {
  const auto& s = shape();
  for (int64_t e = 0; e < s.expert_count(); ++e) {
    std::vector<IntWeight> parts;
    for (int64_t p = 0; p < s.partition_count(); ++p) {
      parts.push_back(
          decode_pack_quantized([&](const std::string& n) { return find_loaded(n, p, e); },
                                [&](const std::string& n) { return where(n, p, e); }, args_,
                                layout_, s.partitions[sz(p)], s.in_features, storage_));
      // vLLM and SGLang create GPTQ / AWQ scale parameters in the model dtype and copy the
      // checkpoint's fp16 scales into them: a bf16 model runs them rounded to bf16.
      if (is_producer_int_storage(storage_) &&
          (dialect() == Dialect::kVllm || dialect() == Dialect::kSglang))
        for (double& v : parts.back().scales.data)
          v = in(arith_of(s.model_dtype), v);
    }
    fused_.push_back(fuse_int_weights(parts, group_size_, where("weight_g_idx", 0, e)));
    biases_.push_back(loaded_bias(e));
  }
}

QuantizedMatrix PackQuantizedLinearMethod::quantize_permuted_input(const Matrix& xp) const {
  if (inputs_ == IntWeightInputs::kInt8Token)
    return quantize_int8_per_token(xp, int8_act_rules(dialect()), shape().model_dtype);
  return quantize_activation_fp8(
      xp, Fp8Act::kDynamicToken,
      fp8_rules(dialect()).activation_rule(Fp8Act::kDynamicToken, shape().model_dtype));
}

std::optional<QuantizedMatrix> PackQuantizedLinearMethod::do_quantize_input(const Matrix& x,
                                                                            int64_t expert) const {
  if (inputs_ == IntWeightInputs::kNone) return std::nullopt;
  // In the fused weight's column order (act order permutes it; the codes are the same values).
  return quantize_permuted_input(permuted_columns(fused_[sz(expert)], x));
}

Matrix PackQuantizedLinearMethod::do_apply(const Matrix& x, int64_t expert) const {
  Matrix y = inputs_ == IntWeightInputs::kNone
                 ? apply_fused(fused_[sz(expert)], x)
                 : scaled_gemm(quantize_permuted_input(permuted_columns(fused_[sz(expert)], x)),
                               fused_[sz(expert)].w, inputs_ == IntWeightInputs::kInt8Token);
  const auto& b = biases_[sz(expert)];
  for (int64_t t = 0; t < y.rows; ++t)
    for (int64_t n = 0; n < y.cols; ++n)
      y(t, n) += b[sz(n)];
  return y;
}

std::optional<ProcessedIntWeight> PackQuantizedLinearMethod::processed_int_weight(
    int64_t expert) const {
  const FusedIntWeight& f = fused_.at(sz(expert));
  if (f.w.block_cols != group_size_ || f.w.block_rows != 1)
    throw Error(shape().prefix, "fused weight blocks [" + std::to_string(f.w.block_rows) + ", " +
                                    std::to_string(f.w.block_cols) + "] are not [1, group " +
                                    std::to_string(group_size_) + "]");
  ProcessedIntWeight w = int_weight_of(f.w, group_size_, args_.num_bits, IntCodes::kStored);
  w.scale = f.w.scales.data;
  w.zero.assign(w.scale.size(), 0.0);
  for (size_t i = 0; i < f.w.zero_points.size() && i < w.zero.size(); ++i)
    w.zero[i] = static_cast<double>(f.w.zero_points[i]);
  if (!f.identity) w.perm = f.perm;  // the codes above are in the permuted column order
  const auto& b = biases_.at(sz(expert));
  if (std::any_of(b.begin(), b.end(), [](double v) { return v != 0.0; })) w.bias = b;
  return w;
}

Matrix PackQuantizedLinearMethod::do_dequantized_weight(int64_t expert) const {
  const auto parts = unfuse_int_weights(fused_[sz(expert)], shape().partitions);
  Matrix w(shape().out_features(), shape().in_features);
  int64_t off = 0;
  for (const auto& p : parts) {
    const Matrix d = dequantize(p);
    std::copy(d.data.begin(), d.data.end(), w.data.begin() + off * w.cols);
    off += p.rows;
  }
  return w;
}

TensorMap PackQuantizedLinearMethod::runtime_tensors() const {
  if (shape().num_experts == 0) return {};
  std::vector<std::vector<IntWeight>> shards;
  for (const auto& f : fused_)
    shards.push_back(unfuse_int_weights(f, shape().partitions));
  return stacked_runtime_tensors(shards, shape(), args_.num_bits, layout_, shape().model_dtype);
}

TensorMap stacked_runtime_tensors(const std::vector<std::vector<IntWeight>>& shards,
                                  const LinearShape& shape, int bits, codec::CtPackLayout layout,
                                  DType scale_dtype) {
  if (shape.partition_count() > 2)
    throw Error(shape.prefix, "an expert stack has one (w2) or two (w13) partitions");
  const std::string pre = shape.partition_count() == 2 ? "w13_" : "w2_";
  const int64_t e_count = shape.expert_count();
  const int64_t n = shape.out_features();
  const int64_t k = shape.in_features;
  const auto kp = static_cast<int64_t>(codec::ct_packed_len(sz(k), bits, layout));
  const int64_t groups = shards.at(0).at(0).groups;
  std::vector<int64_t> words;
  std::vector<double> scales;
  std::vector<double> shapes;
  for (int64_t e = 0; e < e_count; ++e) {
    for (const auto& s : shards[sz(e)]) {
      const HostTensor t = pack_rows(s.q, s.rows, s.cols, bits, layout, shape.prefix);
      const auto w = decode_ints(t.view(), shape.prefix);
      words.insert(words.end(), w.begin(), w.end());
      for (int64_t r = 0; r < s.rows; ++r)
        for (int64_t g = 0; g < groups; ++g)
          scales.push_back(s.scales(r, g));
    }
    shapes.push_back(static_cast<double>(shape.partitions[0]));
    shapes.push_back(static_cast<double>(k));
  }
  TensorMap out;
  out[pre + "weight_packed"] =
      encode_ints(DType::kI32, {e_count, n, kp}, words, pre + "weight_packed");
  out[pre + "weight_scale"] =
      encode(scale_dtype, {e_count, n, groups}, scales, Encoding::kNearest, pre + "weight_scale");
  out[pre + "weight_shape"] =
      encode(DType::kBF16, {e_count, 2}, shapes, Encoding::kNearest, pre + "weight_shape");
  return out;
}

std::unique_ptr<LinearMethod> make_pack_quantized_method(LinearShape shape, MethodConfig config) {
  return std::make_unique<PackQuantizedLinearMethod>(std::move(shape), std::move(config));
}

std::unique_ptr<LinearMethod> make_pack_quantized_method(LinearShape shape, MethodConfig config,
                                                         codec::CtPackLayout layout) {
  return std::make_unique<PackQuantizedLinearMethod>(std::move(shape), std::move(config), layout);
}

}  // namespace qparity::reference
