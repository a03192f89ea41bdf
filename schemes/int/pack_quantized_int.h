#pragma once
// Scheme `w4a16-g32`, implemented as compressed-tensors `pack-quantized` INT weights in general
// (FORMATS.md §2.2-2.6(b), card C1): num_bits 2..8, strategy group / channel / tensor, symmetric
// or asymmetric, optional actorder=group (weight_g_idx). Activations stay in floating point,
// except at the WnA8 / WnAFP8 points (SchemeId::int_inputs: compressed-tensors W4A8, W4AFP8):
// inputs quantized per token at run time, int8 by w8a8-int8-dyn's Int8ActRules (the dialect's
// scale and rounding), fp8 e4m3 by fp8-channel's per-token rule; then
//   y[t, n] = s_x[t] * sum_g s_w[n, g] * sum_{k in g} x_q[t, k] * (q - z)[n, k] + b[n]
// with every group sum exact (int: scaled_gemm's integer sums with the int32 check; fp8: the
// products on their lattices) and the scales applied in fp64. With actorder the inputs are
// quantized in the permuted column order (a per-token scale does not depend on it). Codes are
// stored packed (pack-quantized) or one I8 per code (int-quantized, compressed-tensors'
// default for W4A8; vLLM's Hopper W4A8 kernels read pack-quantized only).
//
// Tensors per shard (names relative to the linear prefix; N = out_features, K = in_features,
// b = num_bits, G = number of groups = K/group_size, 1 for channel/tensor):
//   weight_packed      I32  [N, ceil(K*b/32)] (dense stream, CT >= 3f01c782) or
//                           [N, ceil(K/(32/b))] (per-word, older CT); identical for b in {2,4,8}.
//                           Element k of row n stored unsigned u = q + 2^(b-1).
//   weight_scale       model dtype (BF16/F16/F32 accepted) [N, G] | [N, 1] | [1]
//   weight_shape       I64  [2] = [N, K] (checked; an error names the tensor otherwise)
//   weight_zero_point  asym only: group/channel I32 [ceil(N*b/32), G], the int8 zero points
//                      packed along N with the same u = z + 2^(b-1) scheme (§2.6(b),
//                      compressed-tensors pack_quantized/base.py PACK_ZP_STRATS); tensor: I8 [1]
//   weight_g_idx       I32 [K], actorder=group only: group of each column, values in [0, G);
//                      a g_idx containing -1 means column order (§2.5)
//   bias               optional, any float dtype
//
// Precision contract:
//   * dequantize/apply: w[n,k] = (q - z) * s exactly in fp64 (integer code times the decoded
//     scale, one rounding), apply = x @ w^T via weight_only_gemm (fp64 sums in ascending k over
//     each scale segment). With g_idx the columns are stably permuted so that each group is
//     contiguous (what compressed-tensors' argsort and vLLM's Marlin g_idx sort do); every group
//     must then hold exactly group_size columns, else both would group wrongly - an error here.
//   * quantize (§2.4, rules below): clamp to [-2^(b-1), 2^(b-1)-1] then round half-even
//     (torch.round); the zero point is rounded half-even and clamped likewise.
//
// Dialects (IntWeightRules, int_weight_rules()):
//   dialect            sym divisor        scale computed in          x/s in      zero scale
//   ideal              (2^b-1)/2 (7.5)    fp64, stored once (RNE)    fp64        dtype eps
//   compressed-tensors (2^b-1)/2          model dtype (bf16: two     model dtype dtype eps (§2.4
//                                         roundings, torch CPU/CUDA)             step 7)
//   vllm, sglang       no weight producer: compressed-tensors rules
//   msmodelslim        2^(b-1)-1 (127, 7) fp32, max(s, FLT_EPSILON)  fp32        FLT_EPSILON floor
//                      (§5.2; used by w8a8-int8-dyn's msModelSlim naming. For pack-quantized,
//                      which msModelSlim never writes, msmodelslim maps to compressed-tensors.)
//   ideal: the producer's divisor (so "format error" measures the format, not a different
//   quantizer), scale exact then rounded once to the storage dtype, codes from the stored scale.
//   Asymmetric (§2.4 step 3): s = (max - min)/(2^b - 1), z = round(clamp(q_min - min/s)) with the
//   stored scale; an all-zero asymmetric group (compressed-tensors: s = 0 -> zp NaN before the
//   eps replacement, §2.4 step 8) here gets s = eps and z = q_min, so it dequantizes to 0.
// Actorder=group when quantizing: with ActivationStats.channel_absmax the columns are ordered by
// descending activation magnitude (GPTQ orders by the Hessian diagonal, i.e. E[x^2]; this is
// the available proxy) and g_idx[perm[j]] = j / group_size; without stats g_idx = k / group_size.
//
// MoE: the same class loads expert stacks (per expert per shard tensors, apply(x, expert));
// runtime_tensors() gives SGLang's stacked names: w13_* for a two-partition (gate/up) stack,
// w2_* for a one-partition (down) stack: *_weight_packed I32 [E, N, Kp], *_weight_scale
// [E, N, G] (model dtype), *_weight_shape [E, 2] (default dtype; BF16 here, see mxint4.h).
#include <functional>
#include <memory>
#include <optional>
#include <vector>

