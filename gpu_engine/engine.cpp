#include "gpu_engine/engine.h"

#include <algorithm>
#include <cmath>
#include <cstring>

#include "core/codecs/float_format.h"
#include "core/error.h"
#include "gpu_engine/cuda_check.h"
#include "gpu_engine/kernels/activation.h"
#include "gpu_engine/kernels/attention_prologue.h"
#include "gpu_engine/kernels/decode_attention.h"
#include "gpu_engine/kernels/embedding.h"
#include "gpu_engine/kernels/moe_dispatch.h"
#include "gpu_engine/kernels/moe_routing.h"
#include "gpu_engine/kernels/paged_attention.h"
#include "gpu_engine/kernels/prefill_attention.h"
#include "gpu_engine/kernels/rms_norm.h"
#include "gpu_engine/kernels/sampling.h"
#include "gpu_engine/kernels/skinny_gemm.h"
#include "reference_cpu/models/trace.h"

namespace qparity::gpu {

namespace {

enum class Elem { kBf16, kF32, kI32, kI8, kE4m3 };

// Copies a [rows, cols] view (row stride `stride` elements) of a device tensor to the trace as
// doubles, when the trace wants that point. Synchronous: capture is for dumps, not serving.
void capture(reference::Trace* trace, const std::string& name, const void* dev, Elem e,
             int64_t rows, int64_t cols, int64_t stride, cudaStream_t stream) {
  if (!trace || !trace->wants(name)) return;
  const size_t es = e == Elem::kBf16 ? 2 : (e == Elem::kI8 || e == Elem::kE4m3) ? 1 : 4;
  std::vector<uint8_t> host(static_cast<size_t>(rows * cols) * es);
  QPARITY_CUDA_CHECK(cudaMemcpy2DAsync(
      host.data(), static_cast<size_t>(cols) * es, dev, static_cast<size_t>(stride) * es,
      static_cast<size_t>(cols) * es, static_cast<size_t>(rows), cudaMemcpyDeviceToHost, stream));
  QPARITY_CUDA_CHECK(cudaStreamSynchronize(stream));
  reference::Matrix m(rows, cols);
  for (size_t i = 0; i < m.data.size(); ++i) {
    if (e == Elem::kBf16) {
      __nv_bfloat16 b;
      std::memcpy(&b, host.data() + 2 * i, 2);
      m.data[i] = static_cast<double>(__bfloat162float(b));
    } else if (e == Elem::kI8) {
      m.data[i] = static_cast<int8_t>(host[i]);
    } else if (e == Elem::kE4m3) {
      m.data[i] = codec::e4m3fn_to_double(host[i]);
    } else if (e == Elem::kF32) {
      float f;
      std::memcpy(&f, host.data() + 4 * i, 4);
      m.data[i] = f;
    } else {
      int32_t v;
      std::memcpy(&v, host.data() + 4 * i, 4);
      m.data[i] = v;
    }
  }
  trace->record(name, m);
}

std::string lp(int64_t layer) {
  return "layers." + std::to_string(layer);
}

}  // namespace

Engine::Engine(std::unique_ptr<GpuModel> model, const EngineOptions& o)
    : model_(std::move(model)), options_(o) {
  const ModelConfig& c = model_->cfg;
  if (o.max_tokens <= 0 || o.max_seqs <= 0 || o.max_context <= 0 || o.block_size <= 0)
    throw Error("engine", "max_tokens, max_seqs, max_context and block_size must be > 0");
  QPARITY_CUDA_CHECK(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking));
  KvCacheShape ks;
  ks.block_size = o.block_size;
  ks.max_seqs = o.max_seqs;
  ks.max_blocks_per_seq = (o.max_context + o.block_size - 1) / o.block_size;
  ks.num_blocks = ks.max_seqs * ks.max_blocks_per_seq;
  cache_ = std::make_unique<PagedKvCache>(c, ks);
  gemm_ = std::make_unique<BlasLtGemm>();
  const size_t t = static_cast<size_t>(o.max_tokens), h = static_cast<size_t>(c.hidden);
  const size_t qkv = static_cast<size_t>(c.q_size() + 2 * c.kv_size());
  // [tokens | slots | positions | prefill tiles (count, then first row and rows per tile)]
  // ... then, at a fixed offset, decode-sized batches' per-token block-table rows.
  const size_t input_ints =
      5 * t + 1 + static_cast<size_t>(kSkinnyMaxM * cache_->shape().max_blocks_per_seq);
  inputs_ = DeviceBuffer<int32_t>(input_ints);
  QPARITY_CUDA_CHECK(
      cudaMallocHost(reinterpret_cast<void**>(&pinned_inputs_), input_ints * sizeof(int32_t)));
  next_ids_ = DeviceBuffer<int32_t>(t);
  residual_[0] = Bf16Buffer(t * h);
  residual_[1] = Bf16Buffer(t * h);
  h_ = Bf16Buffer(t * h);
  qkv_ = Bf16Buffer(t * qkv);
  qk_normed_ = Bf16Buffer(t * static_cast<size_t>(c.q_size() + c.kv_size()));
  core_ = Bf16Buffer(t * static_cast<size_t>(c.q_size()));
  attn_out_ = Bf16Buffer(t * h);
  size_t ws = 0;
  for (const GpuLayerWeights& l : model_->layers)
    for (const GpuLinearMethod* m :
         {l.qkv_q.get(), l.o_proj_q.get(), l.gate_up_q.get(), l.down_q.get()})
      if (m) ws = std::max(ws, m->workspace_bytes(o.max_tokens));
  quant_workspace_ = DeviceBuffer<uint8_t>(ws);
  mlp_out_ = Bf16Buffer(t * h);
  const size_t inter = static_cast<size_t>(std::max<int64_t>(c.intermediate, 0));
  gate_up_ = Bf16Buffer(t * 2 * std::max<size_t>(inter, 1));
  act_ = Bf16Buffer(t * std::max<size_t>(inter, 1));
  logits_ = DeviceBuffer<float>(t * static_cast<size_t>(c.vocab));
  argmax_keys_ = DeviceBuffer<unsigned long long>(static_cast<size_t>(kSkinnyMaxM));
  QPARITY_CUDA_CHECK(cudaMallocHost(reinterpret_cast<void**>(&pinned_keys_),
                                    static_cast<size_t>(kSkinnyMaxM) * sizeof(unsigned long long)));
  // Attention of decode-sized batches (up to kSkinnyMaxM tokens, decode_attention) is split into
  // chunks of decode_attention_chunk keys: a few tokens' heads alone would leave most SMs idle.
  // Larger batches have blocks enough and take each token's keys whole (splitting them measured
  // 1.4-1.7x slower).
  attn_chunk_ = o.decode_attention_chunk;
  if (attn_chunk_ <= 0 || attn_chunk_ % 64 != 0)
    throw Error("engine", "decode_attention_chunk must be a positive multiple of 64 (got " +
                              std::to_string(attn_chunk_) + ")");
  attn_max_chunks_ = (o.max_context + attn_chunk_ - 1) / attn_chunk_;
  attn_whole_ = (o.max_context + 127) / 128 * 128;  // paged_attention's chunk: a multiple of 128
  qk_roped_ = Bf16Buffer(
      static_cast<size_t>(std::min(o.max_tokens, kSkinnyMaxM) * (c.q_size() + c.kv_size())));
  if (o.kernel_timeline)  // eight probed kernels a layer at most, plus the head's
    probes_ = DeviceBuffer<KernelProbe>(static_cast<size_t>(8 * c.num_layers + 8));
  const AttentionScratchSize as = paged_attention_scratch(
      std::min(o.max_tokens, kSkinnyMaxM), c.num_heads, c.head_dim, attn_max_chunks_);
  if (as.acc > 0) {
    attn_partial_acc_ = DeviceBuffer<float>(static_cast<size_t>(as.acc));
    attn_partial_ml_ = DeviceBuffer<float>(static_cast<size_t>(as.ml));
    attn_chunks_done_ = DeviceBuffer<uint32_t>(static_cast<size_t>(as.counters));
    QPARITY_CUDA_CHECK(
        cudaMemset(attn_chunks_done_.get(), 0, static_cast<size_t>(as.counters) * 4));
  }
  for (const auto& l : model_->layers)
    any_moe_ = any_moe_ || l.moe;
  if (any_moe_) {
    const size_t k = static_cast<size_t>(c.num_experts_per_tok),
                 mi = static_cast<size_t>(c.moe_intermediate_size);
    router_logits_ = DeviceBuffer<float>(t * static_cast<size_t>(c.num_experts));
    topk_weights_ = DeviceBuffer<float>(t * k);
    topk_ids_ = DeviceBuffer<int32_t>(t * k);
    moe_rows_ = DeviceBuffer<int32_t>(t * k);
    moe_dest_ = DeviceBuffer<int32_t>(t * k);
    moe_first_ = DeviceBuffer<int32_t>(static_cast<size_t>(c.num_experts) + 1);
    moe_active_ = DeviceBuffer<int32_t>(1 + std::min(static_cast<size_t>(c.num_experts), t * k));
    moe_bad_ = DeviceBuffer<int32_t>(static_cast<size_t>(c.num_layers));
    moe_x_ = Bf16Buffer(t * k * h);
    moe_gate_up_ = Bf16Buffer(t * k * 2 * mi);
    moe_act_ = Bf16Buffer(t * k * mi);
    moe_y_ = Bf16Buffer(t * k * h);
    moe_slots_ = Bf16Buffer(t * k * h);
  }
}

