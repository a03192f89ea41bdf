#pragma once
// FP8 E4M3 (e4m3fn) quantization shared by fp8-tensor, fp8-channel, fp8-block and kv-fp8:
// how one reduction set (a tensor, an output channel, a 128x128 tile, a token, a 1x128 token
// group) gets its scale and its codes under a Dialect, and the load/apply plumbing the three
// linear schemes share.
//
// Precision contract (FORMATS.md §1.1, §2.4, §2.5, §3.1, §3.2, §4.4, card C6):
//   * amax is exact (max |x| of the operands as the dialect sees them: rounded to its arithmetic).
//   * s = amax / 448 is computed in Fp8ScaleRule::arith (fp64 ideal; fp32 engines; the model
//     dtype for compressed-tensors, i.e. an fp32 quotient rounded to bf16/fp16), then floors
//     (amax_floor before the division, min_scale after), then UE8M0 rounding (2^ceil(log2 s)) if
//     asked, then zero replacement (compressed-tensors: the dtype's eps).
//   * t = x/s or x*(1/s) (ScaleUse) in the same arithmetic; t is clamped to [-448, 448] and
//     rounded once to e4m3fn, round-half-even. The ideal dialect rounds the exact quotient
//     (448*x/amax when s = amax/448; x/s for a stored or static s) once, ties decided exactly
//     (numeric.h e4m3_of_quotient), never an fp64 quotient rounded a second time. Clamping first
//     means values beyond 448*s saturate to 448 (0x7E) and never become NaN (torch's cast is
//     non-saturating: 464 < |t| -> NaN).
//   * s == 0 (all-zero set with no floor): zero_saturates reproduces vLLM's kernel, where
//     x*(1/0) = NaN/inf and fminf/fmaxf give +-448 (+448 for 0); otherwise every code is 0.
//   * Stored weight scales are rounded once (RNE) to the storage dtype and the codes are computed
//     with the stored scale, so a file is always self-consistent (dequantize(q) = q * stored s).
//   * fp8 values are multiples of 2^-9 (the smallest subnormal): codes on that lattice make
//     every GEMM an exact integer accumulation per scale segment (scaled_gemm).
//   * Inputs are taken as given (fp64); an engine sees model-dtype activations: round them before
//     calling to emulate that. NaN/Inf inputs are rejected (kernels and torch disagree on NaN).
//
// Dialect -> Fp8Rules (every engine step has a defined rule; sources in FORMATS.md):
//   weight scale     ideal: fp64, x/s, 0 -> the storage dtype's eps.
//                    compressed-tensors: model dtype, x/s, 0 -> dtype eps (§2.4).
//                    vllm (no offline producer: its kernels' rules): fp32; tensor x*(1/s), s = 0
//                      saturates (§3.1); channel x/s, s >= 1/(448*512); block amax >= 1e-10, x/s.
//                    sglang: = vllm. msmodelslim: fp32, x/s, s >= 2^-23 (UNCONFIRMED, §5.5 doc).
//   fused per-tensor ideal, compressed-tensors (one scale per module), msmodelslim: exact fp64
//   unification       q*s_i/max_s, x/s. vllm: fp16 dequant, then x*(1/max_s) in fp32 (§3.6);
//                    sglang: = vllm (§4.1, card C8).
//   static input     ideal x/s fp64; compressed-tensors x/s in the model dtype; vllm x*(1/s) fp32
//                    (§3.1); sglang x*(1/s) (§4.4); msmodelslim = vllm.
//   dynamic tensor   ideal x/s, s = 0 -> codes 0; compressed-tensors x/s model dtype, eps; vllm
//                    x*(1/s), s = 0 -> 448; sglang = vllm (sgl_per_tensor UNCONFIRMED);
//                    msmodelslim = vllm.
//   dynamic token    ideal x/s, s = 0 -> codes 0; compressed-tensors x/s model dtype, eps (§2.4,
//                    real per-token semantics, not CT's 2-D quirk); vllm x/s, s >= 1/(448*512);
//                    sglang x*(1/s), s = amax/448, no floor, zero row -> codes 0 (*);
//                    msmodelslim = vllm (npu_dynamic_quant internals UNCONFIRMED).
//   dynamic group    ideal x/s, s = 0 -> codes 0; compressed-tensors x/s model dtype, eps; vllm
//   1x128            x/s, amax >= 1e-10; sglang x*(1/s), amax >= 1e-10; msmodelslim = vllm.
//   UE8M0 groups     flag Fp8Rules::group_ue8m0 (default off): s = 2^ceil(log2 s) (§3.2, §4.4).
//   (*) sgl-kernel csrc/gemm/per_token_quant_fp8.cu (sgl-project/sglang @ 0490047f): scale =
//       amax/448 (fp32), scale_inv = 1/scale (0 when scale is 0 in the warp kernel), q =
//       clamp(x*scale_inv); the small-batch kernel has no zero guard (codes 448, scale 0 ->
//       dequant 0 as well). Not the HIP fallback's max(amax,1e-12)/448, x/s of FORMATS.md §4.4.
#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "core/dtype.h"
#include "schemes/description/dialect.h"
#include "schemes/math/matmul.h"
#include "schemes/math/numeric.h"
#include "schemes/math/scaled_gemm.h"
#include "schemes/method/host_tensor.h"
#include "schemes/method/linear_method.h"
#include "schemes/method/quantize_request.h"