#include "core/codecs/int_packing.h"
#include "schemes/math/numeric.h"
#include "schemes/method/linear_method.h"
#include "schemes/method/quantize_request.h"

namespace qparity::reference {

enum class IntScalePrecision : uint8_t {
  kExactThenStore,  // fp64, then rounded once to the scale's storage dtype
  kModelDtype,      // every step in the scale dtype's arithmetic (torch bf16/fp16 tensors)
  kFp32,            // every step in fp32
};

struct IntWeightRules {
  Dialect dialect = Dialect::kIdeal;
  bool half_range_divisor = true;  // sym: amax/((2^b-1)/2); false: amax/(2^(b-1)-1)
  IntScalePrecision precision = IntScalePrecision::kExactThenStore;
  bool eps_floor = false;  // true: s = max(s, FLT_EPSILON) (msModelSlim); false: 0 -> dtype eps
  IntRound round = IntRound::kHalfEven;
};

// Rules of compressed-tensors-style weight quantization (msmodelslim -> §5.2 rules).
IntWeightRules int_weight_rules(Dialect d);
// The pack-quantized mapping: msmodelslim (no pack-quantized producer) uses the CT rules.
IntWeightRules pack_quantized_rules(Dialect d);

struct IntQParams {
  double scale = 1.0;      // as stored (a value of `scale_dtype`)
  int64_t zero_point = 0;  // 0 when symmetric
};

// finfo(dtype).eps of a float scale dtype (BF16 2^-7, F16 2^-10, F32 2^-23, F64 2^-52).
double int_scale_eps(DType scale_dtype);
// Scale and zero point of one reduction set with extremes mn <= mx (values as the producer sees
// them); scale_dtype is where the scale is stored.
IntQParams int_qparams(double mn, double mx, int bits, bool symmetric, const IntWeightRules& r,
                       DType scale_dtype);
// The signed code of x under p: clamp(x/s + z) then round (r.round), precision as r says.
int64_t int_quantize(double x, const IntQParams& p, int bits, const IntWeightRules& r,
                     DType scale_dtype);

// One shard's integer weight: w[n,k] = (q[n,k] - zero[n, group[k]]) * scales(n, group[k]).
struct IntWeight {
  int64_t rows = 0;
  int64_t cols = 0;
  int64_t groups = 1;
  std::vector<int64_t> q;      // rows*cols signed codes
  Matrix scales;               // [rows, groups] (channel/tensor: groups = 1, tensor replicated)
  std::vector<int64_t> zero;   // rows*groups
  std::vector<int64_t> group;  // [cols] group of each column
};

Matrix dequantize(const IntWeight& w);

// Checks a QuantArgs for pack-quantized INT and returns the group size along K (K for
// channel/tensor). Errors name `where`.
int64_t pack_quantized_group(const QuantArgs& a, int64_t in_features, const std::string& where);

// How the integer codes are stored: packed into int32 words (pack-quantized) or one signed code
// per I8 element (int-quantized / naive-quantized, compressed-tensors' naive compressor: `weight`
// [N, K], zero points unpacked I8 [N, G] / [N, 1] / [1], no weight_shape); or in another
// producer's layout of the same point: GPTQ's qweight / qzeros / scales / g_idx, v1 (stored
// zero - 1) or v2 (gptq_layout.h), AutoAWQ's GEMM layout (awq_layout.h).
enum class IntCodeStorage : uint8_t { kPacked, kUnpacked, kGptqV1, kGptqV2, kAwqGemm };
// The storage a checkpoint format name implies for integer weights: compressed-tensors'
// int-quantized / naive-quantized (unpacked) and pack-quantized, "gptq", "gptq_v2", "awq".
IntCodeStorage int_code_storage(const std::string& format);
// The format name of a storage ("pack-quantized", "int-quantized", "gptq", "gptq_v2", "awq").
std::string int_storage_format(IntCodeStorage s);
// Whether the storage is another producer's (GPTQ / AWQ): tensors transposed to [K, N] (or
// [G, N]), so a fused checkpoint tensor does not split by rows.
bool is_producer_int_storage(IntCodeStorage s);

// The groups a g_idx tensor gives its K columns: every value in [0, groups) and every group
// exactly gsize columns (compressed-tensors and vLLM sort g_idx and read runs of group_size, so
// anything else groups wrongly); an Error naming `where` and the element or group otherwise.
std::vector<int64_t> checked_g_idx(std::span<const int64_t> g_idx, int64_t groups, int64_t gsize,
                                   const std::string& where);

// The checkpoint tensors of one pack-quantized shard [N, K].
std::vector<ParamSpec> pack_quantized_specs(const QuantArgs& a, codec::CtPackLayout layout,
                                            int64_t n, int64_t k, std::vector<DType> scale_dtypes,
                                            IntCodeStorage storage = IntCodeStorage::kPacked);

// Decodes and checks one shard's tensors (weight_packed, weight_scale, weight_shape and, as the
// args say, weight_zero_point / weight_g_idx). `get(name)` returns the loaded tensor or nullptr;
// `where(name)` names it in errors.
IntWeight decode_pack_quantized(const std::function<const HostTensor*(const std::string&)>& get,
                                const std::function<std::string(const std::string&)>& where,
                                const QuantArgs& a, codec::CtPackLayout layout, int64_t n,
                                int64_t k, IntCodeStorage storage = IntCodeStorage::kPacked);

// Quantizes [N, K] as compressed-tensors pack-quantized writes it. Args: request.weights or the
// scheme preset (W4A16: int4 group 32 symmetric); group_size from the args (request.group_size
// overrides when > 0).
TensorMap quantize_pack_quantized(const QuantizeRequest& request,
                                  codec::CtPackLayout layout = codec::CtPackLayout::kDenseStream,
                                  IntCodeStorage storage = IntCodeStorage::kPacked);
// The fp64 weight of a quantize_pack_quantized() result.
Matrix dequantize_pack_quantized(const TensorMap& tensors, const QuantArgs& args,
                                 codec::CtPackLayout layout = codec::CtPackLayout::kDenseStream,
                                 const std::string& where = "weight");

// Stacks per-shard IntWeights into one fused QuantizedMatrix over permuted columns. The matrix
// keeps the raw codes q (compact: int4 in a nibble, int8 in a byte) and the zero points as its
// per-block zero points, so its codes are q - z.
struct FusedIntWeight {
  QuantizedMatrix w;           // codes q - z in permuted column order
  std::vector<int64_t> perm;   // permuted column j is original column perm[j]
  std::vector<int64_t> group;  // [K] group of each original column (weight_g_idx)
  bool identity = true;
};
FusedIntWeight fuse_int_weights(const std::vector<IntWeight>& shards, int64_t group_size,
                                const std::string& where);
// The shards back from a fused weight (original column order), rows split by `partitions`.
std::vector<IntWeight> unfuse_int_weights(const FusedIntWeight& f,
                                          std::span<const int64_t> partitions);
// x's columns in the fused weight's (act-order) column order: x itself when in order.
Matrix permuted_columns(const FusedIntWeight& f, const Matrix& x);
Matrix apply_fused(const FusedIntWeight& f, const Matrix& x);

class PackQuantizedLinearMethod final : public LinearMethod {
 public:
  PackQuantizedLinearMethod(LinearShape shape, MethodConfig config,
                            codec::CtPackLayout layout = codec::CtPackLayout::kDenseStream);
  std::vector<ParamSpec> create_weights(int64_t partition) const override;
  TensorMap runtime_tensors() const override;
  std::optional<ProcessedIntWeight> processed_int_weight(int64_t expert) const override;
  const QuantArgs& args() const { return args_; }

