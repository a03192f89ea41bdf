#pragma once
// The E8M0 shared exponent of an MX block (32 elements along K) and the element rounding that
// goes with it, per dialect (spec/FORMATS.md §1.4, §2.8, §3.5, §5.9, §6, §7 item 10).
//
// An MX block stores codes q_i and one byte b: value_i = elem(q_i) * 2^(b - 127). The shared
// exponent E = b - 127 is derived from the block amax; the element code of x is the element
// format's rounding of x / 2^E, clamped to its max normal (6 for e2m1, 448 for e4m3fn).
//
// Precision contract. floor(log2 a) and "mantissa >= 1.75" are read exactly from the bits of a
// double (std::frexp), never from a float log2 that can round across a power of two. Where a
// producer holds the amax in a narrower type (the bf16 / fp32 bit trick of compressed-tensors
// and vLLM, msModelSlim's fp32 tensors) the amax is first rounded to that type (RNE), which is
// what the producer's bits are; the exponent is then read exactly.
//
// Exponent rules (E = unbiased exponent; emax_elem = 2 for e2m1, 8 for e4m3):
//   kOcp        E = floor(log2 amax) - emax_elem; amax 0 reads as 2^-126 (microxcaling's
//               FP32_MIN_NORMAL); E > 127 -> NaN (byte 255: not storable, quantize rejects it);
//               E < -127 -> -127. microxcaling mx/mx_ops.py 3b429a84 (§7 item 10); msModelSlim
//               calculate_mx_qparam (MXFP8, §5.9).
//   kBump       E = floor(log2 amax) + [mantissa(amax) >= 1.75] - emax_elem: compressed-tensors
//               round_to_power_2 (add 1 << (mant_bits - 2) to the bits, mask the mantissa;
//               quantization/utils/mxfp_utils.py) and vLLM tests/quantization/reference_mxfp4.py
//               (§2.8, §3.5). The bumped power of two overflowing the amax's type (amax >=
//               1.75 * 2^127 in bf16/fp32) is inf -> the byte clamps to its maximum; amax 0 ->
//               log2(0) = -inf -> byte minimum. Byte clamp: compressed-tensors [0, 255] (255 is
//               written by the library but is NaN in E8M0; quantize here rejects it), vLLM ref
//               [0, 254].
//   kMsModelSlimFp4  E = floor(log2(fl32(fl32(amax / 0.875) + 9.6e-7))) - 2 (the division by
//               1 - 0.5^3 = 7/8 bumps at mantissa >= 1.75 like kBump; the 9.6e-7 only matters for
//               tiny amax: it floors E at floor(log2 9.6e-7) - 2 = -22, so an all-zero block
//               gets 2^-22 and zero elements), clipped to [-129, 125]; E < -127 zeroes the block
//               (unreachable behind the 9.6e-7 floor, kept as the source writes it)
//               (mx_quantization.py calculate_mxfp4_qparam / mxfp4_quantize, msmodelslim
//               1f2a4b03). The saver's byte for a zeroed block is not read here: byte 0 is written.
//
// Element rounding:
//   kHalfEven   RNE on the element grid (compressed-tensors cast_to_fp4 / .to(float8_e4m3fn)
//               after the clamp, vLLM reference, OCP "roundTiesToEven"), x / 2^E computed in
//               `element_arith` (compressed-tensors divides in the model dtype; exact for powers
//               of two unless the quotient is subnormal in that dtype).
//   kHalfAway   floor(|a| / step + 0.5) * step with the step from a private exponent
//               floor(log2 |a|) clipped at the element format's min normal exponent, computed in
//               fp32 (msModelSlim _quant / mxfp4_quantize, microxcaling "nearest"); the + 0.5
//               (and MXFP4's + 9.6e-7 in the private exponent) are fp32 additions as written.
//
// Dialect table (mx_scale_rules):
//   dialect             exponent         byte range  elements   amax / element arithmetic
//   ideal               kOcp             [0, 254]    half-even  fp64 (exact)
//   compressed-tensors  kBump            [0, 255]    half-even  model dtype (bf16 bits / fp32)
//   vllm                kBump            [0, 254]    half-even  model dtype (the ref's half dtype)
//   sglang              kBump            [0, 254]    half-even  model dtype; SGLang has no MX
//                                                               rule of its own read here: vLLM's
//   msmodelslim  MXFP4  kMsModelSlimFp4  [0, 254]    half-away  fp32
//                MXFP8  kOcp             [0, 254]    half-away  fp32
// "ideal" follows the OCP MX rule with RNE elements (the spec's roundTiesToEven); microxcaling's
// default half-away rounding is what the msmodelslim dialect reproduces.
#include <cstdint>
#include <functional>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "core/dtype.h"
#include "schemes/description/dialect.h"
#include "schemes/math/numeric.h"
#include "schemes/method/host_tensor.h"
#include "schemes/method/linear_method.h"