namespace qparity::reference {

inline constexpr double kFp8Max = 448.0;
inline constexpr double kFp8Lattice = 0x1p-9;  // smallest e4m3fn subnormal
inline constexpr double kVllmTokenMinScale = 1.0 / (448.0 * 512.0);
inline constexpr double kGroupAmaxEps = 1e-10;  // per-token-group kernels (vLLM, SGLang)
inline constexpr int64_t kFp8BlockSize = 128;

// Which producer's file layout: compressed-tensors (scales in the model dtype), HF/DeepSeek
// quant_method "fp8" (F32 scales; block scales named weight_scale_inv), msModelSlim
// WFP8AFP8_DYNAMIC (F32 weight_scale [N,1], zero weight_offset, F32 bias).
enum class Fp8File : uint8_t { kCompressedTensors, kFp8Config, kMsModelSlim };
std::string_view to_string(Fp8File f);
// From MethodConfig::format: "fp8" -> kFp8Config, "msmodelslim" -> kMsModelSlim, else CT.
Fp8File fp8_file_of(const MethodConfig& c);
// The producer a dialect stands for when quantize_* is not told: msmodelslim -> its own file,
// everything else -> compressed-tensors.
Fp8File default_fp8_file(Dialect d);
// The dtype a file stores its scales in.
DType fp8_scale_dtype(Fp8File f, DType model_dtype);

// Options of quantize_fp8_* beyond QuantizeRequest.
struct Fp8QuantizeOptions {
  std::optional<Fp8File> file;  // unset: default_fp8_file(request.dialect)
};

// How one reduction set gets its scale and its codes.
struct Fp8ScaleRule {
  Arith arith = Arith::kFp64;
  ScaleUse use = ScaleUse::kDivide;
  double amax_floor = 0.0;      // amax = max(amax, amax_floor) before the division
  double min_scale = 0.0;       // s = max(s, min_scale) after it
  double zero_scale = 0.0;      // replaces s == 0 (dtype eps); 0: keep s = 0
  bool zero_saturates = false;  // s == 0: codes +-448 (vLLM kernel), else codes 0
  bool ue8m0 = false;           // s = 2^ceil(log2 s)
  // ideal: codes are the correctly rounded e4m3 of the exact quotient (e4m3_of_quotient): of
  // 448*x/amax for a scale computed from the set's amax, of x/s for a given (stored or static)
  // scale; not of an fp64 quotient rounded first.
  bool exact_quotient = false;
};

// Activation quantization modes of the linear schemes.
enum class Fp8Act : uint8_t { kNone, kStatic, kDynamicTensor, kDynamicToken, kDynamicGroup };
std::string_view to_string(Fp8Act a);

enum class Fp8Granularity : uint8_t { kTensor, kChannel, kBlock };

struct Fp8Rules {
  Dialect dialect = Dialect::kIdeal;
  // Producer side (weights).
  bool weight_in_model_dtype = false;  // compressed-tensors: s and x/s in the model dtype
  Arith weight_arith = Arith::kFp64;   // otherwise
  ScaleUse weight_tensor_use = ScaleUse::kDivide;
  ScaleUse weight_channel_use = ScaleUse::kDivide;
  ScaleUse weight_block_use = ScaleUse::kDivide;
  double weight_min_scale = 0.0;          // msModelSlim FLT_EPSILON floor
  double weight_channel_min_scale = 0.0;  // vLLM per-token kernel floor
  double weight_block_amax_floor = 0.0;   // vLLM group kernel eps
  bool weight_tensor_zero_saturates = false;
  // Fused per-tensor unification.
  bool requant_via_fp16 = false;  // vLLM/SGLang per_tensor_dequantize + static x*(1/max_s) fp32
  // Engine side (activations).
  bool act_in_model_dtype = false;  // compressed-tensors QDQ
  Arith act_arith = Arith::kFp64;
  ScaleUse static_use = ScaleUse::kDivide;
  ScaleUse tensor_use = ScaleUse::kDivide;
  bool tensor_zero_saturates = false;
  ScaleUse token_use = ScaleUse::kDivide;
  double token_min_scale = 0.0;
  ScaleUse group_use = ScaleUse::kDivide;
  double group_amax_floor = 0.0;
  bool group_ue8m0 = false;  // DeepGEMM / SGLang on Blackwell; vLLM option
  // Loader constraints.
  bool check_merged_block_n = false;  // vLLM/SGLang validate_fp8_block_shape: every fused
                                      // partition but the last is a multiple of 128
  bool moe_block_needs_aligned_intermediate = false;  // SGLang MoE: I % 128 == 0
  // Dynamic 1x128 activation groups need K % 128 == 0 (no ragged last group): vLLM's and
  // SGLang's per_token_group_quant_fp8 assert it; compressed-tensors' QDQ unflattens K into
  // (ceil(K/128), 128), which fails for a ragged K. ideal keeps a ragged last group.
  bool group_needs_aligned_k = false;

