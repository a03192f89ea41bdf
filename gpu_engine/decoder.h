#pragma once
// The decoder composition of the GPU engine: what one forward computes, over the runner's batch
// (engine.h: batching, the paged cache, graphs, sampling). Like the reference's models/, one
// composition of shared blocks that differ by flags (Qwen3's q/k norm, MoE layers):
//   embed -> per layer [input_norm -> attention block (decoder_attention.cpp: qkv, q/k norm,
//   RoPE, cache write, softmax(QK^T)V, o_proj) -> residual add -> post_attention_norm -> MLP
//   block (gate_up, SiLU-and-mul, down) or MoE block (decoder_moe.cpp)] -> final norm -> lm_head.
// Qwen3.5: a linear_attention layer's token mixer is the Gated DeltaNet block
// (decoder_linear_attention.cpp, its state in the cache's slot); full attention multiplies its
// output by sigmoid(gate) before o_proj; the norms add 1 to their weights (zero-centred).
// Image prompts (engine.h Batch): the placeholders' embeddings replaced by vision features, M-RoPE
// rows in attention, and after layers 0..k-1 the stream closed and deepstack features added.
// Each linear is the layer's GpuLinearMethod when the plan quantizes it, else a bf16 GEMM (the
// skinny GEMM with its norm fused in for decode-sized batches, cuBLASLt otherwise). Precision,
// determinism and batch invariance: engine.h.
//
// Tensor parallelism (a TpComm given): the model is one rank's shard (gpu_model.h), and the
// composition adds the collectives Megatron's layout needs: the vocab-parallel embedding's rows
// and the row-parallel o_proj / down / MoE combine outputs (bf16 partials) are all-gathered and
// summed in rank order in fp32 with one rounding (kernels/rank_sum.h: vLLM's one-shot all-reduce
// arithmetic, the same bits on every rank and for any rank count) before they join the residual
// stream; the vocab-parallel lm_head's logits are all-gathered into the whole vocabulary
// (padding rows dropped). Every rank then holds the same residual stream and logits. The fused
// argmax stays off (a rank sees a slice of the vocabulary).
//
// Shapes: buffers and kernels use the model's kernel shapes (GpuModel::kcfg(): head_dim and the
// intermediate sizes zero-padded where a kernel needs it, shape_padding.h); captures pick the
// logical columns out, so every capture point has the model's own shape.
#include <cuda_bf16.h>
#include <cuda_runtime_api.h>

#include <cstdint>
#include <memory>
#include <string>

#include "gpu_engine/capture.h"
#include "gpu_engine/engine_options.h"
#include "gpu_engine/gpu_model.h"
#include "gpu_engine/kernel_timeline.h"
#include "gpu_engine/kernels/gemm.h"
#include "gpu_engine/kernels/skinny_gemm.h"
#include "gpu_engine/kv_cache.h"
#include "gpu_engine/quant/grouped_experts.h"
#include "gpu_engine/tp_comm.h"

namespace qparity::gpu {

// The batch of one forward as the runner uploaded it (device pointers, t entries each).
struct StepInputs {
  int64_t t = 0;
  const int32_t* tokens = nullptr;
  const int32_t* slots = nullptr;
  const int32_t* positions = nullptr;
  // Query tiles of the prefill attention (count, then first row and rows per tile).
  const int32_t* tiles = nullptr;
  // Decode-sized batches: token i's block-table row at token_tables + i * max_blocks_per_seq.
  const int32_t* token_tables = nullptr;
  // Recurrent models: [count, first row, rows, ...] per sequence (engine.h recurrent_runs).
  const int32_t* runs = nullptr;
  // Image prompts (engine.h Batch): M-RoPE rows [3, t] where they differ per frequency (the
  // attention then takes the prologue path at any size), else shifted 1-D rotary positions [t];
  // the rows taking vision features, the features [image_count, hidden] and the deepstack
  // features [taps, image_count, hidden] (bf16).
  const int32_t* mrope = nullptr;
  const int32_t* rope_positions = nullptr;
  const int32_t* image_rows = nullptr;
  const __nv_bfloat16* image_embeds = nullptr;
  const __nv_bfloat16* deepstack = nullptr;
  int64_t image_count = 0, deepstack_taps = 0;
  bool tiled_attention = false;  // a sequence with several rows: the query-tiled kernel
  int64_t attention_tiles = 0;
};

class Decoder {
 public:
  Decoder(const GpuModel& model, PagedKvCache& cache, const EngineOptions& options,
          cudaStream_t stream, KernelTimeline& timeline, TpComm* comm = nullptr);
  ~Decoder();
  Decoder(const Decoder&) = delete;
  Decoder& operator=(const Decoder&) = delete;

