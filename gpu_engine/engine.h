#pragma once
// The GPU engine's forward pass over a paged KV cache. One forward takes any mix of tokens from
// any sequences (a prefill chunk, decode steps of many sequences, both): token i belongs to
// sequence slot slots[i] at position positions[i] and attends to that slot's positions
// 0..positions[i] (its own K/V written first). So prefill, decode and continuous batching are all
// the same call; sequences come and go by slot (cache().release(slot)).
//
// Precision: bf16 activations and weights; every linear is a GEMM with fp32 accumulation rounded
// once to bf16 (router logits and logits kept in fp32): for up to kSkinnyMaxM tokens the skinny
// GEMM (skinny_gemm.h, with the RMSNorm before it and the SiLU-and-mul after it fused in; MoE
// experts as grouped skinny launches), for more tokens cuBLASLt. Attention: for up to
// kSkinnyMaxM tokens one decode_attention launch a layer (q/k norm, RoPE and the cache write
// fused in), for more attention_prologue then query-tiled or per-token paged attention. Norms,
// RoPE, SiLU-and-mul, attention and the MoE combine compute in fp32 (RoPE in fp64) and round
// once, the reference's emulate-mode rule: each capture point is one bf16 rounding of the exact
// value of its bf16 inputs, up to fp32 arithmetic. Deterministic: the same batch gives
// bit-identical results run to run. Batches of up to kSkinnyMaxM tokens are also batch-invariant
// bit for bit (a token's sums run in the same order alone or batched); across that threshold the
// GEMM and the attention kernels change their summation order, and results agree within the bf16
// policy. Decode-sized forwards also fuse the greedy argmax into the lm_head GEMM (greedy() then
// reads it from the host, no launch).
//
// Capture: with a reference::Trace, every capture point it wants (ARCHITECTURE.md's names, plus
// layers.i.moe.expert_out) is copied to the host as doubles, in execution order: dumps in the
// golden schema come from the same forward that serves.
#include <cuda_runtime_api.h>

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "gpu_engine/gpu_model.h"
#include "gpu_engine/kernels/gemm.h"
#include "gpu_engine/kernels/skinny_gemm.h"
#include "gpu_engine/kv_cache.h"

namespace qparity::reference {
class Trace;
}

namespace qparity::gpu {

struct EngineOptions {
  int64_t max_tokens = 2048;  // tokens per forward (longer prefills go in chunks)
  int64_t max_seqs = 64;
  int64_t max_context = 4096;
  int64_t block_size = 16;
  // Timing studies only (bench_engine --ablate): leave these kernels out of every forward, to
  // measure what they cost inside a decode step. The results are then meaningless.
  // Keys per block of the decode attention (decode_attention.h), a multiple of 64.
  int64_t decode_attention_chunk = 64;
  bool ablate_attention = false, ablate_linears = false;
  // Decode-sized forwards stamp their main kernels' start, wait release and end (kernel_probe.h),
  // read back by timeline(): where a step's time goes inside its CUDA graph.
  bool kernel_timeline = false;
  // Decode-sized forwards stamp the decode attention's stages per block (decode_attention.h);
  // the last layer's are read with read_decode_attention_stages().
  bool attention_stages = false;
};

// One probed kernel of a decode-sized forward, times in microseconds from the forward's first
// probed start: its first block's start, its first block's release from pdl_wait() and its last
// block's end.
struct TimelineEntry {
  std::string kernel;
  double start_us = 0, release_us = 0, end_us = 0;
  // The last block's start and release (a block that exits without waiting stamps no release).
  double last_start_us = 0, last_release_us = 0;
};

struct Batch {
  std::vector<int32_t> tokens, slots, positions;  // one entry per token
  int64_t size() const { return static_cast<int64_t>(tokens.size()); }
};

class Engine {
 public:
  Engine(std::unique_ptr<GpuModel> model, const EngineOptions& options);
  ~Engine();
  Engine(const Engine&) = delete;
  Engine& operator=(const Engine&) = delete;

  const ModelConfig& config() const { return model_->cfg; }
  const GpuModel& model() const { return *model_; }
  PagedKvCache& cache() { return *cache_; }
  cudaStream_t stream() const { return stream_; }
  const EngineOptions& options() const { return options_; }

