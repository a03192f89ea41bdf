#include "schemes/int/mxint4.h"

#include "core/error.h"
#include "schemes/description/quant_plan.h"

namespace qparity::reference {

namespace {

size_t sz(int64_t v) {
  return static_cast<size_t>(v);
}

QuantArgs preset() {
  return *implied_args(SchemeId{SchemeKind::kMxint4, 0}).weights;
}

}  // namespace

void check_mxint4_args(const QuantArgs& a, const std::string& where) {
  if (a.type != QuantType::kInt || a.num_bits != 4)
    throw Error(where, "mxint4 needs int 4-bit weights, got " + describe(a));
  if (a.strategy != QuantStrategy::kGroup || a.effective_group_size() != 32)
    throw Error(where, "mxint4 needs strategy group with group_size 32, got " + describe(a));
  if (!a.symmetric) throw Error(where, "mxint4 needs symmetric weights (SGLang MoE)");
  if (a.actorder != ActOrder::kNone)
    throw Error(where, "mxint4 does not support actorder (flashinfer_trtllm backend)");
  if (a.is_dynamic()) throw Error(where, "mxint4 weights must be static");
}

std::vector<uint8_t> mxint4_kernel_nibbles(const IntWeight& w) {
  std::vector<uint8_t> nib(w.q.size());
  for (size_t i = 0; i < w.q.size(); ++i)
    nib[i] = codec::int4_to_nibble(static_cast<int>(w.q[i]));
  return codec::pack_nibbles(nib, "mxint4 repack");
}

TensorMap quantize_mxint4(const QuantizeRequest& request) {
  QuantizeRequest r = request;
  if (!r.weights) r.weights = preset();
  check_mxint4_args(*r.weights, r.where);
  if (r.model_dtype != DType::kBF16)
    throw Error(r.where, "mxint4 needs a bf16 model (SGLang asserts params_dtype == bf16), got " +
                             std::string(dtype_name(r.model_dtype)));
  return quantize_pack_quantized(r, codec::CtPackLayout::kDenseStream);
}

Matrix dequantize_mxint4(const TensorMap& tensors, const std::string& where) {
  const auto it = tensors.find("weight_scale");
  if (it != tensors.end() && it->second.dtype != DType::kBF16)
    throw Error(where + ".weight_scale",
                "mxint4 scales must be BF16, got " + std::string(dtype_name(it->second.dtype)));
  return dequantize_pack_quantized(tensors, preset(), codec::CtPackLayout::kDenseStream, where);
}

Mxint4LinearMethod::Mxint4LinearMethod(LinearShape shape, MethodConfig config)
    : LinearMethod(std::move(shape), std::move(config)) {
  const std::string& p = this->shape().prefix;
  if (this->shape().num_experts <= 0)
    throw Error(p,
                "mxint4 applies to MoE expert stacks only (a dense linear in this format is "
                "w4a16-g32)");
  if (this->shape().partition_count() > 2)
    throw Error(p, "an expert stack has one (down) or two (gate/up) partitions");
  args_ = this->config().weights ? *this->config().weights : preset();
  check_mxint4_args(args_, p);
  if (!this->config().format.empty() && this->config().format != "pack-quantized")
    throw Error(p, "mxint4 needs checkpoint format pack-quantized, got " + this->config().format);
  if (this->shape().model_dtype != DType::kBF16)
    throw Error(p, "mxint4 needs a bf16 model (SGLang asserts params_dtype == bf16), got " +
                       std::string(dtype_name(this->shape().model_dtype)));
  if (this->config().input_activations)
    throw Error(p, "mxint4 is weight-only here; input_activations must be absent");
  pack_quantized_group(args_, this->shape().in_features, p);
}

std::vector<ParamSpec> Mxint4LinearMethod::create_weights(int64_t partition) const {
  return pack_quantized_specs(args_, codec::CtPackLayout::kDenseStream,
                              shape().partitions.at(sz(partition)), shape().in_features,
                              {DType::kBF16});
}

void Mxint4LinearMethod::process() {
  const auto& s = shape();
  for (int64_t e = 0; e < s.expert_count(); ++e) {
    std::vector<IntWeight> parts;
    for (int64_t p = 0; p < s.partition_count(); ++p)
      parts.push_back(decode_pack_quantized(
          [&](const std::string& n) { return find_loaded(n, p, e); },
          [&](const std::string& n) { return where(n, p, e); }, args_,
          codec::CtPackLayout::kDenseStream, s.partitions[sz(p)], s.in_features));
    fused_.push_back(fuse_int_weights(parts, 32, where("weight_packed", 0, e)));
  }
}

std::optional<ProcessedIntWeight> Mxint4LinearMethod::processed_int_weight(int64_t expert) const {
  const FusedIntWeight& f = fused_.at(sz(expert));
  // check_mxint4_args: group 32, symmetric, no actorder; the fused blocks say the same.
  if (!f.identity || f.w.block_cols != 32 || f.w.block_rows != 1 || !f.w.zero_points.empty())
    throw Error(shape().prefix, "fused mxint4 weight is not [1, 32]-blocked, symmetric, in order");
  ProcessedIntWeight w = int_weight_of(f.w, 32, 4, IntCodes::kStored);
  w.scale = f.w.scales.data;
  w.zero.assign(w.scale.size(), 0.0);
  return w;
}

Matrix Mxint4LinearMethod::do_apply(const Matrix& x, int64_t expert) const {
  return apply_fused(fused_[sz(expert)], x);
}

Matrix Mxint4LinearMethod::do_dequantized_weight(int64_t expert) const {
  Matrix w(shape().out_features(), shape().in_features);
  int64_t off = 0;
  for (const auto& p : unfuse_int_weights(fused_[sz(expert)], shape().partitions)) {
    const Matrix d = dequantize(p);
    std::copy(d.data.begin(), d.data.end(), w.data.begin() + off * w.cols);
    off += p.rows;
  }
  return w;
}

TensorMap Mxint4LinearMethod::runtime_tensors() const {
  const auto& s = shape();
  std::vector<std::vector<IntWeight>> shards;
  for (const auto& f : fused_)
    shards.push_back(unfuse_int_weights(f, s.partitions));
  TensorMap out =
      stacked_runtime_tensors(shards, s, 4, codec::CtPackLayout::kDenseStream, DType::kBF16);
  const std::string pre = s.partition_count() == 2 ? "w13_" : "w2_";
  std::vector<int64_t> bytes;
  for (const auto& parts : shards)
    for (const auto& p : parts)
      for (uint8_t b : mxint4_kernel_nibbles(p))
        bytes.push_back(b);
  out[pre + "weight_int4"] =
      encode_ints(DType::kU8, {s.expert_count(), s.out_features(), s.in_features / 2}, bytes,
                  pre + "weight_int4");
  return out;
}

std::unique_ptr<LinearMethod> make_mxint4_method(LinearShape shape, MethodConfig config) {
  return std::make_unique<Mxint4LinearMethod>(std::move(shape), std::move(config));
}

}  // namespace qparity::reference