  // The next forward runs on `in`: resets the residual double buffer (so a captured graph and
  // its replays agree on which buffer is which) and the MoE id check.
  void begin(const StepInputs& in);
  // The whole model: embed, every layer, final norm, lm_head (logits() [t, V] fp32).
  void forward(Trace* capture);
  // Layer `layer` alone on the hidden states in residual(), then its residual output.
  void forward_layer(int64_t layer, Trace* capture);
  void forward_embed(Trace* capture);
  // final_norm and lm_head on the hidden states in residual().
  void forward_final(Trace* capture);
  // Where forward_layer / forward_final read their input ([t, hidden] bf16).
  __nv_bfloat16* residual() const { return resid(); }

  // [t, whole vocabulary] fp32 (all-gathered under tensor parallelism).
  const float* logits() const { return logits_.get(); }
  // Whether a forward of t tokens fuses the greedy argmax into its lm_head GEMM.
  bool fused_argmax(int64_t t) const {
    return skinny_gemm_fits(t, model_.kcfg().hidden) && !options_.ablate_linears && !comm_ &&
           model_.norm_offset() == 0.f;  // (zero-centred norms: the final norm runs on its own)
  }
  // The fused argmax's keys of the last forward, on the host (argmax_rows() of them; 0 when the
  // last forward did not fuse it). A replayed graph copies them too: graph_replayed(t) says so.
  int64_t argmax_rows() const { return keys_rows_; }
  const unsigned long long* argmax_keys() const { return pinned_keys_; }
  void graph_replayed(int64_t t) { keys_rows_ = fused_argmax(t) ? t : 0; }

  bool any_moe() const { return any_moe_; }
  // Whether t tokens' MoE layers run on the device alone (grouping, then grouped skinny GEMMs or
  // the quantized experts' grouped launches), so the forward can be a CUDA graph.
  bool moe_on_device(int64_t t) const;
  // Quantized experts run grouped on the device up to this many tokens (decode batches).
  static constexpr int64_t kGroupedExpertsMaxTokens = 64;
  // After a synchronized forward: refuses its result if a router returned an id outside the
  // experts (NaN router logits), naming the first such layer.
  void check_moe_ids() const;

 private:
  void run_layer(int64_t layer, Trace* capture, bool pending_residual);
  // Whether layer l's residual output takes a deepstack feature (image prompts).
  bool injects_after(int64_t l) const { return in_.image_count > 0 && l < in_.deepstack_taps; }
  // Closes layer l's pending MLP output into the residual stream, adds its deepstack feature to
  // the image rows and captures layers.<l>.residual (the sum, what layer l + 1 reads).
  void inject_deepstack(int64_t l, Trace* capture);
  // final_norm on the closed stream in residual() into h_ (captures final_norm).
  void final_norm(Trace* capture);
  void close_residual(Trace* capture, const __nv_bfloat16* weight, __nv_bfloat16* out,
                      const float* bias = nullptr);
  // A linear on t tokens: the skinny GEMM for decode-sized batches, cuBLASLt otherwise.
  void linear(const __nv_bfloat16* in, const __nv_bfloat16* w, void* out, bool f32, int64_t t,
              int64_t n, int64_t k, unsigned long long* argmax_keys = nullptr,
              KernelProbe* probe = nullptr);
  // One decoder linear: its GPU method when quantized, else linear() on the bf16 weight w.
  // Activation-quantized methods: their codes are captured as <layer_name>.x_values / .x_scales.
  void project(const GpuLinearMethod* quantized, const __nv_bfloat16* w, const __nv_bfloat16* in,
               __nv_bfloat16* out, int64_t n, int64_t k, const char* label, Trace* capture,
               const std::string& layer_name);
  // A decode-sized linear over the residual stream with its RMSNorm fused into the skinny GEMM's
  // prologue: x = resid(), normalized by norm_weight into h_ (the capture point); with `add`,
  // the residual add first, its sum into resid_next() (the caller then flips cur_).
  SkinnyGemmParams normed_linear(const __nv_bfloat16* add, const __nv_bfloat16* norm_weight,
                                 const __nv_bfloat16* w, void* y, int64_t n) const;
  // decoder_attention.cpp: q/k norm, RoPE, the cache write and softmax(QK^T)V into core_.
  void attention(int64_t layer, Trace* capture);
  // decoder_linear_attention.cpp: a Gated DeltaNet layer's token mixer on h_ into attn_out_.
  void linear_attention(int64_t layer, Trace* capture);
  // A quantized cache's attn.k_cache / v_cache points: the batch's rows read back from the cache.
  void capture_kv_cache(int64_t layer, Trace* capture);
  // decoder_moe.cpp
  void moe_layer(int64_t layer, Trace* capture);
  void moe_experts_via_host(int64_t layer);
  void moe_experts_grouped(int64_t layer);
  KernelProbe* probe(const char* kernel) { return timeline_.probe(kernel); }
  // Tensor parallelism: a row-parallel output's partial sums [t, hidden] completed in place.
  void reduce_partial(__nv_bfloat16* buf);
  // The embedding of the batch into resid() (vocab-parallel: the owner's rows, all-reduced).
  void embed(KernelProbe* kernel_probe);
  // lm_head on h_ into logits_ (vocab-parallel: the rank's slice, all-gathered).
  void head_logits(KernelProbe* kernel_probe);