  // Validates the batch (token ids in the vocabulary, slots and positions in range: a
  // qparity::Error naming the token otherwise), reserves cache blocks, runs every layer. Returns
  // with the logits [T, V] (fp32) in logits() and the stream synchronized.
  void forward(const Batch& b, reference::Trace* capture = nullptr);
  // A decode step through a CUDA graph, one per batch size, captured on first use. MoE models:
  // up to kSkinnyMaxM tokens (experts grouped on the device); larger batches route through the
  // host and run eagerly. Same results as forward().
  void forward_graph(const Batch& b);
  // Replays the graph forward_graph() captured for batch size t, `times` times back to back with
  // no host work between (the same inputs: each replay recomputes the last step of that size, bit
  // for bit), then synchronizes. What a step costs on the device alone (bench_engine); throws if
  // no graph of that size was captured.
  void replay_graph(int64_t t, int64_t times);

  // One decoder layer on given inputs (input [T, H] row-major, e.g. a golden's embed or
  // layers.<i-1>.residual rows): captures that layer's points, its residual output included.
  // What bisect needs to tell a layer's own error from what flowed into it.
  void forward_layer(int64_t layer, const std::vector<double>& input, const Batch& b,
                     reference::Trace* capture);

  // Only the embedding of the batch's tokens (captures "embed").
  void forward_embed(const Batch& b, reference::Trace* capture);
  // The model's head on given inputs (the last layer's residual rows): final_norm and logits.
  void forward_final(const std::vector<double>& input, const Batch& b, reference::Trace* capture);

  // The last decode-sized forward's probed kernels in launch order (kernel_timeline on; else
  // empty). Synchronous.
  std::vector<TimelineEntry> timeline() const;

  const float* logits() const { return logits_.get(); }
  std::vector<float> logits_host(int64_t rows) const;
  // argmax of each of the last forward's first `rows` logit rows: read from the argmax fused
  // into the lm_head GEMM when the forward ran it (decode-sized batches; copied to the host
  // inside the forward, graph included), else the argmax kernel. Ties to the lowest id, -1 for
  // a row with a NaN, in both.
  std::vector<int32_t> greedy(int64_t rows);

 private:
  void prepare(const Batch& b);
  void upload_input(const std::vector<double>& input, const Batch& b, const char* what);
  void run(int64_t t, reference::Trace* capture);
  void run_layer(int64_t layer, int64_t t, reference::Trace* capture, bool pending_residual);
  void close_residual(int64_t t, reference::Trace* capture, const __nv_bfloat16* weight,
                      __nv_bfloat16* out, const float* bias = nullptr);
  // A linear on t tokens: the skinny GEMM for decode-sized batches, cuBLASLt otherwise.
  void linear(const __nv_bfloat16* in, const __nv_bfloat16* w, void* out, bool f32, int64_t t,
              int64_t n, int64_t k, unsigned long long* argmax_keys = nullptr,
              KernelProbe* probe = nullptr);
  // One decoder linear: its GPU method when quantized, else linear() on the bf16 weight w.
  // Activation-quantized methods: their codes are captured as <layer_name>.x_values / .x_scales.
  void project(const GpuLinearMethod* quantized, const __nv_bfloat16* w, const __nv_bfloat16* in,
               __nv_bfloat16* out, int64_t t, int64_t n, int64_t k, const char* label,
               reference::Trace* tr, const std::string& layer_name);
  // A decode-sized linear over the residual stream with its RMSNorm fused into the skinny GEMM's
  // prologue: x = resid(), normalized by norm_weight into h_ (the capture point); with `add`,
  // the residual add first, its sum into resid_next() (the caller then flips cur_).
  SkinnyGemmParams normed_linear(const __nv_bfloat16* add, const __nv_bfloat16* norm_weight,
                                 const __nv_bfloat16* w, void* y, int64_t t, int64_t n) const;
  // The probe for the next kernel of a decode-sized forward when kernel_timeline is on (null
  // otherwise), labelled `kernel`.
  KernelProbe* probe(const char* kernel);
  void attention(int64_t layer, int64_t t, reference::Trace* capture);
  void moe_layer(int64_t layer, int64_t t, reference::Trace* capture);
  void moe_experts_via_host(int64_t layer, int64_t t, cudaStream_t s);
  // Whether t tokens' MoE layers run on the device alone (grouping + grouped skinny GEMMs).
  bool moe_on_device(int64_t t) const;
  // Whether a forward of t tokens fuses the greedy argmax into its lm_head GEMM.
  bool fused_argmax(int64_t t) const {
    return skinny_gemm_fits(t, model_->cfg.hidden) && !options_.ablate_linears;
  }
  // After a synchronized forward: refuses its result if a router returned an id outside the
  // experts (NaN router logits), naming the first such layer.
  void check_moe_ids();

