#include "schemes/fp8/fp8_block.h"

#include <algorithm>

#include "core/error.h"

namespace qparity::reference {

namespace {

constexpr Fp8Act kBlockActs[] = {Fp8Act::kNone, Fp8Act::kDynamicGroup};

int64_t tiles(int64_t n) {
  return (n + kFp8BlockSize - 1) / kFp8BlockSize;
}

std::vector<DType> scale_dtypes(DType first) {
  std::vector<DType> d{first};
  for (DType t : {DType::kF32, DType::kBF16, DType::kF16})
    if (t != first) d.push_back(t);
  return d;
}

const char* scale_name_of(Fp8File f) {
  return f == Fp8File::kFp8Config ? "weight_scale_inv" : "weight_scale";
}

}  // namespace

TensorMap quantize_fp8_block(const QuantizeRequest& r, const Fp8QuantizeOptions& o) {
  const Fp8File file = o.file.value_or(default_fp8_file(r.dialect));
  if (file == Fp8File::kMsModelSlim)
    throw Error(r.where, "msModelSlim has no 128x128 block fp8 weights");
  if (r.weights) {
    check_fp8_weight_args(r.weights, QuantStrategy::kBlock, r.where);
    if (r.weights->block_structure && ((*r.weights->block_structure)[0] != kFp8BlockSize ||
                                       (*r.weights->block_structure)[1] != kFp8BlockSize))
      throw Error(r.where, "fp8-block needs block_structure [128, 128]");
  }
  const Fp8Rules rules = fp8_rules(r.dialect);
  const DType sd = fp8_scale_dtype(file, r.model_dtype);
  const Fp8ScaleRule rule = rules.weight_rule(Fp8Granularity::kBlock, sd, r.model_dtype);
  const int64_t n = r.weight.rows, k = r.weight.cols;
  if (n <= 0 || k <= 0) throw Error(r.where, "empty weight");
  const Fp8Weight q = quantize_weight_fp8(r.weight, kFp8BlockSize, kFp8BlockSize, rule, sd);
  TensorMap out;
  out["weight"] = encode(DType::kF8E4M3, {n, k}, q.values.data, Encoding::kExact, r.where);
  out[scale_name_of(file)] =
      encode(sd, {tiles(n), tiles(k)}, q.scales.data, Encoding::kExact, r.where + " scale");
  add_bias(out, r, r.model_dtype);
  return out;
}

TensorMap quantize_fp8_block(const QuantizeRequest& r) {
  return quantize_fp8_block(r, Fp8QuantizeOptions{});
}

Matrix dequantize_fp8_block(const TensorMap& t, const std::string& where) {
  const auto w = t.find("weight");
  auto s = t.find("weight_scale");
  if (s == t.end()) s = t.find("weight_scale_inv");
  if (w == t.end() || s == t.end())
    throw Error(where, "needs weight and weight_scale (or weight_scale_inv)");
  const int64_t n = w->second.shape.at(0), k = w->second.shape.at(1);
  require_shape(s->second.view(), std::vector<int64_t>{tiles(n), tiles(k)}, where + " scale");
  const auto v = load_fp8_values(w->second, where);
  const auto sc = load_fp8_scales(s->second, where + " scale");
  Matrix m(n, k);
  for (int64_t r = 0; r < n; ++r)
    for (int64_t c = 0; c < k; ++c)
      m(r, c) = v[static_cast<size_t>(r * k + c)] *
                sc[static_cast<size_t>((r / kFp8BlockSize) * tiles(k) + c / kFp8BlockSize)];
  return m;
}

Fp8BlockLinearMethod::Fp8BlockLinearMethod(LinearShape shape, MethodConfig config)
    : Fp8BlockLinearMethod(std::move(shape), config, fp8_rules(config.dialect)) {}

Fp8BlockLinearMethod::Fp8BlockLinearMethod(LinearShape shape, MethodConfig config, Fp8Rules rules)
    : Fp8LinearBase(std::move(shape), std::move(config), rules, kBlockActs) {
  // ModelOpt's FP8_PB_WO is weight-only as ModelOpt defines it (its input quantizer disabled);
  // vLLM runs it on its block-fp8 GEMM with dynamic 1x128 fp8 inputs
  // (ModelOptFp8PbWoLinearMethod: create_fp8_quant_key(static=False, GroupShape(1, 128))), so
  // under the vllm dialect the inputs are quantized as vLLM quantizes them.
  if (this->config().format == "modelopt" && act_ == Fp8Act::kNone &&
      this->config().dialect == Dialect::kVllm)
    act_ = Fp8Act::kDynamicGroup;
  if (file_ == Fp8File::kMsModelSlim)
    throw Error(this->shape().prefix, "msModelSlim has no 128x128 block fp8 weights");
  if (this->config().weights) {
    check_fp8_weight_args(this->config().weights, QuantStrategy::kBlock, this->shape().prefix);
    const auto& b = this->config().weights->block_structure;
    if (b && ((*b)[0] != kFp8BlockSize || (*b)[1] != kFp8BlockSize))
      throw Error(this->shape().prefix, "fp8-block needs block_structure [128, 128]");
  }
}

std::string Fp8BlockLinearMethod::scale_name() const {
  return scale_name_of(file_);
}

std::vector<ParamSpec> Fp8BlockLinearMethod::create_weights(int64_t partition) const {
  const auto& s = shape();
  const int64_t n = s.partitions.at(static_cast<size_t>(partition));
  ParamSpec scale{scale_name(),
                  scale_dtypes(fp8_scale_dtype(file_, s.model_dtype)),
                  {tiles(n), tiles(s.in_features)},
                  true,
                  "one scale per 128x128 tile (multiplier)"};
  // ModelOpt's FP8_PB_WO export: F32 [out_blk, 1, in_blk, 1], the same values in the same order
  // (vLLM ModelOptFp8PbWoLinearMethod squeezes dims 1 and 3).
  if (config().format == "modelopt") scale.alt_shapes = {{tiles(n), 1, tiles(s.in_features), 1}};
  return {
      {"weight", {DType::kF8E4M3}, {n, s.in_features}, true, ""}, scale, bias_spec(s, partition)};
}

namespace {

// Why a dialect refuses a ragged last activation group (Fp8Rules::group_needs_aligned_k).
std::string aligned_k_source(Dialect d) {
  switch (d) {
    case Dialect::kVllm:
      return "vLLM per_token_group_quant_fp8 asserts x.shape[-1] % group_size == 0";
    case Dialect::kSglang:
      return "SGLang per_token_group_quant_fp8 asserts x.shape[-1] % group_size == 0";
    case Dialect::kCompressedTensors:
      return "compressed-tensors compute_dynamic_scales_and_zp unflattens K into "
             "(ceil(K/128), 128)";
    case Dialect::kIdeal:
    case Dialect::kMsModelSlim:
      break;
  }
  return "its group kernel";
}

}  // namespace

void Fp8BlockLinearMethod::do_check_shape() const {
  const auto& s = shape();
  const std::string sn = scale_name();
  if (act_ == Fp8Act::kDynamicGroup && rules_.group_needs_aligned_k &&
      s.in_features % kFp8BlockSize != 0)
    throw Error(where("weight", 0, 0),
                "fp8-block under the " + std::string(to_string(rules_.dialect)) +
                    " dialect quantizes activations in 1x128 groups and needs K = " +
                    std::to_string(s.in_features) + " divisible by 128 (" +
                    aligned_k_source(rules_.dialect) +
                    "); the ideal dialect runs a ragged "
                    "last group");
  if (rules_.moe_block_needs_aligned_intermediate && s.num_experts > 0) {
    // SGLang fused MoE: the intermediate size I must be a multiple of the block (§4.1).
    if (s.partition_count() == 2) {
      for (int64_t p = 0; p < 2; ++p)
        if (s.partitions[static_cast<size_t>(p)] % kFp8BlockSize != 0)
          throw Error(where(sn, p, 0), "SGLang block-fp8 MoE needs the intermediate size (" +
                                           std::to_string(s.partitions[static_cast<size_t>(p)]) +
                                           " rows) to be a multiple of 128");
    } else if (s.in_features % kFp8BlockSize != 0) {
      throw Error(where(sn, 0, 0), "SGLang block-fp8 MoE needs the intermediate size (" +
                                       std::to_string(s.in_features) +
                                       " columns of w2) to be a multiple of 128");
    }
  }
  if (rules_.check_merged_block_n && s.partition_count() > 1)
    for (int64_t p = 0; p + 1 < s.partition_count(); ++p)
      if (s.partitions[static_cast<size_t>(p)] % kFp8BlockSize != 0)
        throw Error(where(sn, p, 0),
                    "fused block-fp8 layer: partition of " +
                        std::to_string(s.partitions[static_cast<size_t>(p)]) +
                        " rows is not a multiple of block_n 128 (only the last partition may "
                        "be ragged; " +
                        std::string(to_string(rules_.dialect)) + " validate_fp8_block_shape)");
}

void Fp8BlockLinearMethod::process() {
  const auto& s = shape();
  const int64_t kt = tiles(s.in_features);
  for (int64_t e = 0; e < s.expert_count(); ++e) {
    std::vector<int64_t> codes = load_fused_codes(e);
    Matrix rows(s.out_features(), kt);  // the tile scale of every row
    int64_t stacked = 0;
    for (int64_t p = 0; p < s.partition_count(); ++p)
      stacked += tiles(s.partitions[static_cast<size_t>(p)]);
    Matrix ck(stacked, kt);
    int64_t tile_row = 0;
    for (int64_t p = 0; p < s.partition_count(); ++p) {
      const auto v = load_fp8_scales(loaded(scale_name(), p, e), where(scale_name(), p, e));
      const int64_t np = s.partitions[static_cast<size_t>(p)];
      const int64_t off = s.partition_offset(p);
      for (int64_t l = 0; l < np; ++l)
        for (int64_t j = 0; j < kt; ++j)
          rows(off + l, j) = v[static_cast<size_t>((l / kFp8BlockSize) * kt + j)];
      std::copy(v.begin(), v.end(), ck.data.begin() + tile_row * kt);
      tile_row += tiles(np);
    }
    QuantizedMatrix q;
    q.rows = s.out_features();
    q.cols = s.in_features;
    q.codes = std::move(codes);
    q.lattice = kFp8Lattice;
    q.block_rows = 1;
    q.block_cols = kFp8BlockSize;
    q.scales = std::move(rows);
    q.compact();
    experts_.push_back(std::move(q));
    checkpoint_scales_.push_back(std::move(ck));
    biases_.push_back(loaded_bias(e));
  }
}

TensorMap Fp8BlockLinearMethod::runtime_tensors() const {
  const auto& s = shape();
  TensorMap t;
  const std::string pre = s.num_experts > 0 ? moe_name() + "_" : "";
  t[pre + "weight"] = runtime_weight();
  std::vector<double> v;
  for (const auto& m : checkpoint_scales_)
    v.insert(v.end(), m.data.begin(), m.data.end());
  std::vector<int64_t> sh{checkpoint_scales_.at(0).rows, checkpoint_scales_.at(0).cols};
  if (s.num_experts > 0) sh.insert(sh.begin(), s.num_experts);
  t[pre + scale_name()] = encode(DType::kF32, sh, v, Encoding::kExact, pre + scale_name());
  return t;
}

std::unique_ptr<LinearMethod> make_fp8_block_method(LinearShape shape, MethodConfig config) {
  return std::make_unique<Fp8BlockLinearMethod>(std::move(shape), std::move(config));
}

std::unique_ptr<LinearMethod> make_fp8_block_method(LinearShape shape, MethodConfig config,
                                                    Fp8Rules rules) {
  return std::make_unique<Fp8BlockLinearMethod>(std::move(shape), std::move(config), rules);
}

}  // namespace qparity::reference