Engine::~Engine() {
  for (auto& [n, g] : graphs_)
    cudaGraphExecDestroy(g);
  if (stream_) {
    cudaStreamSynchronize(stream_);
    cudaStreamDestroy(stream_);
  }
  if (pinned_inputs_) cudaFreeHost(pinned_inputs_);
  if (pinned_keys_) cudaFreeHost(pinned_keys_);
}

void Engine::prepare(const Batch& b) {
  const int64_t t = b.size();
  if (t == 0 || t > options_.max_tokens)
    throw Error("engine batch", std::to_string(t) + " tokens; a forward takes 1.." +
                                    std::to_string(options_.max_tokens));
  if (b.slots.size() != b.tokens.size() || b.positions.size() != b.tokens.size())
    throw Error("engine batch", "tokens, slots and positions differ in length");
  for (int64_t i = 0; i < t; ++i) {
    const size_t u = static_cast<size_t>(i);
    if (b.tokens[u] < 0 || b.tokens[u] >= model_->cfg.vocab)
      throw Error("engine batch", "token " + std::to_string(i) + " has id " +
                                      std::to_string(b.tokens[u]) + ", outside the vocabulary (" +
                                      std::to_string(model_->cfg.vocab) + ")");
    if (b.positions[u] < 0 || b.positions[u] >= options_.max_context)
      throw Error("engine batch", "token " + std::to_string(i) + " at position " +
                                      std::to_string(b.positions[u]) + ", outside [0, " +
                                      std::to_string(options_.max_context) + ")");
    cache_->reserve(b.slots[u], b.positions[u] + 1);  // checks the slot
  }
  cache_->sync(stream_);
  cur_ = 0;
  keys_rows_ = 0;
  labelling_ = nullptr;  // run() sets it; a forward that threw must not leave it to the next
  if (any_moe_)  // every entry point comes through here; check_moe_ids reads it after the sync
    QPARITY_CUDA_CHECK(cudaMemsetAsync(moe_bad_.get(), 0, moe_bad_.size() * 4, stream_));
  // The previous forward's upload is done: forward() and forward_graph() synchronize the stream.
  std::copy(b.tokens.begin(), b.tokens.end(), pinned_inputs_);
  std::copy(b.slots.begin(), b.slots.end(), pinned_inputs_ + t);
  std::copy(b.positions.begin(), b.positions.end(), pinned_inputs_ + 2 * t);
  // Prefill tiles: batches with a sequence of several rows (prefill chunks) take the query-tiled
  // attention; decode-only batches (one row per sequence) keep the per-token kernel.
  const std::vector<int32_t> tiles = plan_prefill_tiles(b.slots);
  tiled_attention_ = t > kSkinnyMaxM && tiles[0] < t &&
                     (model_->cfg.head_dim == 64 || model_->cfg.head_dim == 128);
  attention_tiles_ = tiles[0];
  std::copy(tiles.begin(), tiles.end(), pinned_inputs_ + 3 * t);
  QPARITY_CUDA_CHECK(cudaMemcpyAsync(inputs_.get(), pinned_inputs_,
                                     static_cast<size_t>(3 * t) * 4 + tiles.size() * 4,
                                     cudaMemcpyHostToDevice, stream_));
  if (t <= kSkinnyMaxM) {  // the decode attention reads each token's table row directly
    const int64_t mb = cache_->shape().max_blocks_per_seq;
    int32_t* rows = pinned_inputs_ + token_tables_offset();
    for (int64_t i = 0; i < t; ++i) {
      const int32_t* row = cache_->host_row(b.slots[static_cast<size_t>(i)]);
      std::copy(row, row + mb, rows + i * mb);
    }
    QPARITY_CUDA_CHECK(cudaMemcpyAsync(inputs_.get() + token_tables_offset(), rows,
                                       static_cast<size_t>(t * mb) * sizeof(int32_t),
                                       cudaMemcpyHostToDevice, stream_));
  }
}

