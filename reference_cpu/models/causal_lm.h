#pragma once
// The fp64 reference decoder (Llama, Qwen3, Qwen3-MoE, Mistral, ChatGLM2, Qwen3.5) as one
// composition of shared blocks that
// differ by flags (has_qk_norm, MoE layers), in the shape mini-sglang gives its models:
//   embed -> per layer [input_norm -> attention (fused qkv LinearMethod, optional per-head q/k
//   RMSNorm, RoPE, KV cache through a KvCacheMethod, causal GQA softmax, o_proj) -> residual add
//   -> post_attention_norm -> SwiGLU MLP (fused gate_up, silu*mul, down) or sparse MoE (router,
//   softmax top-k, expert stacks) -> residual add] -> final norm -> lm_head (or tied embeddings).
// Every linear and expert stack is a LinearMethod chosen by the QuantPlan; the model never looks
// at the checkpoint format. Qwen3.5: a linear-attention layer's mixer is the Gated DeltaNet
// (gated_delta_net.h: fused in_proj_qkvz / in_proj_ba, causal conv, delta rule with its state,
// gated norm, out_proj), its full-attention layers gate the attention output with
// sigmoid(gate) from q_proj, and its norms' (1 + w) is folded into the weight at load.
// Image-text checkpoints (Qwen3-VL, Qwen3.5): forward_image_prompt places a prompt's images
// (the vision tower's features, M-RoPE positions, deepstack injection).
// Structure comes from ModelConfig; the loader (model_loader.h) fills
// weights.
//
// Precision modes:
//   exact    fp64 everywhere except the quantization formats' own rounding (activation codes,
//            KV-cache codes); an unquantized (kv-bf16) cache keeps fp64 values.
//   emulate  additionally rounds every activation an engine stores between ops to the model dtype
//            (bf16): norm outputs, qkv, q/k norms, RoPE outputs, the attention core, every linear
//            output, the residual stream, MLP activations, and the kv-bf16 cache; router logits
//            and top-k weights to fp32 and logits to fp32, as engines keep them.
// Determinism: every reduction runs in a fixed order (k ascending in linears, s ascending in
// attention, experts in ascending id for MoE as Hugging Face's expert loop adds them), so the same
// tokens give bit-identical outputs, and a prefill of T tokens equals T single-token decode steps.
#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "core/capture/trace.h"
#include "core/config/model_config.h"
#include "core/safetensors/checkpoint.h"
#include "reference_cpu/layers/gated_delta_net.h"
#include "reference_cpu/layers/rope.h"
#include "reference_cpu/models/deviation.h"
#include "schemes/description/quant_plan.h"
#include "schemes/kv/kv_cache_method.h"
#include "schemes/loading/layer_weights.h"
#include "schemes/math/numeric.h"
#include "schemes/method/linear_method.h"

