#include "schemes/method/unquantized.h"

#include "core/error.h"
#include "schemes/math/matmul.h"
#include "schemes/math/numeric.h"
#include "schemes/method/tensor_decode.h"

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
    std::vector<const HostTensor*> parts;
    for (int64_t p = 0; p < s.partition_count(); ++p) {
      const HostTensor& t = loaded("weight", p, e);
      // One full pass to reject NaN/Inf at load, not in the middle of a forward.
      require_finite_elements(t.dtype, t.bytes, static_cast<uint64_t>(t.numel()),
                              where("weight", p, e));
      parts.push_back(&t);
    }
    weights_.push_back(std::move(parts));
    biases_.push_back(loaded_bias(e));
  }
}

const HostTensor& UnquantizedLinearMethod::stored_weight(int64_t partition, int64_t expert) const {
  const auto& s = shape();
  if (weights_.empty()) throw Error(s.prefix, "stored_weight before process_weights_after_loading");
  if (expert < 0 || expert >= s.expert_count() || partition < 0 || partition >= s.partition_count())
    throw Error(s.prefix, "stored_weight: partition " + std::to_string(partition) + " of expert " +
                              std::to_string(expert) + " out of range");
  return *weights_[static_cast<size_t>(expert)][static_cast<size_t>(partition)];
}

Matrix UnquantizedLinearMethod::do_apply(const Matrix& x, int64_t expert) const {
  const auto& s = shape();
  const int64_t k = s.in_features;
  const auto& parts = weights_[static_cast<size_t>(expert)];
  const auto& b = biases_[static_cast<size_t>(expert)];
  Matrix y(x.rows, s.out_features());
  for (int64_t p = 0; p < s.partition_count(); ++p) {
    const HostTensor& t = *parts[static_cast<size_t>(p)];
    const int64_t off = s.partition_offset(p);
    const int64_t np = s.partitions[static_cast<size_t>(p)];
    // The rows decoded a column block at a time into matmul_nt_rows' panels (threads over rows,
    // each output one ascending-k sum), then the bias.
    const std::string where = s.prefix + ": weight row";
    const Matrix yp = matmul_nt_rows(x, np, [&](int64_t n, int64_t k0, std::span<double> row) {
      decode_to_double(t.dtype, t.bytes, static_cast<uint64_t>(n * k + k0), row, where);
      round_to_run_dtype(t.dtype, row);
    });
    for (int64_t i = 0; i < x.rows; ++i)
      for (int64_t n = 0; n < np; ++n)
        y(i, off + n) = yp(i, n) + b[static_cast<size_t>(off + n)];
  }
  return y;
}

void UnquantizedLinearMethod::round_to_run_dtype(DType stored, std::span<double> values) const {
  const auto& run = shape().run_dtype;
  if (!run || *run == stored) return;
  const Arith a = arith_of(*run, "run dtype");
  for (double& v : values)
    v = in(a, v);
}

Matrix UnquantizedLinearMethod::do_dequantized_weight(int64_t expert) const {
  const auto& s = shape();
  Matrix w(s.out_features(), s.in_features);
  for (int64_t p = 0; p < s.partition_count(); ++p) {
    const HostTensor& t = *weights_[static_cast<size_t>(expert)][static_cast<size_t>(p)];
    auto v = decode(t.view(), where("weight", p, expert));
    round_to_run_dtype(t.dtype, v);
    std::copy(v.begin(), v.end(), w.data.begin() + s.partition_offset(p) * s.in_features);
  }
  return w;
}

}  // namespace qparity::reference
