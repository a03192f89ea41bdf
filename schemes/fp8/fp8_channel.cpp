#include "schemes/fp8/fp8_channel.h"

#include <algorithm>

#include "core/error.h"

namespace qparity::reference {

namespace {

constexpr Fp8Act kChannelActs[] = {Fp8Act::kNone, Fp8Act::kDynamicToken};

std::vector<DType> scale_dtypes(DType first) {
  std::vector<DType> d{first};
  for (DType t : {DType::kF32, DType::kBF16, DType::kF16})
    if (t != first) d.push_back(t);
  return d;
}

}  // namespace

TensorMap quantize_fp8_channel(const QuantizeRequest& r, const Fp8QuantizeOptions& o) {
  const Fp8File file = o.file.value_or(default_fp8_file(r.dialect));
  if (file == Fp8File::kFp8Config)
    throw Error(r.where, "quant_method 'fp8' files have per-tensor or block scales, not channel");
  check_fp8_weight_args(r.weights, QuantStrategy::kChannel, r.where);
  const Fp8Rules rules = fp8_rules(r.dialect);
  const DType sd = fp8_scale_dtype(file, r.model_dtype);
  const Fp8ScaleRule rule = rules.weight_rule(Fp8Granularity::kChannel, sd, r.model_dtype);
  const int64_t n = r.weight.rows, k = r.weight.cols;
  if (n <= 0 || k <= 0) throw Error(r.where, "empty weight");
  const Fp8Weight q = quantize_weight_fp8(r.weight, 1, k, rule, sd);
  TensorMap out;
  out["weight"] = encode(DType::kF8E4M3, {n, k}, q.values.data, Encoding::kExact, r.where);
  out["weight_scale"] = encode(sd, {n, 1}, q.scales.data, Encoding::kExact, r.where + "_scale");
  if (file == Fp8File::kMsModelSlim) {
    out["weight_offset"] = encode(DType::kF32, {n, 1}, std::vector<double>(static_cast<size_t>(n)),
                                  Encoding::kExact, r.where + "_offset");
    add_bias(out, r, DType::kF32);
  } else {
    add_bias(out, r, r.model_dtype);
  }
  return out;
}

TensorMap quantize_fp8_channel(const QuantizeRequest& r) {
  return quantize_fp8_channel(r, Fp8QuantizeOptions{});
}

Matrix dequantize_fp8_channel(const TensorMap& t, const std::string& where) {
  const auto w = t.find("weight");
  const auto s = t.find("weight_scale");
  if (w == t.end() || s == t.end()) throw Error(where, "needs weight and weight_scale");
  const int64_t n = w->second.shape.at(0), k = w->second.shape.at(1);
  require_shape(s->second.view(), std::vector<int64_t>{n, 1}, where + "_scale");
  const auto v = load_fp8_values(w->second, where);
  const auto sc = load_fp8_scales(s->second, where + "_scale");
  Matrix m(n, k);
  for (int64_t r = 0; r < n; ++r)
    for (int64_t c = 0; c < k; ++c)
      m(r, c) = v[static_cast<size_t>(r * k + c)] * sc[static_cast<size_t>(r)];
  return m;
}

Fp8ChannelLinearMethod::Fp8ChannelLinearMethod(LinearShape shape, MethodConfig config)
    : Fp8LinearBase(std::move(shape), config, fp8_rules(config.dialect), kChannelActs) {
  if (file_ == Fp8File::kFp8Config)
    throw Error(this->shape().prefix, "quant_method 'fp8' has no per-channel weight scales");
  check_fp8_weight_args(this->config().weights, QuantStrategy::kChannel, this->shape().prefix);
}

std::vector<ParamSpec> Fp8ChannelLinearMethod::create_weights(int64_t partition) const {
  const auto& s = shape();
  const int64_t n = s.partitions.at(static_cast<size_t>(partition));
  const DType sd = fp8_scale_dtype(file_, s.model_dtype);
  std::vector<ParamSpec> p{{"weight", {DType::kF8E4M3}, {n, s.in_features}, true, ""},
                           {"weight_scale",
                            scale_dtypes(sd),
                            {n, 1},
                            true,
                            "w = q * s[n]",
                            {{n}}}};  // ModelOpt FP8_PER_CHANNEL_PER_TOKEN writes [N]
  if (file_ == Fp8File::kMsModelSlim)
    p.push_back({"weight_offset", scale_dtypes(DType::kF32), {n, 1}, true, "zeros (symmetric)"});
  p.push_back(bias_spec(s, partition));
  return p;
}

void Fp8ChannelLinearMethod::process() {
  const auto& s = shape();
  for (int64_t e = 0; e < s.expert_count(); ++e) {
    std::vector<int64_t> codes = load_fused_codes(e);
    Matrix sc(s.out_features(), 1);
    for (int64_t p = 0; p < s.partition_count(); ++p) {
      const auto v = load_fp8_scales(loaded("weight_scale", p, e), where("weight_scale", p, e));
      std::copy(v.begin(), v.end(), sc.data.begin() + s.partition_offset(p));
      if (file_ == Fp8File::kMsModelSlim) {
        const std::string wo = where("weight_offset", p, e);
        const auto off = decode(loaded("weight_offset", p, e).view(), wo);
        for (size_t i = 0; i < off.size(); ++i)
          if (off[i] != 0)
            throw Error(wo, "WFP8AFP8_DYNAMIC is symmetric: offset " + std::to_string(off[i]) +
                                " at row " + std::to_string(i) + " (must be 0)");
      }
    }
    QuantizedMatrix q;
    q.rows = s.out_features();
    q.cols = s.in_features;
    q.codes = std::move(codes);
    q.lattice = kFp8Lattice;
    q.block_rows = 1;
    q.block_cols = s.in_features;
    q.scales = std::move(sc);
    q.compact();
    experts_.push_back(std::move(q));
    biases_.push_back(loaded_bias(e));
  }
}

TensorMap Fp8ChannelLinearMethod::runtime_tensors() const {
  const auto& s = shape();
  TensorMap t;
  const std::string pre = s.num_experts > 0 ? moe_name() + "_" : "";
  t[pre + "weight"] = runtime_weight();
  std::vector<double> v;
  for (const auto& q : experts_)
    v.insert(v.end(), q.scales.data.begin(), q.scales.data.end());
  std::vector<int64_t> sh{s.out_features(), 1};
  if (s.num_experts > 0) sh.insert(sh.begin(), s.num_experts);
  t[pre + "weight_scale"] = encode(DType::kF32, sh, v, Encoding::kExact, pre + "weight_scale");
  return t;
}

std::unique_ptr<LinearMethod> make_fp8_channel_method(LinearShape shape, MethodConfig config) {
  return std::make_unique<Fp8ChannelLinearMethod>(std::move(shape), std::move(config));
}

}  // namespace qparity::reference