  Fp8ScaleRule weight_rule(Fp8Granularity g, DType storage_dtype, DType model_dtype) const;
  Fp8ScaleRule activation_rule(Fp8Act a, DType model_dtype) const;
};

Fp8Rules fp8_rules(Dialect d);

// finfo(dtype).eps: bf16 2^-7, fp16 2^-10, fp32 2^-23, fp64 2^-52.
double dtype_eps(DType d);

// clamp(t, -448, 448) rounded to e4m3fn (RNE): the value of the code. NaN -> Error(where).
double fp8_saturate(double t, const std::string& where = "fp8");
// The scale of a set with absolute maximum amax.
double fp8_scale(double amax, const Fp8ScaleRule& r);
// The e4m3fn value x quantizes to with scale s (see the s == 0 rules above).
double fp8_value(double x, double s, const Fp8ScaleRule& r);
// s rounded once to a float storage dtype (exact for F64).
double round_to_dtype(double s, DType d);

// A weight quantized in tiles of block_rows x block_cols (tensor: N x K, channel: 1 x K,
// block: 128 x 128, ragged at the edges): fp8 values and the stored scales.
struct Fp8Weight {
  Matrix values;  // [N, K] e4m3fn values
  Matrix scales;  // [ceil(N/br), ceil(K/bc)] as stored
};
Fp8Weight quantize_weight_fp8(const Matrix& w, int64_t block_rows, int64_t block_cols,
                              const Fp8ScaleRule& rule, DType scale_dtype);

// Activations x [T, K] quantized per mode (static uses static_scale; group uses 1 x group).
QuantizedMatrix quantize_activation_fp8(const Matrix& x, Fp8Act mode, const Fp8ScaleRule& rule,
                                        double static_scale = 0.0, int64_t group = kFp8BlockSize);

// fp8 values -> integer codes on the 2^-9 lattice.
std::vector<int64_t> fp8_lattice_codes(std::span<const double> values);

// --- loading helpers (errors name `where`) ---
// Decoded fp8 weight values; NaN bytes (0x7F/0xFF) are an error.
std::vector<double> load_fp8_values(const HostTensor& t, const std::string& where);
// Decoded scales; NaN, Inf and negative values are errors. A zero scale is accepted: it is what
// vLLM's dynamic per-tensor quantization writes for an all-zero tensor and it dequantizes to 0.
std::vector<double> load_fp8_scales(const HostTensor& t, const std::string& where);

// The activation mode MethodConfig::input_activations asks for; errors name `where`.
// allowed lists the modes the scheme supports.
Fp8Act fp8_act_of(const MethodConfig& c, std::span<const Fp8Act> allowed, const std::string& where);

// Linear layer with fp8 weights `w` (codes on 2^-9, scale grid) and activations per `mode`:
// y = scaled_gemm(quantize(x), w) + bias (kNone: weight_only_gemm).
Matrix fp8_linear_apply(const Matrix& x, const QuantizedMatrix& w, Fp8Act mode,
                        const Fp8ScaleRule& act_rule, double static_scale,
                        const std::vector<double>& bias);

// Checks QuantizeRequest::weights (when set) against the scheme: float 8-bit, symmetric,
// strategy `strategy`.
void check_fp8_weight_args(const std::optional<QuantArgs>& a, QuantStrategy strategy,
                           const std::string& where);

// The shared run-time state of the three fp8 linear schemes: per expert, the fused weight as
// codes on the 2^-9 lattice with its scale grid, the bias, and one static input scale.
// Subclasses implement create_weights and process (filling experts_ / static_input_scale_).
class Fp8LinearBase : public LinearMethod {
 public:
  Fp8LinearBase(LinearShape shape, MethodConfig config, Fp8Rules rules,
                std::span<const Fp8Act> allowed);
  const Fp8Rules& rules() const { return rules_; }
  Fp8Act activation_mode() const { return act_; }
  Fp8File file() const { return file_; }
  // For an engine's own layout: the processed fused weight of one expert (codes on the 2^-9
  // lattice, the scale grid and its block shape), its bias (zeros when none), the activation
  // rule of this dialect and the static input scale (kStatic).
  const QuantizedMatrix& processed_weight(int64_t expert) const { return experts_.at(expert); }
  const std::vector<double>& processed_bias(int64_t expert) const { return biases_.at(expert); }
  Fp8ScaleRule activation_rule() const { return rules_.activation_rule(act_, shape().model_dtype); }
  double static_input_scale() const { return static_input_scale_; }

 protected:
  Matrix do_apply(const Matrix& x, int64_t expert) const override;
  Matrix do_dequantized_weight(int64_t expert) const override;
  std::optional<QuantizedMatrix> do_quantize_input(const Matrix& x, int64_t expert) const override;
  // Decoded fp8 values of every partition of one expert, fused [N, K]; errors name tensors.
  Matrix load_fused_values(int64_t expert) const;
  // fp8_lattice_codes(load_fused_values(expert)), the same codes and errors, read straight from
  // F8_E4M3 bytes (a table per byte, no fp64 copy: an 8B layer's weight is 218 M elements).
  std::vector<int64_t> load_fused_codes(int64_t expert) const;
  // "w13" for a two-partition expert stack (gate/up), "w2" otherwise.
  std::string moe_name() const;
  // The fused codes of every expert as an F8_E4M3 tensor ([N, K] or [E, N, K]).
  HostTensor runtime_weight() const;

  Fp8Rules rules_;
  Fp8Act act_;
  Fp8File file_;
  std::vector<QuantizedMatrix> experts_;
  std::vector<std::vector<double>> biases_;
  double static_input_scale_ = 0.0;
};

}  // namespace qparity::reference
