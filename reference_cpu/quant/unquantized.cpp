#include "reference_cpu/quant/unquantized.h"

#include "core/error.h"
#include "reference_cpu/quant/numeric.h"

namespace qparity::reference {

TensorMap quantize_unquantized(const Matrix& weight, DType model_dtype,
                               const std::vector<double>* bias) {
  arith_of(model_dtype, "quantize bf16");
  require_finite(weight.data, "weight");
  TensorMap out;
  out["weight"] =
      encode(model_dtype, {weight.rows, weight.cols}, weight.data, Encoding::kNearest, "weight");
  if (bias) {
    require_finite(*bias, "bias");
    out["bias"] = encode(model_dtype, {static_cast<int64_t>(bias->size())}, *bias,
                         Encoding::kNearest, "bias");
  }
  return out;
}

UnquantizedLinearMethod::UnquantizedLinearMethod(LinearShape shape, MethodConfig config)
    : LinearMethod(std::move(shape), std::move(config)) {}

std::vector<ParamSpec> UnquantizedLinearMethod::create_weights(int64_t partition) const {
  const auto& s = shape();
  return {{"weight",
           {s.model_dtype, DType::kBF16, DType::kF16, DType::kF32},
           {s.partitions.at(static_cast<size_t>(partition)), s.in_features},
           true,
           ""},
          bias_spec(s, partition)};
}

void UnquantizedLinearMethod::process() {
  const auto& s = shape();
  for (int64_t e = 0; e < s.expert_count(); ++e) {
    Matrix w(s.out_features(), s.in_features);
    for (int64_t p = 0; p < s.partition_count(); ++p) {
      const auto v = decode(loaded("weight", p, e).view(), where("weight", p, e));
      require_finite(v, where("weight", p, e));
      std::copy(v.begin(), v.end(), w.data.begin() + s.partition_offset(p) * s.in_features);
    }
    weights_.push_back(std::move(w));
    biases_.push_back(loaded_bias(e));
  }
}

Matrix UnquantizedLinearMethod::do_apply(const Matrix& x, int64_t expert) const {
  Matrix y = matmul_nt(x, weights_[static_cast<size_t>(expert)]);
  const auto& b = biases_[static_cast<size_t>(expert)];
  for (int64_t t = 0; t < y.rows; ++t)
    for (int64_t n = 0; n < y.cols; ++n)
      y(t, n) += b[static_cast<size_t>(n)];
  return y;
}

Matrix UnquantizedLinearMethod::do_dequantized_weight(int64_t expert) const {
  return weights_[static_cast<size_t>(expert)];
}

}  // namespace qparity::reference
