#include "schemes/fp4/mxfp4.h"

#include <cmath>

#include "core/codecs/float_format.h"
#include "core/codecs/int_packing.h"
#include "core/error.h"

namespace qparity::reference {

MxScaleRules mxfp4_rules(Dialect d, DType model_dtype) {
  return mx_scale_rules(d, MxElem::kE2M1, model_dtype);
}

TensorMap quantize_mxfp4(const QuantizeRequest& req) {
  const Matrix& w = req.weight;
  check_mx_args(req.weights, 4, req.group_size, req.where + ".weight_scale");
  if (w.cols % kMxBlock != 0)
    throw Error(req.where + ".weight_packed",
                "in_features " + std::to_string(w.cols) + " is not a multiple of 32 (MXFP4)");
  require_finite(w.data, req.where);
  const MxBlocks b =
      mx_quantize_blocks(w, mxfp4_rules(req.dialect, req.model_dtype), req.where + ".weight_scale");
  std::vector<uint8_t> nibbles(b.values.size());
  for (size_t i = 0; i < nibbles.size(); ++i)
    nibbles[i] = codec::double_to_e2m1(b.values[i]);
  TensorMap out;
  HostTensor packed;
  packed.dtype = DType::kU8;
  packed.shape = {w.rows, w.cols / 2};
  packed.bytes = codec::pack_nibbles(nibbles, req.where + ".weight_packed");
  out["weight_packed"] = std::move(packed);
  const std::vector<int64_t> bytes(b.bytes.begin(), b.bytes.end());
  out["weight_scale"] =
      encode_ints(DType::kU8, {w.rows, w.cols / kMxBlock}, bytes, req.where + ".weight_scale");
  add_bias(out, req, req.model_dtype);
  return out;
}

Matrix dequantize_mxfp4(const TensorMap& tensors, const std::string& where) {
  const auto get = [&](const std::string& name) -> const HostTensor& {
    return tensor_in(tensors, name, where);
  };
  const HostTensor& packed = get("weight_packed");
  const HostTensor& scale = get("weight_scale");
  if (packed.shape.size() != 2) throw Error(where + ".weight_packed", "MXFP4 weights are 2-D");
  const int64_t n = packed.shape[0], k = packed.shape[1] * 2;
  if (k % kMxBlock != 0)
    throw Error(where + ".weight_packed", std::to_string(k) + " columns: not a multiple of 32");
  const std::vector<int64_t> scale_shape{n, k / kMxBlock};
  require_shape(scale.view(), scale_shape, where + ".weight_scale");
  const auto nib =
      codec::unpack_nibbles(packed.bytes, static_cast<size_t>(n * k), where + ".weight_packed");
  std::vector<double> values(nib.size());
  for (size_t i = 0; i < nib.size(); ++i)
    values[i] = codec::e2m1_to_double(nib[i]);
  return dequantize(mx_quantized_matrix(n, k, MxElem::kE2M1, values,
                                        decode_e8m0_bytes(scale, where + ".weight_scale")));
}

Mxfp4LinearMethod::Mxfp4LinearMethod(LinearShape shape, MethodConfig config)
    : MxLinearMethodBase(std::move(shape), std::move(config), MxElem::kE2M1) {}

std::vector<ParamSpec> Mxfp4LinearMethod::create_weights(int64_t partition) const {
  const auto& s = shape();
  const int64_t n = s.partitions.at(static_cast<size_t>(partition));
  return {{"weight_packed", {DType::kU8}, {n, s.in_features / 2}, true, "e2m1 pairs, low = even"},
          {"weight_scale", {DType::kU8}, {n, s.in_features / kMxBlock}, true, "E8M0 bytes"},
          bias_spec(s, partition)};
}

std::vector<double> Mxfp4LinearMethod::weight_values(int64_t partition, int64_t expert) const {
  const auto& s = shape();
  const int64_t n = s.partitions[static_cast<size_t>(partition)];
  const auto nib = codec::unpack_nibbles(loaded("weight_packed", partition, expert).bytes,
                                         static_cast<size_t>(n * s.in_features),
                                         where("weight_packed", partition, expert));
  std::vector<double> v(nib.size());
  for (size_t i = 0; i < nib.size(); ++i)
    v[i] = codec::e2m1_to_double(nib[i]);
  return v;
}

std::unique_ptr<LinearMethod> make_mxfp4_method(LinearShape shape, MethodConfig config) {
  return std::make_unique<Mxfp4LinearMethod>(std::move(shape), std::move(config));
}

}  // namespace qparity::reference