namespace qparity::reference {

enum class PrecisionMode : uint8_t { kExact, kEmulate };
std::string_view to_string(PrecisionMode m);
PrecisionMode parse_precision_mode(std::string_view s);  // "exact" | "emulate"

// Observers for calibration (the quantizer's statistics): the input rows every linear sees (per
// checkpoint shard prefix: q/k/v_proj each see the input norm's output; an expert's linears see
// only the rows routed to it), and the key/value rows written to each attention's cache.
struct ForwardHooks {
  Trace* trace = nullptr;
  std::function<void(const std::string& linear_prefix, const Matrix& input)> on_linear_input;
  std::function<void(const std::string& attention_prefix, const Matrix& keys, const Matrix& values)>
      on_kv;
  // The activation codes each activation-quantized linear feeds its GEMM, named by engine layer
  // under the capture-point prefix ("layers.0.attn.qkv_proj", "layers.0.mlp.down_proj",
  // "layers.1.moe.experts.w13", ...): saturation and zero-scale statistics. Costs one more
  // quantization of the input per linear when set.
  std::function<void(const std::string& layer_name, const QuantizedMatrix& codes)>
      on_activation_codes;
};

// A decoder layer as the reference runs it: its weights (layer_weights.h, loaded by the schemes
// room's loader) and the sequence's state.
struct DecoderLayer : LayerWeights {
  Matrix k_cache, v_cache;       // what attention reads back, one row per cached token
  GatedDeltaNetState gdn_state;  // Gated DeltaNet layers: the sequence so far (empty: fresh)
};

// An image prompt's vision features (Qwen3-VL, Qwen3.5's image-text class): the vision tower's
// output (qwen3_vl_vision.h) and the grids it ran on.
struct ImageFeatures {
  Matrix embeds;                  // [image tokens, hidden]: the merger's output, in prompt order
  std::vector<Matrix> deepstack;  // each [image tokens, hidden]: added after layers 0, 1, ...
  std::vector<GridThw> grids;     // each image's grid in patches (t = 1: images, not videos)
  int64_t merge = 0;              // the tower's spatial_merge_size
};

// An image prompt checked against its features (CausalLm::prepare_image_prompt): what its
// embedding and each decoder layer need.
struct ImagePrompt {
  MropePositions positions;       // the three rotary rows and mrope_position_delta
  std::vector<int64_t> rows;      // the placeholders' token indices
  Matrix embeds;                  // [rows, hidden]
  std::vector<Matrix> deepstack;  // [rows, hidden] each: after layers 0, 1, ...
};

// The checks and positions of CausalLm::prepare_image_prompt for a decoder of cfg with
// num_layers layers, without the model (the GPU engine, which takes the reference's features).
ImagePrompt prepare_image_prompt(const ModelConfig& cfg, int64_t num_layers,
                                 std::span<const int64_t> tokens, ImageFeatures images);

// Streaming (model_loader's layer streaming): builds one decoder layer's weights when the model
// needs them and frees them after, so that a model larger than memory runs one layer at a time.
class LayerWeightSource {
 public:
  virtual ~LayerWeightSource() = default;
  // Fills `layer` (whose index is set) with its methods, norms and KV-cache method, loaded and
  // processed.
  virtual void load(DecoderLayer& layer) = 0;
};

class CausalLm {
 public:
  // run_dtype: the dtype the model runs its weights and stored activations in, as an engine
  // does (an fp32 checkpoint on a bf16 engine): every unquantized weight, norm weight and the
  // embedding are rounded once to it at load, and emulate mode stores activations in it. Empty:
  // the checkpoint's own model dtype (nothing rounded).
  CausalLm(ModelConfig cfg, QuantPlan plan, Dialect dialect, PrecisionMode mode,
           std::optional<DType> run_dtype = std::nullopt);

  const ModelConfig& config() const { return cfg_; }
  const QuantPlan& plan() const { return plan_; }
  Dialect dialect() const { return dialect_; }
  PrecisionMode mode() const { return mode_; }
  DType model_dtype() const { return model_dtype_; }  // the checkpoint's (config.json)
  DType run_dtype() const { return run_dtype_; }
  // The run dtype when one was asked for: only then are weights rounded at load (a checkpoint
  // whose tensors differ from its config's dtype, e.g. fp32 norms in a bf16 model, keeps them).
  std::optional<DType> weight_rounding() const { return weight_rounding_; }