void Engine::forward(const Batch& b, reference::Trace* capture_to) {
  prepare(b);
  run(b.size(), capture_to);
  QPARITY_CUDA_CHECK(cudaStreamSynchronize(stream_));
  check_moe_ids();
}

bool Engine::moe_on_device(int64_t t) const {
  const ModelConfig& c = model_->cfg;
  return skinny_gemm_fits(t, c.hidden) && skinny_gemm_fits(t, c.moe_intermediate_size) &&
         c.hidden % 8 == 0 && c.moe_intermediate_size % 8 == 0;
}

void Engine::check_moe_ids() {
  if (!any_moe_) return;
  std::vector<int32_t> bad(moe_bad_.size());
  QPARITY_CUDA_CHECK(
      cudaMemcpy(bad.data(), moe_bad_.get(), bad.size() * 4, cudaMemcpyDeviceToHost));
  for (size_t l = 0; l < bad.size(); ++l)
    if (bad[l] != 0)
      throw Error(lp(static_cast<int64_t>(l)) + ".moe",
                  "the router returned " + std::to_string(bad[l]) + " expert id(s) outside [0, " +
                      std::to_string(model_->cfg.num_experts) +
                      ") (NaN router logits?): the forward's results are not usable");
}

void Engine::forward_graph(const Batch& b) {
  if (any_moe_ && !moe_on_device(b.size())) {
    forward(b);
    return;
  }
  prepare(b);
  const int64_t t = b.size();
  // One graph per (size, attention kind); its tiled attention covers up to t tiles.
  const int64_t key = 2 * t + (tiled_attention_ ? 1 : 0);
  attention_tiles_ = t;
  auto it = graphs_.find(key);
  if (it == graphs_.end()) {
    // Everything run() launches reads its inputs from the device buffers prepare() filled, so
    // the captured graph replays correctly for any tokens, slots and positions of this size.
    cudaGraph_t g;
    QPARITY_CUDA_CHECK(cudaStreamBeginCapture(stream_, cudaStreamCaptureModeThreadLocal));
    run(t, nullptr);
    QPARITY_CUDA_CHECK(cudaStreamEndCapture(stream_, &g));
    cudaGraphExec_t exec;
    QPARITY_CUDA_CHECK(cudaGraphInstantiate(&exec, g, 0));
    QPARITY_CUDA_CHECK(cudaGraphDestroy(g));
    it = graphs_.emplace(key, exec).first;
  }
  QPARITY_CUDA_CHECK(cudaGraphLaunch(it->second, stream_));
  QPARITY_CUDA_CHECK(cudaStreamSynchronize(stream_));
  keys_rows_ = fused_argmax(t) ? t : 0;  // the graph copied the fused argmax's keys to the host
  check_moe_ids();
}

void Engine::replay_graph(int64_t t, int64_t times) {
  const auto it = graphs_.find(2 * t);  // (decode graphs: no tiled attention, forward_graph's key)
  if (it == graphs_.end())
    throw Error("engine", "replay_graph: no decode graph of batch size " + std::to_string(t) +
                              " was captured (forward_graph runs one first)");
  for (int64_t i = 0; i < times; ++i)
    QPARITY_CUDA_CHECK(cudaGraphLaunch(it->second, stream_));
  QPARITY_CUDA_CHECK(cudaStreamSynchronize(stream_));
}