  const GpuModel& model_;
  TpComm* comm_ = nullptr;
  PagedKvCache& cache_;
  EngineOptions options_;
  cudaStream_t stream_;
  KernelTimeline& timeline_;
  std::unique_ptr<BlasLtGemm> gemm_;
  StepInputs in_;
  // Logical columns of padded kernel layouts (empty where nothing is padded): the qkv row, the
  // q heads (q_norm, rope_q, core), the k heads (k_norm, rope_k), gate_up, act.
  ColumnMap qkv_cols_, q_cols_, k_cols_, core_cols_, v_cols_, gate_up_cols_, act_cols_;
  // The residual stream lives in two buffers: a fused norm+GEMM reads one and writes the updated
  // stream to the other (its other blocks still read the first). begin() resets to buffer 0.
  Bf16Buffer residual_[2];
  int cur_ = 0;
  __nv_bfloat16* resid() const { return residual_[cur_].get(); }
  __nv_bfloat16* resid_next() const { return residual_[1 - cur_].get(); }
  Bf16Buffer h_, qkv_, qk_normed_, core_, attn_out_, gate_up_, act_, mlp_out_;
  // Gated DeltaNet layers: the fused input projection [t, C + HV dv + 2 HV], the conv output,
  // the delta rule's output and the gated norm's; the gates (fp32); the per-token states when
  // a trace wants them (allocated then).
  Bf16Buffer lin_in_, lin_conv_, lin_core_, lin_normed_;
  DeviceBuffer<float> lin_beta_, lin_decay_, lin_states_;
  Bf16Buffer qkv_raw_;           // a gathered quantized qkv's own output (GpuModel::qkv_sources)
  DeviceBuffer<float> qkv_f32_;  // an unquantized biased qkv's fp32 sums [max_tokens, qkv]
  DeviceBuffer<float> logits_;
  // Tensor parallelism: the rank's logits [t, vocab shard] and the gathered [tp, t, shard].
  DeviceBuffer<float> logits_shard_, logits_gathered_;
  Bf16Buffer partials_;  // a row-parallel output's gathered partials, [tp, t, hidden]
  // The lm_head's fused argmax (skinny path): keys on the device, copied to pinned memory inside
  // the forward; keys_rows_ > 0 when the last forward produced them.
  DeviceBuffer<unsigned long long> argmax_keys_;
  unsigned long long* pinned_keys_ = nullptr;
  int64_t keys_rows_ = 0;
  // Attention split into key chunks for decode-sized batches, and its scratch; attn_whole_: one
  // chunk covering max_context, for larger batches.
  int64_t attn_chunk_ = 64, attn_max_chunks_ = 1, attn_whole_ = 128;
  Bf16Buffer qk_roped_;  // decode attention's rope_q / rope_k capture, [kSkinnyMaxM, q + kv]
  Bf16Buffer kv_read_;   // a quantized cache's read-back for its capture points, [2, tokens, kv]
  DeviceBuffer<float> attn_partial_acc_, attn_partial_ml_;
  DeviceBuffer<uint32_t> attn_chunks_done_;
  // MoE scratch.
  DeviceBuffer<float> router_logits_, topk_weights_;
  DeviceBuffer<int32_t> topk_ids_, moe_rows_, moe_dest_, moe_first_, moe_active_, moe_bad_;
  Bf16Buffer moe_x_, moe_gate_up_, moe_act_, moe_y_, moe_slots_;
  // The workspace every quantized linear method borrows (activation codes), sized for the
  // largest method at max_tokens.
  DeviceBuffer<uint8_t> quant_workspace_;
  bool any_moe_ = false;
  bool quantized_experts_ = false;  // some layer's experts run as GPU methods
  bool bf16_experts_ = false;       // some MoE layer's experts are bf16 stacks
  // Quantized experts as one grouped launch per stack (quant/grouped_experts.h), per layer (null
  // for dense layers); grouped_experts_ when every quantized stack has one. Otherwise (or past
  // kGroupedExpertsMaxTokens tokens) quantized experts take the host path.
  std::vector<std::unique_ptr<GroupedExperts>> w13_grouped_, w2_grouped_;
  bool grouped_experts_ = false;
  int64_t last_layer_ = 0;  // the layer whose MLP output is pending (close_residual names it)
};

}  // namespace qparity::gpu