  // Runs `tokens` at positions [cached_tokens(), cached_tokens() + T), appending their keys and
  // values to the cache; returns the logits [T, vocab].
  Matrix forward(std::span<const int64_t> tokens, const ForwardHooks& hooks = {});
  // An image-text model's prompt with images on a fresh sequence, as transformers'
  // Qwen3VLModel.forward runs it (docs/research/qwen3_next_and_qwen3_vl.md §6):
  //   embed      the token embeddings with the image placeholders' rows replaced, in order, by
  //              images.embeds (masked_scatter); "embed" records the result
  //   rotary     mrope_positions over the prompt (mrope.h), each frequency rotated by its row's
  //              position (Rope::apply_mrope); the causal mask stays by sequence index
  //   deepstack  after decoder layer k < images.deepstack.size(), the image rows of the residual
  //              stream += deepstack[k]; layers.<k>.residual records the sum (what layer k + 1
  //              reads). Emulate mode rounds the stream before and after the add, as a bf16
  //              engine stores both.
  // Later forward() calls (decode) rotate at sequence index + mrope_delta() on all three rows.
  // Throws (named) when the cache is not empty, the model has no image input, or the features,
  // grids and placeholders disagree.
  Matrix forward_image_prompt(std::span<const int64_t> tokens, const ImageFeatures& images,
                              const ForwardHooks& hooks = {});
  // mrope_position_delta of the sequence so far: 1 + the largest rotary position − its length
  // (0 without images).
  int64_t mrope_delta() const { return mrope_delta_; }
  // forward_image_prompt in parts (the golden run, bisect's re-run): the checks, the embedding
  // ("embed" recorded), and one layer at sequence indices 0..T-1 with the prompt's rotary rows
  // and its deepstack feature after it.
  ImagePrompt prepare_image_prompt(std::span<const int64_t> tokens, ImageFeatures images) const;
  Matrix embed_image_prompt(std::span<const int64_t> tokens, const ImagePrompt& prompt,
                            const ForwardHooks& hooks = {}) const;
  Matrix forward_layer(int64_t layer, Matrix x, const ImagePrompt& prompt,
                       const ForwardHooks& hooks = {});
  int64_t cached_tokens() const { return cached_; }
  // Runs decoder layer `layer` alone on hidden states x [T, hidden] at `positions`, appending to
  // that layer's KV cache only: how bisect re-runs a suspect layer on the golden's inputs to tell
  // the layer's own error from what flowed into it.
  // A streaming model loads the layer first and keeps it until release_layer.
  Matrix forward_layer(int64_t layer, Matrix x, std::span<const int64_t> positions,
                       const ForwardHooks& hooks = {});
  // forward() in parts, for a caller that runs many sequences one layer at a time (the golden
  // run): embed_tokens (the "embed" point), forward_layer per layer, head ("final_norm",
  // "logits"). The same operations in the same order as forward(), hence the same bits.
  Matrix embed_tokens(std::span<const int64_t> tokens, const ForwardHooks& hooks = {}) const;
  Matrix head(const Matrix& x, const ForwardHooks& hooks = {}) const;
  void reset_cache();
  void reset_layer_cache(int64_t layer);
  // Emulate mode: x rounded to the run dtype, as a stored activation (exact mode: unchanged).
  // What an emulated collective (tensor_parallel_emulation.h) rounds its partial sums with.
  void round_activation(Matrix& x) const { round_stored(x); }

  // --- candidates for measuring the judge (deviation.h; never a golden) ---
  // From now on the model computes with `d`. exact-arithmetic needs a model loaded in exact
  // mode, fp32-activations one with run dtype F32; the other legitimate choices need emulate
  // mode. Throws (named) otherwise, or for a layer the model lacks.
  void set_deviation(Deviation d);
  const Deviation& deviation() const { return deviation_; }
  // How many times the deviation changed an op since set_deviation: 0 means it never applied to
  // this model (no MoE layer, no q/k norm, equal attention scales, ...).
  int64_t deviation_hits() const { return *deviation_hits_; }

  // --- streaming ---
  // From now on decoder layers are loaded from `source` on demand and freed after use: forward()
  // loads each layer, runs it and frees it again; acquire_layer / release_layer let a caller
  // keep one loaded across several calls. Every layer starts released.
  void stream_layers_from(std::unique_ptr<LayerWeightSource> source);
  bool streams_layers() const { return source_ != nullptr; }
  void acquire_layer(int64_t layer);  // no-op when not streaming or already loaded
  void release_layer(int64_t layer);  // no-op when not streaming

  // --- for the loader ---
  std::vector<DecoderLayer>& layers() { return layers_; }
  const std::vector<DecoderLayer>& layers() const { return layers_; }
  void set_embedding(TensorView table) { embed_ = std::move(table); }
  NormWeights& final_norm() { return final_norm_; }
  std::unique_ptr<LinearMethod>& lm_head() { return lm_head_; }
  // Keeps the memory-mapped checkpoint alive (the embedding table points into it).
  void hold(std::shared_ptr<const Checkpoint> ckpt) { ckpt_ = std::move(ckpt); }