void Engine::run(int64_t t, reference::Trace* tr) {
  const ModelConfig& c = model_->cfg;
  // Decode-sized: the greedy argmax fused into the lm_head GEMM, its keys copied to the host by
  // the forward itself (graph included).
  const bool skinny_head = fused_argmax(t);
  if (skinny_head)
    QPARITY_CUDA_CHECK(cudaMemsetAsync(argmax_keys_.get(), 0, static_cast<size_t>(t) * 8, stream_));
  if (options_.kernel_timeline && t <= kSkinnyMaxM) {
    labelling_ = &probe_labels_[t];
    labelling_->clear();
    probed_t_ = t;
    QPARITY_CUDA_CHECK(cudaMemsetAsync(probes_.get(), 0xFF, probes_.bytes(), stream_));
  }
  EmbeddingParams ep{tokens_dev(t), model_->embed.get(), resid(), nullptr, t, c.vocab, c.hidden};
  ep.probe = probe("embedding");
  launch_embedding(ep, stream_);
  capture(tr, "embed", resid(), Elem::kBf16, t, c.hidden, c.hidden, stream_);
  for (int64_t l = 0; l < c.num_layers; ++l)
    run_layer(l, t, tr, l > 0);
  if (skinny_head) {
    // Decode-sized: the last residual add and the final norm run in the lm_head GEMM's prologue
    // (as each layer's in its qkv GEMM): one dependent launch fewer a step.
    SkinnyGemmParams g = normed_linear(mlp_out_.get(), model_->final_norm.get(), model_->lm_head,
                                       logits_.get(), t, c.vocab);
    g.y_f32 = true;
    g.argmax_keys = argmax_keys_.get();
    g.probe = probe("lm_head");
    launch_skinny_gemm(g, stream_);
    cur_ = 1 - cur_;
    capture(tr, lp(last_layer_) + ".residual", resid(), Elem::kBf16, t, c.hidden, c.hidden,
            stream_);
    capture(tr, "final_norm", h_.get(), Elem::kBf16, t, c.hidden, c.hidden, stream_);
  } else {
    close_residual(t, tr, model_->final_norm.get(), h_.get());
    capture(tr, "final_norm", h_.get(), Elem::kBf16, t, c.hidden, c.hidden, stream_);
    if (!options_.ablate_linears)  // (no fused argmax here: skinny_head is false)
      linear(h_.get(), model_->lm_head, logits_.get(), true, t, c.vocab, c.hidden, nullptr,
             probe("lm_head"));
  }
  capture(tr, "logits", logits_.get(), Elem::kF32, t, c.vocab, c.vocab, stream_);
  if (skinny_head) {
    QPARITY_CUDA_CHECK(cudaMemcpyAsync(pinned_keys_, argmax_keys_.get(),
                                       static_cast<size_t>(t) * sizeof(unsigned long long),
                                       cudaMemcpyDeviceToHost, stream_));
    keys_rows_ = t;
  }
  labelling_ = nullptr;
}

KernelProbe* Engine::probe(const char* kernel) {
  if (!labelling_) return nullptr;
  const size_t i = labelling_->size();
  if (i >= probes_.size())
    throw Error("engine timeline",
                "more than " + std::to_string(probes_.size()) + " probed kernels in one forward");
  labelling_->push_back(kernel);
  return probes_.get() + i;
}

std::vector<TimelineEntry> Engine::timeline() const {
  std::vector<TimelineEntry> out;
  const auto it = probe_labels_.find(probed_t_);
  if (!options_.kernel_timeline || it == probe_labels_.end()) return out;
  std::vector<KernelProbe> raw(it->second.size());
  QPARITY_CUDA_CHECK(cudaStreamSynchronize(stream_));
  QPARITY_CUDA_CHECK(cudaMemcpy(raw.data(), probes_.get(), raw.size() * sizeof(KernelProbe),
                                cudaMemcpyDeviceToHost));
  unsigned long long t0 = ~0ull;
  for (const KernelProbe& p : raw)
    t0 = std::min(t0, p.first_entry);
  for (size_t i = 0; i < raw.size(); ++i) {
    const KernelProbe& p = raw[i];
    const auto us = [&](unsigned long long t) { return static_cast<double>(t - t0) * 1e-3; };
    if (p.first_entry == ~0ull || p.first_release == ~0ull || p.last_exit_complement == ~0ull)
      throw Error("engine timeline", "kernel " + std::to_string(i) + " (" + it->second[i] +
                                         ") left its probe unstamped");
    out.push_back({it->second[i], us(p.first_entry), us(p.first_release),
                   us(~p.last_exit_complement), us(~p.last_entry_complement),
                   us(~p.last_release_complement)});
  }
  return out;
}

// The last layer's MLP output joins the residual stream inside the next norm (fused add):
// x += mlp_out (bf16), out = norm(x) with `weight`. Captures layers.<last>.residual.
void Engine::close_residual(int64_t t, reference::Trace* tr, const __nv_bfloat16* weight,
                            __nv_bfloat16* out, const float* bias) {
  const ModelConfig& c = model_->cfg;
  const int64_t hd = c.hidden;
  launch_rms_norm({.x = mlp_out_.get(),
                   .residual = resid(),
                   .residual_out = resid(),
                   .weight = weight,
                   .out = out,
                   .rows = t,
                   .dim = hd,
                   .row_stride = hd,
                   .eps = static_cast<float>(c.rms_norm_eps),
                   .probe = probe("residual_norm"),
                   .bias = bias},
                  stream_);
  capture(tr, lp(last_layer_) + ".residual", resid(), Elem::kBf16, t, hd, hd, stream_);
}

void Engine::linear(const __nv_bfloat16* in, const __nv_bfloat16* w, void* out, bool f32, int64_t t,
                    int64_t n, int64_t k, unsigned long long* argmax_keys, KernelProbe* probe) {
  if (skinny_gemm_fits(t, k)) {
    SkinnyGemmParams g;
    g.x = in;
    g.w = w;
    g.y = out;
    g.y_f32 = f32;
    g.m = t;
    g.n = n;
    g.k = k;
    g.argmax_keys = argmax_keys;
    g.probe = probe;
    launch_skinny_gemm(g, stream_);
  } else {
    gemm_->nt(in, w, out, f32 ? GemmOut::kF32 : GemmOut::kBf16, t, n, k, stream_);
  }
}

void Engine::project(const GpuLinearMethod* quantized, const __nv_bfloat16* w,
                     const __nv_bfloat16* in, __nv_bfloat16* out, int64_t t, int64_t n, int64_t k,
                     const char* label, reference::Trace* tr, const std::string& layer_name) {
  if (!quantized) {
    linear(in, w, out, false, t, n, k, nullptr, probe(label));
    return;
  }
  quantized->apply(in, out, t, stream_, quant_workspace_.get());
  // The activation codes the GEMM was fed, named as the reference names them.
  const GpuLinearMethod::ActivationCodes codes =
      quantized->activation_codes(quant_workspace_.get(), t);
  if (!codes.values) return;
  const bool fp8 = codes.kind == GpuLinearMethod::ActivationCodes::Kind::kFp8E4m3;
  capture(tr, layer_name + ".x_values", codes.values, fp8 ? Elem::kE4m3 : Elem::kI8, t, k, k,
          stream_);
  capture(tr, layer_name + ".x_scales", codes.scales, Elem::kF32, t, codes.scale_cols,
          codes.scale_cols, stream_);
}

