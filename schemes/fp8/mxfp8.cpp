#include "schemes/fp8/mxfp8.h"

#include <cmath>

#include "core/error.h"

namespace qparity::reference {

namespace {

std::vector<double> decode_e4m3_checked(const HostTensor& t, const std::string& where) {
  for (size_t i = 0; i < t.bytes.size(); ++i)
    if ((t.bytes[i] & 0x7Fu) == 0x7Fu)
      throw Error(where, "element " + std::to_string(i) + " is an e4m3fn NaN byte");
  return decode(t.view(), where);
}

}  // namespace

MxScaleRules mxfp8_rules(Dialect d, DType model_dtype) {
  return mx_scale_rules(d, MxElem::kE4M3, model_dtype);
}

TensorMap quantize_mxfp8(const QuantizeRequest& req) {
  const Matrix& w = req.weight;
  check_mx_args(req.weights, 8, req.group_size, req.where + ".weight_scale");
  if (w.cols % kMxBlock != 0)
    throw Error(req.where + ".weight",
                "in_features " + std::to_string(w.cols) + " is not a multiple of 32 (MXFP8)");
  require_finite(w.data, req.where);
  const MxBlocks b =
      mx_quantize_blocks(w, mxfp8_rules(req.dialect, req.model_dtype), req.where + ".weight_scale");
  TensorMap out;
  out["weight"] =
      encode(DType::kF8E4M3, {w.rows, w.cols}, b.values, Encoding::kExact, req.where + ".weight");
  const std::vector<int64_t> bytes(b.bytes.begin(), b.bytes.end());
  out["weight_scale"] =
      encode_ints(DType::kU8, {w.rows, w.cols / kMxBlock}, bytes, req.where + ".weight_scale");
  add_bias(out, req, req.model_dtype);
  return out;
}

Matrix dequantize_mxfp8(const TensorMap& tensors, const std::string& where) {
  const auto get = [&](const std::string& name) -> const HostTensor& {
    return tensor_in(tensors, name, where);
  };
  const HostTensor& wt = get("weight");
  const HostTensor& scale = get("weight_scale");
  if (wt.shape.size() != 2) throw Error(where + ".weight", "MXFP8 weights are 2-D");
  const int64_t n = wt.shape[0], k = wt.shape[1];
  if (k % kMxBlock != 0)
    throw Error(where + ".weight", std::to_string(k) + " columns: not a multiple of 32");
  const std::vector<int64_t> scale_shape{n, k / kMxBlock};
  require_shape(scale.view(), scale_shape, where + ".weight_scale");
  return dequantize(mx_quantized_matrix(n, k, MxElem::kE4M3,
                                        decode_e4m3_checked(wt, where + ".weight"),
                                        decode_e8m0_bytes(scale, where + ".weight_scale")));
}

Mxfp8LinearMethod::Mxfp8LinearMethod(LinearShape shape, MethodConfig config)
    : MxLinearMethodBase(std::move(shape), std::move(config), MxElem::kE4M3) {}

std::vector<ParamSpec> Mxfp8LinearMethod::create_weights(int64_t partition) const {
  const auto& s = shape();
  const int64_t n = s.partitions.at(static_cast<size_t>(partition));
  return {{"weight", {DType::kF8E4M3}, {n, s.in_features}, true, "e4m3fn elements"},
          {"weight_scale", {DType::kU8}, {n, s.in_features / kMxBlock}, true, "E8M0 bytes"},
          bias_spec(s, partition)};
}

std::vector<double> Mxfp8LinearMethod::weight_values(int64_t partition, int64_t expert) const {
  return decode_e4m3_checked(loaded("weight", partition, expert),
                             where("weight", partition, expert));
}

std::unique_ptr<LinearMethod> make_mxfp8_method(LinearShape shape, MethodConfig config) {
  return std::make_unique<Mxfp8LinearMethod>(std::move(shape), std::move(config));
}

}  // namespace qparity::reference