 private:
  // A run's token positions.
  struct Positions {
    std::vector<int64_t> seq;             // index in the sequence: the causal mask
    std::vector<int64_t> rotary;          // the 1-D rotary position (unused with mrope)
    std::optional<MropePositions> mrope;  // an image prompt's three rotary rows
  };
  // Rows of the residual stream a layer adds to after its own residual add (deepstack).
  struct Injection {
    const std::vector<int64_t>* rows = nullptr;
    const Matrix* values = nullptr;  // [rows, hidden]
  };
  Matrix embed(std::span<const int64_t> tokens) const;
  DecoderLayer& layer_at(int64_t layer, const char* where);
  Matrix run_layer(DecoderLayer& l, Matrix x, const Positions& pos, const ForwardHooks& hooks,
                   const Injection* inject = nullptr);
  static Positions image_prompt_positions(const ImagePrompt& prompt);
  // Runs every layer (streaming each in and out) and the head; advances the cache.
  Matrix run_layers(Matrix x, const Positions& pos, const ForwardHooks& hooks,
                    std::span<const Injection> injections = {});
  void observe_codes(const LinearMethod& m, const std::string& name, const Matrix& x,
                     const ForwardHooks& hooks, int64_t expert = 0) const;
  // input_norm_of: the decoder layer whose input norm this is (-1: another norm).
  Matrix norm(const Matrix& x, const NormWeights& w, int64_t input_norm_of = -1) const;
  // Whether the deviation is `k` and, for a layer-scoped kind, changes `layer`; hit() counts an
  // applied change.
  bool deviates(DeviationKind k, int64_t layer = -1) const;
  void hit() const { ++*deviation_hits_; }
  Arith stored_arith() const;
  // m.apply(x); under a deviation, rows with a NaN / Inf input give NaN output rows (as a GEMM
  // passes them on) and the finite rows run as usual (the method refuses non-finite inputs).
  Matrix apply_linear(const LinearMethod& m, const Matrix& x, int64_t expert = 0) const;
  // A dense linear: the method's apply, or a deviation's accumulation.
  Matrix dense_linear(const LinearMethod& m, const Matrix& x, int64_t layer, bool o_proj) const;
  // silu(gate) * up of a dense MLP (or a deviation's).
  Matrix mlp_activation(const Matrix& gate_up, int64_t layer) const;
  void rotate(Matrix& x, int64_t heads, const Positions& pos, int64_t layer) const;
  // The residual stream after an add: stored (emulate), in fp32 under residual-fp32.
  void round_residual(Matrix& x) const;
  // Emulate mode: rounds x to the model dtype (or fp32) as an engine stores it; exact: no-op.
  void round_stored(Matrix& x, bool fp32 = false) const;
  // round_stored, then records x at capture point `name`.
  void store(const std::string& name, Matrix& x, const ForwardHooks& h, bool fp32 = false) const;
  Matrix attention(DecoderLayer& l, const Matrix& h, const Positions& pos,
                   const ForwardHooks& hooks);
  Matrix moe(const MoeBlock& m, int64_t layer, const Matrix& h, const ForwardHooks& hooks);
  Matrix linear_attention(DecoderLayer& l, const Matrix& h, const ForwardHooks& hooks);

  ModelConfig cfg_;
  QuantPlan plan_;
  Dialect dialect_;
  PrecisionMode mode_;
  DType model_dtype_;
  DType run_dtype_;
  std::optional<DType> weight_rounding_;
  Rope rope_;
  Deviation deviation_;
  std::optional<Rope> deviant_rope_;  // rotary-base-off
  std::unique_ptr<std::atomic<int64_t>> deviation_hits_ = std::make_unique<std::atomic<int64_t>>(0);
  std::shared_ptr<const Checkpoint> ckpt_;
  TensorView embed_;
  std::vector<DecoderLayer> layers_;
  NormWeights final_norm_;
  std::unique_ptr<LinearMethod> lm_head_;
  int64_t cached_ = 0;
  int64_t mrope_delta_ = 0;
  std::vector<int> mrope_rows_;  // M-RoPE: the row each rotary frequency reads (mrope_section)
  std::unique_ptr<LayerWeightSource> source_;
  std::vector<bool> loaded_;  // streaming: which layers hold their weights now
};

}  // namespace qparity::reference
