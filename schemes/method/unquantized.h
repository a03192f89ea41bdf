#pragma once
// Scheme `bf16`: an unquantized linear in the checkpoint's float dtype (BF16, F16 or F32).
// Precision: the stored weight is decoded exactly; apply is x @ W^T + b in fp64 (k ascending).
// Memory: the weight stays in its checkpoint dtype; apply decodes one output row at a time, so a
// bf16 layer costs its checkpoint bytes plus one fp64 row, not an fp64 copy (4x).
// quantize() is the cast to the model dtype (RNE, once from fp64), so "bf16" in a comparison
// means exactly the information a bf16 checkpoint holds.
#include <span>

#include "schemes/method/linear_method.h"

namespace qparity::reference {

TensorMap quantize_unquantized(const Matrix& weight, DType model_dtype,
                               const std::vector<double>* bias = nullptr);

class UnquantizedLinearMethod final : public LinearMethod {
 public:
  UnquantizedLinearMethod(LinearShape shape, MethodConfig config);
  std::vector<ParamSpec> create_weights(int64_t partition) const override;
  // After processing: partition p of expert e as the checkpoint stored it (its own float dtype,
  // [rows, in_features]), for an engine that uploads it as is. Throws before processing.
  const HostTensor& stored_weight(int64_t partition, int64_t expert) const;

 protected:
  void process() override;
  std::vector<std::string> retained_after_processing() const override { return {"weight"}; }
  Matrix do_apply(const Matrix& x, int64_t expert) const override;
  Matrix do_dequantized_weight(int64_t expert) const override;

 private:
  // Per expert, per partition: the checkpoint tensor (owned by the base class), decoded per row.
  std::vector<std::vector<const HostTensor*>> weights_;
  std::vector<std::vector<double>> biases_;
  // Values decoded from a tensor stored in `stored`, rounded in place to the shape's run dtype
  // when it differs (an fp32 checkpoint on a bf16 engine); else untouched.
  void round_to_run_dtype(DType stored, std::span<double> values) const;
};

}  // namespace qparity::reference