SkinnyGemmParams Engine::normed_linear(const __nv_bfloat16* add, const __nv_bfloat16* norm_weight,
                                       const __nv_bfloat16* w, void* y, int64_t t,
                                       int64_t n) const {
  SkinnyGemmParams g;
  g.x = resid();
  if (add) {
    g.add = add;
    g.residual_out = resid_next();
  }
  g.norm_weight = norm_weight;
  g.normed_out = h_.get();
  g.eps = static_cast<float>(model_->cfg.rms_norm_eps);
  g.w = w;
  g.y = y;
  g.m = t;
  g.n = n;
  g.k = model_->cfg.hidden;
  return g;
}

void Engine::run_layer(int64_t l, int64_t t, reference::Trace* tr, bool pending_residual) {
  const ModelConfig& c = model_->cfg;
  const GpuModel& m = *model_;
  const int64_t hd = c.hidden, q = c.q_size(), kv = c.kv_size(), qkv_w = q + 2 * kv;
  const float eps = static_cast<float>(c.rms_norm_eps);
  cudaStream_t s = stream_;
  const GpuLayerWeights& w = m.layers[static_cast<size_t>(l)];
  const std::string p = lp(l);
  // Decode-sized batches: each norm runs inside the GEMM that consumes it.
  // A quantized qkv or gate_up runs its own kernel after a separate norm.
  const bool fused = skinny_gemm_fits(t, hd);
  if (fused && !w.quantized_qkv()) {
    // The previous layer's MLP output (pending_residual) joins the residual stream here.
    SkinnyGemmParams g = normed_linear(pending_residual ? mlp_out_.get() : nullptr,
                                       w.input_norm.get(), w.qkv.get(), qkv_.get(), t, qkv_w);
    if (!options_.ablate_linears) {
      g.probe = probe("qkv");
      launch_skinny_gemm(g, s);
    }
    if (pending_residual) {
      cur_ = 1 - cur_;
      capture(tr, lp(last_layer_) + ".residual", resid(), Elem::kBf16, t, hd, hd, s);
    }
    last_layer_ = l;
    capture(tr, p + ".input_norm", h_.get(), Elem::kBf16, t, hd, hd, s);
  } else {
    if (pending_residual)
      close_residual(t, tr, w.input_norm.get(), h_.get(), w.input_norm_bias.get());
    else {
      launch_rms_norm({.x = resid(),
                       .weight = w.input_norm.get(),
                       .out = h_.get(),
                       .rows = t,
                       .dim = hd,
                       .row_stride = hd,
                       .eps = eps,
                       .bias = w.input_norm_bias.get()},
                      s);
    }
    last_layer_ = l;
    capture(tr, p + ".input_norm", h_.get(), Elem::kBf16, t, hd, hd, s);
    if (!options_.ablate_linears)
      project(w.qkv_q.get(), w.qkv.get(), h_.get(), qkv_.get(), t, qkv_w, hd, "qkv", tr,
              p + ".attn.qkv_proj");
  }
  capture(tr, p + ".attn.qkv", qkv_.get(), Elem::kBf16, t, qkv_w, qkv_w, s);
  attention(l, t, tr);
  if (!options_.ablate_linears)
    project(w.o_proj_q.get(), w.o_proj.get(), core_.get(), attn_out_.get(), t, hd, q, "o_proj", tr,
            p + ".attn.o_proj");
  capture(tr, p + ".attn.out", attn_out_.get(), Elem::kBf16, t, hd, hd, s);
  const int64_t in = c.intermediate;
  if (fused && !w.moe && !w.quantized_gate_up()) {
    // post-attention add + norm, gate_up and SiLU-and-mul in one launch
    SkinnyGemmParams g =
        normed_linear(attn_out_.get(), w.post_norm.get(), w.gate_up.get(), act_.get(), t, 2 * in);
    g.silu_mul = true;
    if (tr && tr->wants(p + ".mlp.gate_up")) g.gate_up_out = gate_up_.get();
    if (!options_.ablate_linears) {
      g.probe = probe("gate_up");
      launch_skinny_gemm(g, s);
    }
    cur_ = 1 - cur_;
    capture(tr, p + ".post_attn_norm", h_.get(), Elem::kBf16, t, hd, hd, s);
    capture(tr, p + ".mlp.gate_up", gate_up_.get(), Elem::kBf16, t, 2 * in, 2 * in, s);
    capture(tr, p + ".mlp.act", act_.get(), Elem::kBf16, t, in, in, s);
  } else {
    launch_rms_norm({.x = attn_out_.get(),
                     .residual = resid(),
                     .residual_out = resid(),
                     .weight = w.post_norm.get(),
                     .out = h_.get(),
                     .rows = t,
                     .dim = hd,
                     .row_stride = hd,
                     .eps = eps,
                     .bias = w.post_norm_bias.get()},
                    s);
    capture(tr, p + ".post_attn_norm", h_.get(), Elem::kBf16, t, hd, hd, s);
    if (w.moe) {
      moe_layer(l, t, tr);
      return;
    }
    if (!options_.ablate_linears)
      project(w.gate_up_q.get(), w.gate_up.get(), h_.get(), gate_up_.get(), t, 2 * in, hd,
              "gate_up", tr, p + ".mlp.gate_up_proj");
    capture(tr, p + ".mlp.gate_up", gate_up_.get(), Elem::kBf16, t, 2 * in, 2 * in, s);
    launch_silu_and_mul({gate_up_.get(), act_.get(), t, in}, s);
    capture(tr, p + ".mlp.act", act_.get(), Elem::kBf16, t, in, in, s);
  }
  if (!options_.ablate_linears)
    project(w.down_q.get(), w.down.get(), act_.get(), mlp_out_.get(), t, hd, in, "down", tr,
            p + ".mlp.down_proj");
  capture(tr, p + ".mlp.out", mlp_out_.get(), Elem::kBf16, t, hd, hd, s);
}

