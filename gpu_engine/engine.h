#pragma once
// The GPU engine's runner: batching over a paged KV cache, CUDA graphs, sampling; what a forward
// computes is the decoder composition's (decoder.h). One forward takes any mix of tokens from
// any sequences (a prefill chunk, decode steps of many sequences, both): token i belongs to
// sequence slot slots[i] at position positions[i] and attends to that slot's positions
// 0..positions[i] (its own K/V written first). So prefill, decode and continuous batching are all
// the same call; sequences come and go by slot (release(slot)).
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
// Tensor parallelism (tensor_parallel.h load_tp_engine): one process drives tp ranks, this
// engine as rank 0 on device 0 and a peer Engine per further rank on its own device, each from
// its own host thread (rank_worker.h). Every call below runs on every rank at once (each rank
// its shard of the model and its own KV cache, the collectives of decoder.h between them) and
// returns when all have finished; logits, greedy ids and the timeline are rank 0's (its logits
// are gathered whole). A Trace receives the whole-model points gathered from the ranks'
// (core/parallel/tp_gather.h); points with no whole-model counterpart are listed in
// tp_absent_points().
//
// Recurrent layers (Qwen3.5's Gated DeltaNet) keep a per-slot state in the cache instead of keys
// and values: a slot's tokens must then arrive in order (kv_cache.h). Image prompts come with the
// reference's vision features and M-RoPE rows (Batch), and run eagerly.
//
// Capture: with a Trace, every capture point it wants (ARCHITECTURE.md's names, plus
// layers.i.moe.expert_out) is copied to the host as doubles, in execution order: dumps in the
// golden schema come from the same forward that serves.
#include <cuda_runtime_api.h>

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "gpu_engine/decoder.h"
#include "gpu_engine/engine_options.h"
#include "gpu_engine/gpu_model.h"
#include "gpu_engine/kernel_timeline.h"
#include "gpu_engine/kv_cache.h"
#include "gpu_engine/rank_worker.h"
#include "gpu_engine/tp_comm.h"

namespace qparity {
class Trace;
}

namespace qparity::gpu {

struct Batch {
  std::vector<int32_t> tokens, slots, positions;  // one entry per token
  // Image prompts (image-text models: Qwen3-VL, Qwen3.5's image-text class). The engine has no
  // vision tower: the reference computes what it feeds in (reference_cpu/models/causal_lm.h
  // ImagePrompt). rope_rows [3 * t]: the M-RoPE rows (time, then height, then width) the
  // attention rotates by (empty: the positions; a decode after an image prompt gives position +
  // mrope_position_delta on all three). image_rows: the batch rows (ascending) whose embedding is
  // a vision feature, image_embeds [image_rows, hidden] those features, deepstack[k]
  // [image_rows, hidden] the feature added to those rows after layer k.
  std::vector<int32_t> rope_rows, image_rows;
  std::vector<double> image_embeds;
  std::vector<std::vector<double>> deepstack;
  int64_t size() const { return static_cast<int64_t>(tokens.size()); }
  bool has_images() const { return !rope_rows.empty() || !image_rows.empty(); }
};

class Engine {
 public:
  // `comm`: this rank's communicator when `model` is a tensor-parallel shard (else null).
  Engine(std::unique_ptr<GpuModel> model, const EngineOptions& options, TpComm* comm = nullptr);
  ~Engine();
  Engine(const Engine&) = delete;
  Engine& operator=(const Engine&) = delete;

  // Makes this engine (rank 0 of comms.size()) drive `peers` (ranks 1.., each built on its own
  // device with comms[rank]); it then owns them and every communicator.
  void attach_peers(std::vector<std::unique_ptr<Engine>> peers,
                    std::vector<std::unique_ptr<TpComm>> comms);
  int tp() const { return model_->tp; }
  // Points a tensor-parallel Trace could not hold whole, with the reason (tp_gather.h), over
  // every forward so far.
  struct AbsentPoint {
    std::string name, reason;
  };
  const std::vector<AbsentPoint>& tp_absent_points() const { return tp_absent_; }
  // Frees a sequence slot's cache blocks on every rank.
  void release(int32_t slot);

  // The checkpoint's config (the whole model's, under tensor parallelism too).
  const ModelConfig& config() const { return model_->whole(); }
  const GpuModel& model() const { return *model_; }
  PagedKvCache& cache() { return *cache_; }
  cudaStream_t stream() const { return stream_; }
  const EngineOptions& options() const { return options_; }

  // Validates the batch (token ids in the vocabulary, slots and positions in range: a
  // qparity::Error naming the token otherwise), reserves cache blocks, runs every layer. Returns
  // with the logits [T, V] (fp32) in logits() and the stream synchronized.
  void forward(const Batch& b, Trace* capture = nullptr);
  // A decode step through a CUDA graph, one per batch size, captured on first use. MoE models:
  // up to kSkinnyMaxM tokens (experts grouped on the device); larger batches route through the
  // host and run eagerly. Same results as forward().
  void forward_graph(const Batch& b);
  // Replays the graph forward_graph() captured for batch size t, `times` times back to back with
  // no host work between (the same inputs: each replay recomputes the last step of that size, bit
  // for bit; a recurrent model's slots take the tokens again, so each must then restart at 0),
  // then synchronizes. What a step costs on the device alone (bench_engine); throws if
  // no graph of that size was captured.
  void replay_graph(int64_t t, int64_t times);