  std::unique_ptr<GpuModel> model_;
  EngineOptions options_;
  std::unique_ptr<PagedKvCache> cache_;
  std::unique_ptr<BlasLtGemm> gemm_;
  cudaStream_t stream_ = nullptr;
  // Activations, sized for max_tokens.
  // One upload per forward: [tokens | slots | positions | prefill tiles] of the batch, packed,
  // from pinned memory (a second upload: decode-sized batches' per-token block-table rows).
  DeviceBuffer<int32_t> inputs_, next_ids_;
  int32_t* pinned_inputs_ = nullptr;
  const int32_t* tokens_dev(int64_t) const { return inputs_.get(); }
  const int32_t* slots_dev(int64_t t) const { return inputs_.get() + t; }
  const int32_t* positions_dev(int64_t t) const { return inputs_.get() + 2 * t; }
  const int32_t* tiles_dev(int64_t t) const { return inputs_.get() + 3 * t; }
  // Decode-sized batches: token i's block-table row at token_tables_offset() + i *
  // max_blocks_per_seq (a fixed offset: graphs capture the pointer).
  int64_t token_tables_offset() const { return 5 * options_.max_tokens + 1; }
  // This batch's attention: query-tiled (a sequence with several rows) or per token; and how
  // many tiles its grid covers.
  bool tiled_attention_ = false;
  int64_t attention_tiles_ = 0;
  // The residual stream lives in two buffers: a fused norm+GEMM reads one and writes the updated
  // stream to the other (its other blocks still read the first). prepare() resets to buffer 0,
  // so a captured graph and its replays agree on which is which.
  Bf16Buffer residual_[2];
  int cur_ = 0;
  __nv_bfloat16* resid() const { return residual_[cur_].get(); }
  __nv_bfloat16* resid_next() const { return residual_[1 - cur_].get(); }
  Bf16Buffer h_, qkv_, qk_normed_, core_, attn_out_, gate_up_, act_, mlp_out_;
  DeviceBuffer<float> logits_;
  // The lm_head's fused argmax (skinny path): keys on the device, copied to pinned memory inside
  // the forward; keys_rows_ > 0 when the last forward produced them.
  DeviceBuffer<unsigned long long> argmax_keys_;
  unsigned long long* pinned_keys_ = nullptr;
  int64_t keys_rows_ = 0;
  // Attention split into key chunks for decode-sized batches, and its scratch; attn_whole_: one
  // chunk covering max_context, for larger batches.
  int64_t attn_chunk_ = 64, attn_max_chunks_ = 1, attn_whole_ = 128;
  Bf16Buffer qk_roped_;  // decode attention's rope_q / rope_k capture, [kSkinnyMaxM, q + kv]
  DeviceBuffer<float> attn_partial_acc_, attn_partial_ml_;
  DeviceBuffer<uint32_t> attn_chunks_done_;
  // MoE scratch.
  DeviceBuffer<float> router_logits_, topk_weights_;
  DeviceBuffer<int32_t> topk_ids_, moe_rows_, moe_dest_, moe_first_, moe_active_, moe_bad_;
  Bf16Buffer moe_x_, moe_gate_up_, moe_act_, moe_y_, moe_slots_;
  // The workspace every quantized linear method borrows (activation codes), sized for the
  // largest method at max_tokens.
  DeviceBuffer<uint8_t> quant_workspace_;
  std::map<int64_t, cudaGraphExec_t> graphs_;
  // kernel_timeline: one probe per probed launch of a decode-sized forward, their labels per
  // batch size (a graph replays the labels of its capture), and the last probed size.
  DeviceBuffer<KernelProbe> probes_;
  std::map<int64_t, std::vector<std::string>> probe_labels_;
  std::vector<std::string>* labelling_ = nullptr;  // inside run() of a probed forward
  int64_t probed_t_ = 0;
  bool any_moe_ = false;
  int64_t last_layer_ = 0;  // the layer whose MLP output is pending (close_residual names it)
};

}  // namespace qparity::gpu
