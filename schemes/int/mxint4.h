#pragma once
// Scheme `mxint4`: SGLang's CompressedTensorsMxInt4MoE (FORMATS.md §4.3, card C10): the
// compressed-tensors pack-quantized INT4 group-32 checkpoint format (pack_quantized_int.h) run as
// an [E, ...] expert stack by FlashInfer's trtllm_mxint4_block_scale_moe.
//
// Tensors per expert linear (<prefix>.<e>.{gate,up,down}_proj):
//   weight_packed I32 [N, K/8] (u = q + 8, element 8w+j in bits 4j..4j+3), weight_scale BF16
//   [N, K/32], weight_shape I64 [2] = [N, K].
// Constraints (errors name the prefix or tensor): expert stacks only (a dense linear in this
// format is w4a16-g32), weights int, num_bits 4, strategy group, group_size 32, symmetric, no
// actorder, format pack-quantized (when MethodConfig.format is given), model dtype BF16 (SGLang
// asserts params_dtype == bf16; the scale tensor must be BF16), no input_activations.
//
// Precision: dequantize (u - 8) * s exactly in fp64; apply = x @ W^T with fp64 sums (the kernel
// runs bf16 activations with fp32 accumulation - not emulated). quantize_mxint4 is
// quantize_pack_quantized with these args (compressed-tensors: s = amax/7.5 in bf16, RNE, clamp
// [-8, 7]); every dialect maps as pack_quantized_rules() says (SGLang has no producer).
// Nothing checks that the bf16 scales are powers of two (§7 item 9).
//
// runtime_tensors() (SGLang names, before FlashInfer's row permutation / block-layout shuffle,
// which are kernel tiling, not numerics, and are not modelled):
//   w13_weight_packed I32 [E, 2I, H/8] / w2_weight_packed I32 [E, H, I/8]
//   w13_weight_scale BF16 [E, 2I, H/32] / w2_weight_scale BF16 [E, H, I/32]
//   w13_weight_shape / w2_weight_shape [E, 2] (registered with torch's default dtype, the model
//     dtype bf16 during loading; the last shard loaded wins: [N_shard, K])
//   w13_weight_int4 / w2_weight_int4 U8 [E, N, K/2]: the repack the kernel takes - nibbles
//     unpacked low first, minus 8, re-packed as two's complement, element 2j in the low nibble.
#include <memory>

#include "schemes/int/pack_quantized_int.h"

namespace qparity::reference {

// Checks the MxINT4 constraints on weight args; `where` names the layer.
void check_mxint4_args(const QuantArgs& a, const std::string& where);

// SGLang's repack of one [N, K] IntWeight: two's-complement nibbles, element 2j low.
std::vector<uint8_t> mxint4_kernel_nibbles(const IntWeight& w);

TensorMap quantize_mxint4(const QuantizeRequest& request);
Matrix dequantize_mxint4(const TensorMap& tensors, const std::string& where = "weight");

class Mxint4LinearMethod final : public LinearMethod {
 public:
  Mxint4LinearMethod(LinearShape shape, MethodConfig config);
  std::vector<ParamSpec> create_weights(int64_t partition) const override;
  TensorMap runtime_tensors() const override;
  // Expert e's codes q (int4, columns in order), bf16 scales per 32 columns, no zero points: the
  // form a GPU method takes.
  std::optional<ProcessedIntWeight> processed_int_weight(int64_t expert) const override;

 protected:
  void process() override;
  Matrix do_apply(const Matrix& x, int64_t expert) const override;
  Matrix do_dequantized_weight(int64_t expert) const override;

 private:
  QuantArgs args_;
  std::vector<FusedIntWeight> fused_;  // per expert
};

std::unique_ptr<LinearMethod> make_mxint4_method(LinearShape shape, MethodConfig config);

}  // namespace qparity::reference