  // One decoder layer on given inputs (input [T, H] row-major, e.g. a golden's embed or
  // layers.<i-1>.residual rows): captures that layer's points, its residual output included.
  // What bisect needs to tell a layer's own error from what flowed into it.
  void forward_layer(int64_t layer, const std::vector<double>& input, const Batch& b,
                     Trace* capture);

  // Only the embedding of the batch's tokens (captures "embed").
  void forward_embed(const Batch& b, Trace* capture);
  // The model's head on given inputs (the last layer's residual rows): final_norm and logits.
  void forward_final(const std::vector<double>& input, const Batch& b, Trace* capture);

  // The last decode-sized forward's probed kernels in launch order (kernel_timeline on; else
  // empty). Synchronous.
  std::vector<TimelineEntry> timeline() const { return timeline_.read(stream_); }

  const float* logits() const { return decoder_->logits(); }
  // Whether a batch of t tokens runs its MoE layers on the device alone (CUDA-graph capturable;
  // quantized experts in grouped launches); false for a dense model.
  bool moe_on_device(int64_t t) const { return decoder_->any_moe() && decoder_->moe_on_device(t); }
  std::vector<float> logits_host(int64_t rows) const;
  // argmax of each of the last forward's first `rows` logit rows: read from the argmax fused
  // into the lm_head GEMM when the forward ran it (decode-sized batches; copied to the host
  // inside the forward, graph included), else the argmax kernel. Ties to the lowest id, -1 for
  // a row with a NaN, in both.
  std::vector<int32_t> greedy(int64_t rows);

 private:
  // Checks the batch, reserves its cache blocks, uploads it, and hands it to the decoder.
  // advances_state: a whole forward (the slots' recurrent states take the batch's tokens); a layer,
  // the embedding or the head alone checks the batch but moves no slot's state forward.
  void prepare(const Batch& b, bool advances_state = true);
  // The prepared batch as the decoder reads it (device pointers into inputs_).
  StepInputs step_inputs(int64_t t) const;
  void upload_input(const std::vector<double>& input, const Batch& b, const char* what);
  // The decoder's whole forward, probed when decode-sized and kernel_timeline is on.
  void run(int64_t t, Trace* capture);
  // The public calls' work on this rank alone.
  void forward_rank(const Batch& b, Trace* capture);
  void forward_graph_rank(const Batch& b);
  void replay_graph_rank(int64_t t, int64_t times);
  void forward_layer_rank(int64_t layer, const std::vector<double>& input, const Batch& b,
                          Trace* capture);
  void forward_embed_rank(const Batch& b, Trace* capture);
  void forward_final_rank(const std::vector<double>& input, const Batch& b, Trace* capture);
  // Runs f on every rank at once (rank 0 on this thread), then gathers the ranks' traces into
  // `capture`; rethrows the lowest rank's error.
  void on_ranks(Trace* capture, const std::function<void(Engine&, Trace*)>& f);

  std::unique_ptr<GpuModel> model_;
  EngineOptions options_;
  std::unique_ptr<PagedKvCache> cache_;
  cudaStream_t stream_ = nullptr;
  KernelTimeline timeline_;
  std::unique_ptr<Decoder> decoder_;
  // One upload per forward: [tokens | slots | positions | prefill tiles] of the batch, packed,
  // from pinned memory (a second upload: decode-sized batches' per-token block-table rows).
  DeviceBuffer<int32_t> inputs_, next_ids_;
  int32_t* pinned_inputs_ = nullptr;
  // Decode-sized batches: token i's block-table row at token_tables_offset() + i *
  // max_blocks_per_seq (a fixed offset: graphs capture the pointer).
  int64_t token_tables_offset() const { return 5 * options_.max_tokens + 1; }
  // Recurrent (Gated DeltaNet) models: the batch's runs [count, first row, rows, ...] after the
  // token tables (kernels/gated_delta_net.h).
  int64_t runs_offset() const {
    return token_tables_offset() + kSkinnyMaxM * cache_->shape().max_blocks_per_seq;
  }
  // An image batch's rotary rows and features, checked and uploaded (image_ints_, image_feats_);
  // what step_inputs() then points the decoder at.
  void prepare_images(const Batch& b);
  DeviceBuffer<int32_t> image_ints_;         // [3 t mrope | t rope positions | image rows]
  DeviceBuffer<__nv_bfloat16> image_feats_;  // [(1 + taps) * image rows, hidden]
  bool mrope_ = false, rope_shift_ = false;  // rows differ per frequency / equal but shifted
  int64_t image_count_ = 0, deepstack_taps_ = 0;
  // Checks a recurrent model's batch (each slot's tokens consecutive rows at consecutive
  // positions, continuing its state) and returns its runs; empty for other models.
  std::vector<int32_t> recurrent_runs(const Batch& b) const;
  // The last prepared batch: query-tiled attention (a sequence with several rows), and how many
  // tiles its grid covers.
  bool tiled_attention_ = false;
  int64_t attention_tiles_ = 0;
  std::map<int64_t, cudaGraphExec_t> graphs_;
  // Tensor parallelism (rank 0 only): the communicators, the other ranks and their threads.
  int device_ = 0;
  std::vector<std::unique_ptr<TpComm>> comms_;
  std::vector<std::unique_ptr<Engine>> peers_;
  std::vector<std::unique_ptr<RankWorker>> workers_;
  std::vector<AbsentPoint> tp_absent_;
};

}  // namespace qparity::gpu