// Attention of layer l on the qkv rows: q/k norm (Qwen3), RoPE, the KV-cache write and
// softmax(QK^T)V into core_, with the attn.* capture points.
void Engine::attention(int64_t l, int64_t t, reference::Trace* tr) {
  const ModelConfig& c = model_->cfg;
  const GpuModel& m = *model_;
  const int64_t q = c.q_size(), kv = c.kv_size(), qkv_w = q + 2 * kv;
  const float eps = static_cast<float>(c.rms_norm_eps);
  cudaStream_t s = stream_;
  const GpuLayerWeights& w = m.layers[static_cast<size_t>(l)];
  const std::string p = lp(l);
  __nv_bfloat16* qp = qkv_.get();
  __nv_bfloat16* kp = qkv_.get() + q;
  const KvCacheShape& ks = cache_->shape();
  const bool want_normed =
      c.has_qk_norm && tr && (tr->wants(p + ".attn.q_norm") || tr->wants(p + ".attn.k_norm"));
  const float scale = static_cast<float>(1.0 / std::sqrt(static_cast<double>(c.head_dim)));
  if (t <= kSkinnyMaxM) {  // decode-sized: norm, RoPE, cache write and attention in one launch
    DecodeAttentionParams da;
    da.qkv = qp, da.qkv_stride = qkv_w, da.eps = eps;
    da.q_norm = c.has_qk_norm ? w.q_norm.get() : nullptr;
    da.k_norm = c.has_qk_norm ? w.k_norm.get() : nullptr;
    da.positions = positions_dev(t), da.seq = slots_dev(t);
    da.inv_freq = m.inv_freq.get(), da.rope_scaling = m.rope_scaling;
    da.k_cache = cache_->k(l), da.v_cache = cache_->v(l), da.block_table = cache_->block_table();
    da.block_size = ks.block_size, da.max_blocks_per_seq = ks.max_blocks_per_seq;
    da.token_table = inputs_.get() + token_tables_offset();
    da.out = core_.get(), da.out_stride = q;
    const bool want_roped = tr && (tr->wants(p + ".attn.rope_q") || tr->wants(p + ".attn.rope_k"));
    da.normed_out = want_normed ? qk_normed_.get() : nullptr;
    da.rope_out = want_roped ? qk_roped_.get() : nullptr;
    da.tokens = t, da.num_heads = c.num_heads, da.num_kv_heads = c.num_kv_heads;
    da.head_dim = c.head_dim, da.scale = scale;
    da.chunk = attn_chunk_, da.max_chunks = attn_max_chunks_;
    da.partial_acc = attn_partial_acc_.get(), da.partial_ml = attn_partial_ml_.get();
    da.chunks_done = attn_chunks_done_.get();
    if (options_.attention_stages) da.stages = decode_attention_stage_buffer();
    if (!options_.ablate_attention) {
      da.probe = probe("attention");
      launch_decode_attention(da, s);
    }
    if (want_normed) {
      capture(tr, p + ".attn.q_norm", qk_normed_.get(), Elem::kBf16, t, q, q + kv, s);
      capture(tr, p + ".attn.k_norm", qk_normed_.get() + q, Elem::kBf16, t, kv, q + kv, s);
    }
    capture(tr, p + ".attn.rope_q", qk_roped_.get(), Elem::kBf16, t, q, q + kv, s);
    capture(tr, p + ".attn.rope_k", qk_roped_.get() + q, Elem::kBf16, t, kv, q + kv, s);
    capture(tr, p + ".attn.core", core_.get(), Elem::kBf16, t, q, q, s);
    return;
  }
  // Larger batches: q/k norm, RoPE and the cache write in one launch, then attention.
  const AttentionPrologueParams pro{.qkv = qp,
                                    .row_stride = qkv_w,
                                    .q_norm = c.has_qk_norm ? w.q_norm.get() : nullptr,
                                    .k_norm = c.has_qk_norm ? w.k_norm.get() : nullptr,
                                    .eps = eps,
                                    .normed_out = want_normed ? qk_normed_.get() : nullptr,
                                    .positions = positions_dev(t),
                                    .inv_freq = m.inv_freq.get(),
                                    .rope_scaling = m.rope_scaling,
                                    .k_cache = cache_->k(l),
                                    .v_cache = cache_->v(l),
                                    .block_table = cache_->block_table(),
                                    .seq = slots_dev(t),
                                    .tokens = t,
                                    .num_heads = c.num_heads,
                                    .num_kv_heads = c.num_kv_heads,
                                    .head_dim = c.head_dim,
                                    .block_size = ks.block_size,
                                    .max_blocks_per_seq = ks.max_blocks_per_seq};
  if (!options_.ablate_attention) launch_attention_prologue(pro, s);
  if (want_normed) {
    capture(tr, p + ".attn.q_norm", qk_normed_.get(), Elem::kBf16, t, q, q + kv, s);
    capture(tr, p + ".attn.k_norm", qk_normed_.get() + q, Elem::kBf16, t, kv, q + kv, s);
  }
  capture(tr, p + ".attn.rope_q", qp, Elem::kBf16, t, q, qkv_w, s);
  capture(tr, p + ".attn.rope_k", kp, Elem::kBf16, t, kv, qkv_w, s);
  PagedAttentionParams ap{.q = qp,
                          .q_stride = qkv_w,
                          .k_cache = cache_->k(l),
                          .v_cache = cache_->v(l),
                          .block_table = cache_->block_table(),
                          .seq = slots_dev(t),
                          .pos = positions_dev(t),
                          .out = core_.get(),
                          .out_stride = q,
                          .tokens = t,
                          .num_heads = c.num_heads,
                          .num_kv_heads = c.num_kv_heads,
                          .head_dim = c.head_dim,
                          .block_size = ks.block_size,
                          .max_blocks_per_seq = ks.max_blocks_per_seq,
                          .scale = scale};
  if (options_.ablate_attention) {
    // a timing study: no attention
  } else if (tiled_attention_) {
    PrefillAttentionParams pa;
    pa.q = qp, pa.q_stride = qkv_w, pa.k_cache = cache_->k(l), pa.v_cache = cache_->v(l);
    pa.block_table = cache_->block_table(), pa.seq = slots_dev(t), pa.pos = positions_dev(t);
    pa.tiles = tiles_dev(t), pa.max_tiles = attention_tiles_, pa.out = core_.get();
    pa.out_stride = q, pa.num_heads = c.num_heads, pa.num_kv_heads = c.num_kv_heads;
    pa.head_dim = c.head_dim, pa.block_size = ks.block_size;
    pa.max_blocks_per_seq = ks.max_blocks_per_seq, pa.scale = ap.scale;
    launch_prefill_attention(pa, s);
  } else {
    ap.chunk = attn_whole_, ap.max_chunks = 1;  // blocks enough without splitting keys
    launch_paged_attention(ap, s);
  }
  capture(tr, p + ".attn.core", core_.get(), Elem::kBf16, t, q, q, s);
}