namespace qparity::reference {

inline constexpr int64_t kMxBlock = 32;  // elements per shared exponent, along K

enum class MxElem : uint8_t { kE2M1, kE4M3 };
enum class MxExponentRule : uint8_t { kOcp, kBump, kMsModelSlimFp4 };

// floor(log2(max normal)) of the element format: 2 (e2m1, max 6), 8 (e4m3fn, max 448).
int mx_emax_elem(MxElem e);
// Max normal of the element format: 6 or 448.
double mx_elem_max(MxElem e);
// The lattice every element value sits on (e2m1: 0.5, e4m3fn: 2^-9), for scaled_gemm.
double mx_elem_lattice(MxElem e);

struct MxScaleRules {
  MxElem elem = MxElem::kE2M1;
  MxExponentRule exponent = MxExponentRule::kOcp;
  Arith amax_arith = Arith::kFp64;  // type the amax is held in before its exponent is read
  int byte_min = 0;
  int byte_max = 254;
  IntRound element_round = IntRound::kHalfEven;  // kHalfEven or kHalfAway
  Arith element_arith = Arith::kFp64;            // precision of x / 2^E and the rounding steps
};

MxScaleRules mx_scale_rules(Dialect d, MxElem elem, DType model_dtype);

// floor(log2 a) for finite a > 0, exact (from the double's exponent, subnormals included).
int floor_log2_exact(double a);
// The normalized mantissa of a finite a > 0 (a = m * 2^floor(log2 a), m in [1, 2)), exact.
double mantissa_exact(double a);

struct MxExponent {
  int exponent = -127;      // unbiased E (meaningful when !nan)
  int byte = 0;             // E + 127 after the dialect's clamp; 255 when nan
  bool nan = false;         // kOcp: E > 127
  bool zero_block = false;  // kMsModelSlimFp4: E < -127, the block's elements are zeroed
};

// The shared exponent of a block with the given amax (finite, >= 0).
MxExponent mx_shared_exponent(double amax, const MxScaleRules& r);

// The element value (on the element grid, within +-max) of x scaled by 2^-exponent.
double mx_quantize_element(double x, int exponent, const MxScaleRules& r);

}  // namespace qparity::reference

// ---------------------------------------------------------------------------------------------
// Shared by the FP4 / MX schemes (nvfp4, mxfp4, mxfp8).
namespace qparity::reference {

// Stacks one checkpoint tensor over an expert stack into SGLang's run-time layout: shard (e, p)
// tensors [n_p, ...] -> [E, sum n_p, ...] (partitions concatenated along rows, gate then up);
// per-shard [1] tensors (global scales) -> [E, P] when P > 1, else [E]. All shards must share
// one dtype.
HostTensor stack_expert_shards(const LinearShape& s,
                               const std::function<const HostTensor&(int64_t e, int64_t p)>& get);

// Rows [row0, row0 + n) of a run-time element matrix (codes on the e2m1 or e4m3 lattice) back in
// checkpoint form: e2m1 nibble pairs as U8 [n, K/2] (low nibble = even element) or F8_E4M3
// [n, K]. Run-time tensors are rebuilt this way, so the checkpoint bytes need not be kept.
HostTensor encode_element_rows(const QuantizedMatrix& q, int64_t row0, int64_t n, MxElem elem,
                               const std::string& where);

// The fused [N, K] QuantizedMatrix of an MX layer from element values [N*K] and E8M0 bytes
// [N, K/32] (none 255).
QuantizedMatrix mx_quantized_matrix(int64_t rows, int64_t cols, MxElem elem,
                                    std::span<const double> values, std::span<const int> bytes);

// Block-quantizes m [R, C] (C % 32 == 0) with the rules: element values [R*C] and bytes
// [R, C/32]. A NaN exponent (kOcp, E > 127) is an Error naming `where`.
struct MxBlocks {
  std::vector<double> values;
  std::vector<int> bytes;
};
MxBlocks mx_quantize_blocks(const Matrix& m, const MxScaleRules& r, const std::string& where);

// The common MX linear (mxfp4 / mxfp8 derive from it): weight element values and E8M0 bytes
// [n_p, K/32] per shard, activations (when the config has input_activations) quantized per
// 32-group dynamically with the same dialect rules, integer-exact scaled_gemm. Constraints:
// K % 32 == 0, group 32 in the args, byte 255 (NaN) rejected naming the weight_scale tensor.
class MxLinearMethodBase : public LinearMethod {
 public:
  const MxScaleRules& rules() const { return rules_; }
  bool quantizes_activations() const { return act_; }
  MxElem element() const { return elem_; }
  // Expert e's fused [N, K] weight after processing (element codes, E8M0 block scales as powers of
  // two, blocks [1, 32]) and its bias (zeros when none): the form a GPU method takes.
  const QuantizedMatrix& processed_weight(int64_t expert) const {
    return weights_.at(static_cast<size_t>(expert));
  }
  const std::vector<double>& processed_bias(int64_t expert) const {
    return biases_.at(static_cast<size_t>(expert));
  }
  TensorMap runtime_tensors() const override;

 protected:
  MxLinearMethodBase(LinearShape shape, MethodConfig config, MxElem elem);
  // The name of the element tensor ("weight_packed" / "weight") and its values for one shard.
  virtual std::string weight_name() const = 0;
  virtual std::vector<double> weight_values(int64_t partition, int64_t expert) const = 0;
  std::vector<std::string> retained_after_processing() const override { return {"weight_scale"}; }

  void process() override;
  Matrix do_apply(const Matrix& x, int64_t expert) const override;
  Matrix do_dequantized_weight(int64_t expert) const override;
  std::optional<QuantizedMatrix> do_quantize_input(const Matrix& x, int64_t expert) const override;

 private:
  MxElem elem_;
  MxScaleRules rules_;
  bool act_ = false;
  std::vector<QuantizedMatrix> weights_;  // per expert, fused [N, K]
  std::vector<std::vector<double>> biases_;
};

// Checks MX args (float, num_bits, group 32) naming `where`.
void check_mx_args(const std::optional<QuantArgs>& a, int num_bits, int64_t group_size,
                   const std::string& where);
// Validates and decodes an E8M0 weight_scale tensor (U8): byte 255 is an Error naming `where`.
std::vector<int> decode_e8m0_bytes(const HostTensor& t, const std::string& where);

}  // namespace qparity::reference
