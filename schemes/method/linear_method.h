#pragma once
// The LinearMethod lifecycle shared by both engines (ARCHITECTURE.md):
//   1. create_weights(partition): the checkpoint tensors one shard of one expert carries, with
//      the producer's own names, dtypes and shapes;
//   2. load(name, tensor, partition, expert): the loader hands over checkpoint tensors one by one
//      (q/k/v into a fused qkv layer as partitions 0/1/2, gate/up as 0/1, experts by index); each
//      is checked against its spec (unknown name, wrong dtype, wrong shape, loaded twice: errors
//      naming the checkpoint tensor) and kept in its checkpoint dtype;
//   3. process_weights_after_loading(): checks that every required tensor arrived, then converts
//      the checkpoint layout to the run-time layout once (unpacking, offset negation, scale
//      unification across fused partitions, deq_scale bit decoding...) - never in apply;
//   4. apply(x): the layer, x [T, K] -> y [T, N] with N the fused out_features.
// A scheme's class knows nothing of the model: it sees a LinearShape (partitions, K, experts).
#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <tuple>
#include <vector>

#include "core/dtype.h"
#include "schemes/description/dialect.h"
#include "schemes/description/quant_args.h"
#include "schemes/description/scheme_registry.h"
#include "schemes/math/matmul.h"
#include "schemes/math/scaled_gemm.h"
#include "schemes/method/host_tensor.h"
#include "schemes/method/linear_transforms.h"

namespace qparity::reference {

// The geometry of one engine layer.
struct LinearShape {
  // Dense unfused: "model.layers.0.self_attn.o_proj" with partition_names {""}.
  // Fused: "model.layers.0.self_attn" with {"q_proj", "k_proj", "v_proj"}.
  // Expert stack: "model.layers.0.mlp.experts" with {"gate_proj", "up_proj"} and num_experts E;
  // shard (e, p) is then named "<prefix>.<e>.<partition name>".
  std::string prefix;
  std::vector<std::string> partition_names{""};
  std::vector<int64_t> partitions;  // out_features of each partition
  int64_t in_features = 0;
  int64_t num_experts = 0;  // 0: one dense linear
  DType model_dtype = DType::kBF16;
  // The dtype the model runs in (CausalLm's run_dtype): an unquantized weight stored in another
  // dtype is rounded to it once. Empty: model_dtype, nothing rounded.
  std::optional<DType> run_dtype;
  bool has_bias = false;

  int64_t out_features() const;
  int64_t expert_count() const { return num_experts > 0 ? num_experts : 1; }
  int64_t partition_count() const { return static_cast<int64_t>(partitions.size()); }
  int64_t partition_offset(int64_t p) const;  // first fused output row of partition p
  std::string shard_prefix(int64_t expert, int64_t partition) const;

  static LinearShape dense(std::string prefix, int64_t out_features, int64_t in_features,
                           DType model_dtype = DType::kBF16, bool has_bias = false);
};

struct ParamSpec {
  std::string name;           // relative to the shard prefix: "weight_scale"
  std::vector<DType> dtypes;  // accepted; the first is what the scheme's quantize writes
  std::vector<int64_t> shape;
  bool required = true;
  std::string note;
  // Other spellings real files use for the same data (msModelSlim's older per-channel [N] for
  // [N, 1]); loaded as found, with the same element order.
  std::vector<std::vector<int64_t>> alt_shapes = {};
};

// An integer weight after processing (msModelSlim W8A16, compressed-tensors pack-quantized INT,
// the int8 weights of w8a8-int8-dyn) in one engine-neutral form, columns in checkpoint order, for
// an engine to repack into its kernels' layout: w[n, k] = (stored[n, k] - zero[n, k / group]) *
// scale[n, k / group]. `stored` are the signed codes (U8 files already shifted by -128,
// pack-quantized u = q + 2^(b-1) already decoded, SGLang's fp8 requantization already applied);
// `zero` is in the code's units (msModelSlim's weight_offset, compressed-tensors' zero point), 0
// when symmetric; the bias (if any) is the layer's fused [N] bias.
struct ProcessedIntWeight {
  int64_t rows = 0, cols = 0, group = 0;  // group: columns per scale (cols for per channel)
  int bits = 8;
  std::vector<int8_t> stored;       // [rows * cols]
  std::vector<double> zero, scale;  // [rows * cols / group]
  std::vector<double> bias;         // [rows] or empty
  // Act order (compressed-tensors actorder=group, GPTQ desc_act): stored column j is the layer's
  // input column perm[j], every group contiguous in j (the stable sort of weight_g_idx that
  // compressed-tensors and vLLM's Marlin make); empty in column order. An engine gathers its
  // inputs x[:, perm[j]] before the GEMM; the products are the same, summed in j's order.
  std::vector<int64_t> perm;
};

// Which integers of a QuantizedMatrix become ProcessedIntWeight::stored.
enum class IntCodes : uint8_t {
  kStored,    // as stored (zero points, if any, go in ProcessedIntWeight::zero)
  kZeroFree,  // codes with the matrix's own zero points subtracted
};
// rows, cols, group, bits and stored of m's integers as one int8 matrix; the method fills scale,
// zero and bias (what they mean differs by scheme).
ProcessedIntWeight int_weight_of(const QuantizedMatrix& m, int64_t group, int bits, IntCodes which);

// What a LinearMethod is built from: the plan entry's scheme and args, and the dialect.
struct MethodConfig {
  SchemeId scheme;
  Dialect dialect = Dialect::kIdeal;
  std::optional<QuantArgs> weights;
  std::optional<QuantArgs> input_activations;
  std::string format;       // compressed-tensors format, "msmodelslim", "fp8", "dense"
  std::string source_type;  // msModelSlim type ("W8A8S"), compressed-tensors preset, ...
  // Online rotations of the layer's plan entries (its first member's; the loader checks that
  // fused members agree). Their matrices come through set_online_transforms.
  std::vector<OnlineTransform> transforms;
};

class LinearMethod {
 public:
  LinearMethod(LinearShape shape, MethodConfig config);
  virtual ~LinearMethod() = default;
  LinearMethod(const LinearMethod&) = delete;
  LinearMethod& operator=(const LinearMethod&) = delete;