 protected:
  void process() override;
  Matrix do_apply(const Matrix& x, int64_t expert) const override;
  Matrix do_dequantized_weight(int64_t expert) const override;
  std::optional<QuantizedMatrix> do_quantize_input(const Matrix& x, int64_t expert) const override;

 private:
  QuantizedMatrix quantize_permuted_input(const Matrix& xp) const;

  QuantArgs args_;
  IntWeightInputs inputs_ = IntWeightInputs::kNone;
  IntCodeStorage storage_ = IntCodeStorage::kPacked;
  codec::CtPackLayout layout_;
  int64_t group_size_ = 0;
  std::vector<FusedIntWeight> fused_;  // per expert
  std::vector<std::vector<double>> biases_;
};

std::unique_ptr<LinearMethod> make_pack_quantized_method(LinearShape shape, MethodConfig config);
std::unique_ptr<LinearMethod> make_pack_quantized_method(LinearShape shape, MethodConfig config,
                                                         codec::CtPackLayout layout);

// SGLang stacked run-time tensors of an expert stack of IntWeights ("w13_" / "w2_" prefix):
// *_weight_packed I32 [E, N, Kp], *_weight_scale [E, N, G] in scale_dtype, *_weight_shape
// BF16 [E, 2].
TensorMap stacked_runtime_tensors(const std::vector<std::vector<IntWeight>>& shards,
                                  const LinearShape& shape, int bits, codec::CtPackLayout layout,
                                  DType scale_dtype);

}  // namespace qparity::reference