// Router GEMM (fp32 logits) and top-k on the device; the (token, slot) pairs grouped by expert
// (on the device up to kSkinnyMaxM tokens, else on the host); one gather of all experts' rows,
// the experts' gate_up GEMMs, SiLU-and-mul, the down GEMMs (grouped skinny launches on the
// device path; a GEMM per expert with tokens on the host path: no grouped tensor-core GEMM yet);
// one scatter into per-slot outputs and the weighted combine.
void Engine::moe_layer(int64_t l, int64_t t, reference::Trace* tr) {
  const ModelConfig& c = model_->cfg;
  const GpuLayerWeights& w = model_->layers[static_cast<size_t>(l)];
  const int64_t hd = c.hidden, e = c.num_experts, k = c.num_experts_per_tok,
                mi = c.moe_intermediate_size;
  const std::string p = lp(l);
  cudaStream_t s = stream_;
  gemm_->nt(h_.get(), w.router.get(), router_logits_.get(), GemmOut::kF32, t, e, hd, s);
  capture(tr, p + ".moe.router_logits", router_logits_.get(), Elem::kF32, t, e, e, s);
  launch_moe_routing(
      {router_logits_.get(), topk_ids_.get(), topk_weights_.get(), t, e, k, c.norm_topk_prob}, s);
  capture(tr, p + ".moe.topk_ids", topk_ids_.get(), Elem::kI32, t, k, k, s);
  capture(tr, p + ".moe.topk_weights", topk_weights_.get(), Elem::kF32, t, k, k, s);
  const int64_t n = t * k;
  if (moe_on_device(t)) {
    // Decode-sized: grouped on the device, then one grouped skinny GEMM per expert weight (a
    // token's experts are distinct, so no expert has more than t rows). The gate_up product
    // rounds to bf16 before SiLU-and-mul inside the epilogue, as the separate kernels do.
    launch_moe_group_by_expert({topk_ids_.get(), moe_first_.get(), moe_rows_.get(), moe_dest_.get(),
                                moe_active_.get(), moe_bad_.get() + l, n, e, k},
                               s);
    launch_gather_rows({h_.get(), moe_rows_.get(), moe_x_.get(), n, hd, t}, s);
    SkinnyGemmParams up;
    up.x = moe_x_.get(), up.w = w.w13.get(), up.y = moe_act_.get();
    up.m = t, up.n = 2 * mi, up.k = hd, up.silu_mul = true;
    up.group_first = moe_first_.get(), up.group_active = moe_active_.get();
    up.max_active = std::min(e, n), up.w_group_stride = 2 * mi * hd;
    launch_skinny_gemm(up, s);
    SkinnyGemmParams down = up;
    down.x = moe_act_.get(), down.w = w.w2.get(), down.y = moe_y_.get();
    down.n = hd, down.k = mi, down.silu_mul = false, down.w_group_stride = hd * mi;
    launch_skinny_gemm(down, s);
  } else {
    moe_experts_via_host(l, t, s);
  }
  launch_scatter_rows({moe_y_.get(), moe_dest_.get(), moe_slots_.get(), n, hd, n}, s);
  capture(tr, p + ".moe.expert_out", moe_slots_.get(), Elem::kBf16, t, k * hd, k * hd, s);
  launch_moe_combine(
      {moe_slots_.get(), topk_ids_.get(), topk_weights_.get(), mlp_out_.get(), t, k, hd}, s);
  capture(tr, p + ".moe.out", mlp_out_.get(), Elem::kBf16, t, hd, hd, s);
}

// Larger batches: the ids come to the host, which groups the pairs and runs a GEMM per expert
// with tokens.
void Engine::moe_experts_via_host(int64_t l, int64_t t, cudaStream_t s) {
  const ModelConfig& c = model_->cfg;
  const GpuLayerWeights& w = model_->layers[static_cast<size_t>(l)];
  const int64_t hd = c.hidden, e = c.num_experts, k = c.num_experts_per_tok,
                mi = c.moe_intermediate_size;
  const std::string p = lp(l);
  std::vector<int32_t> ids(static_cast<size_t>(t * k));
  QPARITY_CUDA_CHECK(
      cudaMemcpyAsync(ids.data(), topk_ids_.get(), ids.size() * 4, cudaMemcpyDeviceToHost, s));
  QPARITY_CUDA_CHECK(cudaStreamSynchronize(s));
  // Group the (token, slot) pairs by expert in one counting pass; within an expert, token order.
  std::vector<int64_t> first(static_cast<size_t>(e + 1), 0);
  for (const int32_t id : ids) {
    if (id < 0 || id >= e)
      throw Error(p + ".moe", "the router returned expert id " + std::to_string(id) +
                                  ", outside [0, " + std::to_string(e) + ") (NaN router logits?)");
    ++first[static_cast<size_t>(id) + 1];
  }
  for (int64_t x = 0; x < e; ++x)
    first[static_cast<size_t>(x + 1)] += first[static_cast<size_t>(x)];
  std::vector<int32_t> rows(ids.size()), dest(ids.size());
  std::vector<int64_t> fill(first.begin(), first.end() - 1);
  for (int64_t i = 0; i < t * k; ++i) {
    const size_t at = static_cast<size_t>(fill[static_cast<size_t>(ids[static_cast<size_t>(i)])]++);
    rows[at] = static_cast<int32_t>(i / k);
    dest[at] = static_cast<int32_t>(i);
  }
  const int64_t n = t * k;
  QPARITY_CUDA_CHECK(
      cudaMemcpyAsync(moe_rows_.get(), rows.data(), rows.size() * 4, cudaMemcpyHostToDevice, s));
  QPARITY_CUDA_CHECK(
      cudaMemcpyAsync(moe_dest_.get(), dest.data(), dest.size() * 4, cudaMemcpyHostToDevice, s));
  launch_gather_rows({h_.get(), moe_rows_.get(), moe_x_.get(), n, hd, t}, s);
  for (int64_t x = 0; x < e; ++x) {
    const int64_t a = first[static_cast<size_t>(x)], cnt = first[static_cast<size_t>(x + 1)] - a;
    if (cnt == 0) continue;
    linear(moe_x_.get() + a * hd, w.w13.get() + x * 2 * mi * hd, moe_gate_up_.get() + a * 2 * mi,
           false, cnt, 2 * mi, hd);
  }
  launch_silu_and_mul({moe_gate_up_.get(), moe_act_.get(), n, mi}, s);
  for (int64_t x = 0; x < e; ++x) {
    const int64_t a = first[static_cast<size_t>(x)], cnt = first[static_cast<size_t>(x + 1)] - a;
    if (cnt == 0) continue;
    linear(moe_act_.get() + a * mi, w.w2.get() + x * hd * mi, moe_y_.get() + a * hd, false, cnt, hd,
           mi);
  }
}