  const LinearShape& shape() const { return shape_; }
  const MethodConfig& config() const { return config_; }
  Dialect dialect() const { return config_.dialect; }

  virtual std::vector<ParamSpec> create_weights(int64_t partition) const = 0;

  // The shape rules of this scheme under this dialect that need no weights: an Error naming the
  // checkpoint tensor and the rule. Rules of the format itself are checked by the constructor;
  // this adds the dialect's (engine kernels' divisibility, fused-partition alignment).
  // process_weights_after_loading calls it; fixtures::scheme_exclusions calls it before any
  // weight exists.
  void check_shape() const { do_check_shape(); }

  void load(const std::string& name, const TensorView& t, int64_t partition = 0,
            int64_t expert = 0);
  // Loads every tensor of `tensors` (a quantize() result) into one shard.
  void load_all(const TensorMap& tensors, int64_t partition = 0, int64_t expert = 0);

  void process_weights_after_loading();
  bool processed() const { return processed_; }

  // The layer: the input transform (if any), the scheme's product, the output transforms.
  Matrix apply(const Matrix& x, int64_t expert = 0) const;
  // The matrices of config().transforms (the loader reads them from the checkpoint: they may be
  // stored under another layer's name). apply() refuses to run without them.
  void set_online_transforms(LinearTransforms t);
  const LinearTransforms& online_transforms() const { return transforms_; }
  // The weight the scheme's product multiplies with, in fp64, [N, K] with the partitions in
  // order; online transforms are not folded in. For activation-quantized schemes this is the
  // weight side only.
  Matrix dequantized_weight(int64_t expert = 0) const;
  // The activation codes apply() would feed its GEMM for x (activation-quantized schemes), with
  // their scales, after the input transform; nullopt for weight-only schemes. For bit-exact
  // comparison with an engine's activation quantization kernel.
  std::optional<QuantizedMatrix> quantize_input(const Matrix& x, int64_t expert = 0) const;
  // The processed weight as a ProcessedIntWeight (integer-weight schemes; nullopt for every
  // other scheme), act order's column permutation in ProcessedIntWeight::perm.
  virtual std::optional<ProcessedIntWeight> processed_int_weight(int64_t expert = 0) const {
    (void)expert;
    return std::nullopt;
  }
  // Run-time tensors after processing, under the engine's names (SGLang's w13_weight_scale [E]
  // for a unified expert stack, ...), for inspection and tests.
  virtual TensorMap runtime_tensors() const { return {}; }
  // Bytes of checkpoint tensors still held after processing (see retained_after_processing).
  size_t loaded_bytes() const;
  // The checkpoint name of one shard's tensor, as errors name it:
  // "model.layers.0.self_attn.k_proj.weight_scale".
  std::string where(const std::string& name, int64_t partition, int64_t expert) const;

 protected:
  virtual void process() = 0;
  virtual void do_check_shape() const {}
  // Checkpoint tensors (by parameter name) the method still reads after process(); every other
  // loaded tensor is freed then, so a loaded model holds its weights once, in run-time form.
  virtual std::vector<std::string> retained_after_processing() const { return {}; }
  virtual Matrix do_apply(const Matrix& x, int64_t expert) const = 0;
  virtual Matrix do_dequantized_weight(int64_t expert) const = 0;
  virtual std::optional<QuantizedMatrix> do_quantize_input(const Matrix& x, int64_t expert) const {
    (void)x, (void)expert;
    return std::nullopt;
  }

  const HostTensor* find_loaded(const std::string& name, int64_t partition, int64_t expert) const;
  const HostTensor& loaded(const std::string& name, int64_t partition, int64_t expert) const;
  // The fused bias [N] of one expert from the shards' `bias` tensors (zeros where absent).
  std::vector<double> loaded_bias(int64_t expert) const;

 private:
  LinearShape shape_;
  MethodConfig config_;
  Matrix transformed_input(const Matrix& x) const;

  std::map<std::tuple<std::string, int64_t, int64_t>, HostTensor> loaded_;
  bool processed_ = false;
  LinearTransforms transforms_;
};

// The standard `bias` parameter: model dtype (any float dtype accepted; msModelSlim writes F32).
ParamSpec bias_spec(const LinearShape& s, int64_t partition);

}  // namespace qparity::reference