void Engine::forward_layer(int64_t layer, const std::vector<double>& input, const Batch& b,
                           reference::Trace* capture_to) {
  const ModelConfig& c = model_->cfg;
  if (layer < 0 || layer >= c.num_layers)
    throw Error("engine layer", "layer " + std::to_string(layer) + " of a model with " +
                                    std::to_string(c.num_layers));
  upload_input(input, b, "engine layer");
  run_layer(layer, b.size(), capture_to, false);
  // The layer's residual output: the fused add with the next norm's weight into scratch.
  const bool last = layer + 1 >= c.num_layers;
  const GpuLayerWeights* nl = last ? nullptr : &model_->layers[static_cast<size_t>(layer + 1)];
  close_residual(b.size(), capture_to, last ? model_->final_norm.get() : nl->input_norm.get(),
                 h_.get(), last ? nullptr : nl->input_norm_bias.get());
  QPARITY_CUDA_CHECK(cudaStreamSynchronize(stream_));
  check_moe_ids();
}

void Engine::upload_input(const std::vector<double>& input, const Batch& b, const char* what) {
  const int64_t hd = model_->cfg.hidden;
  if (static_cast<int64_t>(input.size()) != b.size() * hd)
    throw Error(what, "the input has " + std::to_string(input.size()) +
                          " values, the batch needs " + std::to_string(b.size()) + " x " +
                          std::to_string(hd));
  prepare(b);
  std::vector<__nv_bfloat16> x(input.size());
  for (size_t i = 0; i < x.size(); ++i) {
    if (!std::isfinite(input[i]))
      throw Error(what, "input value " + std::to_string(i) + " is not finite");
    x[i] = __double2bfloat16(input[i]);  // golden values from an emulate-mode run are exact
  }
  QPARITY_CUDA_CHECK(
      cudaMemcpyAsync(resid(), x.data(), x.size() * 2, cudaMemcpyHostToDevice, stream_));
}

void Engine::forward_embed(const Batch& b, reference::Trace* capture_to) {
  const ModelConfig& c = model_->cfg;
  prepare(b);
  const int64_t t = b.size();
  launch_embedding({tokens_dev(t), model_->embed.get(), resid(), nullptr, t, c.vocab, c.hidden},
                   stream_);
  capture(capture_to, "embed", resid(), Elem::kBf16, t, c.hidden, c.hidden, stream_);
  QPARITY_CUDA_CHECK(cudaStreamSynchronize(stream_));
}

void Engine::forward_final(const std::vector<double>& input, const Batch& b,
                           reference::Trace* capture_to) {
  const ModelConfig& c = model_->cfg;
  upload_input(input, b, "engine final");
  const int64_t t = b.size(), hd = c.hidden;
  launch_rms_norm({.x = resid(),
                   .weight = model_->final_norm.get(),
                   .out = h_.get(),
                   .rows = t,
                   .dim = hd,
                   .row_stride = hd,
                   .eps = static_cast<float>(c.rms_norm_eps)},
                  stream_);
  capture(capture_to, "final_norm", h_.get(), Elem::kBf16, t, hd, hd, stream_);
  linear(h_.get(), model_->lm_head, logits_.get(), true, t, c.vocab, hd);
  capture(capture_to, "logits", logits_.get(), Elem::kF32, t, c.vocab, c.vocab, stream_);
  QPARITY_CUDA_CHECK(cudaStreamSynchronize(stream_));
}

std::vector<float> Engine::logits_host(int64_t rows) const {
  std::vector<float> out(static_cast<size_t>(rows * model_->cfg.vocab));
  QPARITY_CUDA_CHECK(cudaMemcpy(out.data(), logits_.get(), out.size() * 4, cudaMemcpyDeviceToHost));
  return out;
}

std::vector<int32_t> Engine::greedy(int64_t rows) {
  if (rows >= 1 && rows <= keys_rows_) {  // the lm_head's fused argmax, already on the host
    std::vector<int32_t> ids(static_cast<size_t>(rows));
    for (int64_t r = 0; r < rows; ++r)
      ids[static_cast<size_t>(r)] = argmax_id(pinned_keys_[r]);
    return ids;
  }
  launch_argmax({logits_.get(), next_ids_.get(), rows, model_->cfg.vocab}, stream_);
  std::vector<int32_t> ids(static_cast<size_t>(rows));
  QPARITY_CUDA_CHECK(cudaMemcpyAsync(ids.data(), next_ids_.get(), ids.size() * 4,
                                     cudaMemcpyDeviceToHost, stream_));
  QPARITY_CUDA_CHECK(cudaStreamSynchronize(stream_));
  return ids;
}

}  // namespace qparity::gpu
