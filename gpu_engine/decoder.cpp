#include "gpu_engine/decoder.h"

#include <algorithm>
#include "core/capture/capture_points.h"

#include "core/capture/trace.h"
#include "core/error.h"
#include "gpu_engine/cuda_check.h"
#include "gpu_engine/kernels/activation.h"
#include "gpu_engine/kernels/bias_add.h"
#include "gpu_engine/kernels/column_gather.h"
#include "gpu_engine/kernels/embedding.h"
#include "gpu_engine/kernels/image_rows.h"
#include "gpu_engine/kernels/paged_attention.h"
#include "gpu_engine/kernels/rank_sum.h"
#include "gpu_engine/kernels/rms_norm.h"
#include "gpu_engine/rope_layout.h"
#include "gpu_engine/shape_padding.h"

namespace qparity::gpu {

namespace {

// Qwen3.5's attn.qkv as the reference records it (q_proj's own rows, per head [q | gate], then k
// and v) from the engine's [q | k | v | gate] row: `qkv` maps the logical [q | k | v] columns.
ColumnMap gated_qkv_columns(const ColumnMap& qkv, const ModelConfig& cfg) {
  const int64_t d = cfg.head_dim, q = cfg.q_size(), qkv_n = q + 2 * cfg.kv_size();
  const auto at = [&](int64_t c) { return qkv.empty() ? c : qkv[static_cast<size_t>(c)]; };
  ColumnMap out;
  for (int64_t h = 0; h < cfg.num_heads; ++h) {
    for (int64_t j = 0; j < d; ++j)
      out.push_back(at(h * d + j));
    for (int64_t j = 0; j < d; ++j)
      out.push_back(qkv_n + h * d + j);
  }
  for (int64_t c = q; c < qkv_n; ++c)
    out.push_back(at(c));
  return out;
}

}  // namespace

Decoder::Decoder(const GpuModel& model, PagedKvCache& cache, const EngineOptions& o,
                 cudaStream_t stream, KernelTimeline& timeline, TpComm* comm)
    : model_(model), comm_(comm), cache_(cache), options_(o), stream_(stream), timeline_(timeline) {
  if (comm_ && (comm_->size() != model_.tp || comm_->rank() != model_.rank))
    throw Error("engine", "the communicator is rank " + std::to_string(comm_->rank()) + " of " +
                              std::to_string(comm_->size()) + ", the model rank " +
                              std::to_string(model_.rank) + " of " + std::to_string(model_.tp));
  if (!comm_ && model_.tp > 1)
    throw Error("engine", "a tensor-parallel model shard needs its communicator");
  const ModelConfig& c = model_.kcfg();
  gemm_ = std::make_unique<BlasLtGemm>();
  const PaddedColumns cols = padded_columns(model_.cfg, c);
  // q and k as the kernels hold them (padded, and re-laid out for RoPE: rope_layout.h); v and the
  // attention output only padded.
  core_cols_ = cols.q, v_cols_ = cols.k;
  q_cols_ = rope_columns(cols.q, model_.cfg.num_heads, model_.cfg);
  k_cols_ = rope_columns(cols.k, model_.cfg.num_kv_heads, model_.cfg);
  qkv_cols_ = rope_qkv_columns(cols.qkv, model_.cfg);
  if (model_.attn_gate()) qkv_cols_ = gated_qkv_columns(qkv_cols_, model_.cfg);
  gate_up_cols_ = cols.gate_up, act_cols_ = cols.act;
  const size_t t = static_cast<size_t>(o.max_tokens), h = static_cast<size_t>(c.hidden);
  const size_t qkv = static_cast<size_t>(model_.qkv_rows());
  residual_[0] = Bf16Buffer(t * h);
  residual_[1] = Bf16Buffer(t * h);
  h_ = Bf16Buffer(t * h);
  qkv_ = Bf16Buffer(t * qkv);
  if (model_.qkv_sources.size() > 0) qkv_raw_ = Bf16Buffer(t * qkv);
  for (const GpuLayerWeights& l : model_.layers)
    if (l.qkv_bias.size() > 0) qkv_f32_ = DeviceBuffer<float>(t * qkv);
  qk_normed_ = Bf16Buffer(t * static_cast<size_t>(c.q_size() + c.kv_size()));
  core_ = Bf16Buffer(t * static_cast<size_t>(c.q_size()));
  attn_out_ = Bf16Buffer(t * h);
  size_t ws = 0;
  for (const GpuLayerWeights& l : model_.layers)
    for (const GpuLinearMethod* m :
         {l.qkv_q.get(), l.o_proj_q.get(), l.gate_up_q.get(), l.down_q.get()})
      if (m) ws = std::max(ws, m->workspace_bytes(o.max_tokens));
  // Quantized experts take up to every (token, slot) pair of a forward.
  for (const GpuLayerWeights& l : model_.layers)
    for (const auto* stack : {&l.w13_q, &l.w2_q})
      for (const auto& m : *stack)
        ws = std::max(ws, m->workspace_bytes(o.max_tokens *
                                             std::max<int64_t>(model_.cfg.num_experts_per_tok, 1)));
  quant_workspace_ = DeviceBuffer<uint8_t>(ws);
  mlp_out_ = Bf16Buffer(t * h);
  if (model_.cfg.has_linear_attention()) {
    const LinearAttentionDims& ld = model_.cfg.linear;
    const size_t hv = static_cast<size_t>(ld.num_value_heads);
    lin_in_ = Bf16Buffer(
        t * static_cast<size_t>(ld.conv_dim() + ld.value_dim() + 2 * ld.num_value_heads));
    lin_conv_ = Bf16Buffer(t * static_cast<size_t>(ld.conv_dim()));
    lin_core_ = Bf16Buffer(t * static_cast<size_t>(ld.value_dim()));
    lin_normed_ = Bf16Buffer(t * static_cast<size_t>(ld.value_dim()));
    lin_beta_ = DeviceBuffer<float>(t * hv);
    lin_decay_ = DeviceBuffer<float>(t * hv);
  }
  const size_t inter = static_cast<size_t>(std::max<int64_t>(c.intermediate, 0));
  gate_up_ = Bf16Buffer(t * 2 * std::max<size_t>(inter, 1));
  act_ = Bf16Buffer(t * std::max<size_t>(inter, 1));
  logits_ = DeviceBuffer<float>(t * static_cast<size_t>(model_.whole().vocab));
  if (comm_) {
    logits_shard_ = DeviceBuffer<float>(t * static_cast<size_t>(c.vocab));
    logits_gathered_ = DeviceBuffer<float>(t * static_cast<size_t>(c.vocab * comm_->size()));
    partials_ = Bf16Buffer(t * h * static_cast<size_t>(comm_->size()));
  }
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
  if (model_.quantized_kv_cache()) kv_read_ = Bf16Buffer(t * 2 * static_cast<size_t>(c.kv_size()));
  qk_roped_ = Bf16Buffer(
      static_cast<size_t>(std::min(o.max_tokens, kSkinnyMaxM) * (c.q_size() + c.kv_size())));
  const AttentionScratchSize as = paged_attention_scratch(
      std::min(o.max_tokens, kSkinnyMaxM), c.num_heads, c.head_dim, attn_max_chunks_);
  if (as.acc > 0) {
    attn_partial_acc_ = DeviceBuffer<float>(static_cast<size_t>(as.acc));
    attn_partial_ml_ = DeviceBuffer<float>(static_cast<size_t>(as.ml));
    attn_chunks_done_ = DeviceBuffer<uint32_t>(static_cast<size_t>(as.counters));
    QPARITY_CUDA_CHECK(
        cudaMemset(attn_chunks_done_.get(), 0, static_cast<size_t>(as.counters) * 4));
  }
  for (const auto& l : model_.layers) {
    any_moe_ = any_moe_ || l.moe, quantized_experts_ = quantized_experts_ || l.quantized_experts();
    bf16_experts_ = bf16_experts_ || (l.moe && !l.quantized_experts());
  }
  if (quantized_experts_ && o.grouped_experts) {
    grouped_experts_ = true;
    for (const auto& l : model_.layers) {
      w13_grouped_.emplace_back();
      w2_grouped_.emplace_back();
      if (!l.quantized_experts()) continue;
      std::string why;
      if (l.w13_q.empty() || l.w2_q.empty()) why = "a stack with one quantized weight";
      if (why.empty()) w13_grouped_.back() = GroupedExperts::make(l.w13_q, &why);
      if (why.empty()) w2_grouped_.back() = GroupedExperts::make(l.w2_q, &why);
      if (!why.empty()) {  // (the host path runs them; the engine tests name which schemes)
        grouped_experts_ = false;
        break;
      }
    }
    if (!grouped_experts_) w13_grouped_.clear(), w2_grouped_.clear();
  }
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

Decoder::~Decoder() {
  if (pinned_keys_) cudaFreeHost(pinned_keys_);
}

void Decoder::begin(const StepInputs& in) {
  in_ = in;
  cur_ = 0;
  keys_rows_ = 0;
  if (any_moe_)  // every entry point comes through here; check_moe_ids reads it after the sync
    QPARITY_CUDA_CHECK(cudaMemsetAsync(moe_bad_.get(), 0, moe_bad_.size() * 4, stream_));
}

void Decoder::forward(Trace* tr) {
  const ModelConfig& c = model_.kcfg();
  const int64_t t = in_.t;
  // Decode-sized: the greedy argmax fused into the lm_head GEMM, its keys copied to the host by
  // the forward itself (graph included).
  // (an image prompt closes the stream after its deepstack layers: the head runs on its own)
  const bool skinny_head = fused_argmax(t) && in_.image_count == 0;
  if (skinny_head)
    QPARITY_CUDA_CHECK(cudaMemsetAsync(argmax_keys_.get(), 0, static_cast<size_t>(t) * 8, stream_));
  embed(probe("embedding"));
  capture(tr, std::string(point::kEmbed), resid(), Elem::kBf16, t, c.hidden, c.hidden, stream_);
  for (int64_t l = 0; l < c.num_layers; ++l) {
    run_layer(l, tr, l > 0 && !injects_after(l - 1));
    if (injects_after(l)) inject_deepstack(l, tr);
  }
  if (injects_after(c.num_layers - 1)) {  // the stream is closed: the final norm alone
    final_norm(tr);
    if (!options_.ablate_linears) head_logits(probe("lm_head"));
  } else if (skinny_head) {
    // Decode-sized: the last residual add and the final norm run in the lm_head GEMM's prologue
    // (as each layer's in its qkv GEMM): one dependent launch fewer a step.
    SkinnyGemmParams g = normed_linear(mlp_out_.get(), model_.final_norm.get(), model_.lm_head,
                                       logits_.get(), c.vocab);
    g.y_f32 = true;
    g.argmax_keys = argmax_keys_.get();
    g.probe = probe("lm_head");
    launch_skinny_gemm(g, stream_);
    cur_ = 1 - cur_;
    capture(tr, point_of(layer_prefix(last_layer_), point::kResidual), resid(), Elem::kBf16, t,
            c.hidden, c.hidden, stream_);
    capture(tr, std::string(point::kFinalNorm), h_.get(), Elem::kBf16, t, c.hidden, c.hidden,
            stream_);
  } else {
    close_residual(tr, model_.final_norm.get(), h_.get());
    capture(tr, std::string(point::kFinalNorm), h_.get(), Elem::kBf16, t, c.hidden, c.hidden,
            stream_);
    if (!options_.ablate_linears)  // (no fused argmax here: skinny_head is false)
      head_logits(probe("lm_head"));
  }
  const int64_t v = model_.whole().vocab;
  capture(tr, std::string(point::kLogits), logits_.get(), Elem::kF32, t, v, v, stream_);
  if (skinny_head) {
    QPARITY_CUDA_CHECK(cudaMemcpyAsync(pinned_keys_, argmax_keys_.get(),
                                       static_cast<size_t>(t) * sizeof(unsigned long long),
                                       cudaMemcpyDeviceToHost, stream_));
    keys_rows_ = t;
  }
}

void Decoder::forward_layer(int64_t layer, Trace* tr) {
  run_layer(layer, tr, false);
  if (injects_after(layer)) {
    inject_deepstack(layer, tr);
    return;
  }
  // The layer's residual output: the fused add with the next norm's weight into scratch.
  const bool last = layer + 1 >= model_.kcfg().num_layers;
  const GpuLayerWeights* nl = last ? nullptr : &model_.layers[static_cast<size_t>(layer + 1)];
  close_residual(tr, last ? model_.final_norm.get() : nl->input_norm.get(), h_.get(),
                 last ? nullptr : nl->input_norm_bias.get());
}

void Decoder::embed(KernelProbe* kernel_probe) {
  const ModelConfig& c = model_.kcfg();
  EmbeddingParams ep{in_.tokens, model_.embed.get(), resid(), nullptr, in_.t, c.vocab, c.hidden};
  ep.probe = kernel_probe;
  if (comm_) ep.vocab_shard = true, ep.vocab_begin = comm_->rank() * c.vocab;
  launch_embedding(ep, stream_);
  if (comm_) reduce_partial(resid());
  // An image prompt's placeholders take the vision features (masked_scatter): "embed" is what
  // layer 0 reads.
  launch_image_rows({.x = resid(),
                     .rows = in_.image_rows,
                     .src = in_.image_embeds,
                     .count = in_.image_count,
                     .hidden = c.hidden},
                    stream_);
}

void Decoder::inject_deepstack(int64_t l, Trace* tr) {
  const ModelConfig& c = model_.kcfg();
  const int64_t t = in_.t, hd = c.hidden;
  // The pending MLP output joins the stream (close_residual's fused add, not captured yet; its
  // normalized output is scratch: the next layer normalizes the injected stream itself).
  const bool last = l + 1 >= c.num_layers;
  close_residual(
      nullptr,
      last ? model_.final_norm.get() : model_.layers[static_cast<size_t>(l + 1)].input_norm.get(),
      h_.get());
  launch_image_rows({.x = resid(),
                     .rows = in_.image_rows,
                     .src = in_.deepstack + l * in_.image_count * hd,
                     .count = in_.image_count,
                     .hidden = hd,
                     .add = true},
                    stream_);
  capture(tr, point_of(layer_prefix(l), point::kResidual), resid(), Elem::kBf16, t, hd, hd,
          stream_);
}

void Decoder::head_logits(KernelProbe* kernel_probe) {
  const ModelConfig& c = model_.kcfg();
  const int64_t t = in_.t;
  if (!comm_) {
    linear(h_.get(), model_.lm_head, logits_.get(), true, t, c.vocab, c.hidden, nullptr,
           kernel_probe);
    return;
  }
  linear(h_.get(), model_.lm_head, logits_shard_.get(), true, t, c.vocab, c.hidden, nullptr,
         kernel_probe);
  const size_t shard = static_cast<size_t>(t * c.vocab);
  comm_->all_gather_f32(logits_shard_.get(), logits_gathered_.get(), shard, stream_);
  // [tp][t][shard] -> [t][whole vocabulary]: each rank's block of columns, its padding dropped.
  const int64_t v = model_.whole().vocab;
  for (int r = 0; r < comm_->size(); ++r) {
    const int64_t first = r * c.vocab, cols = std::min(c.vocab, v - first);
    if (cols <= 0) continue;
    QPARITY_CUDA_CHECK(cudaMemcpy2DAsync(
        logits_.get() + first, static_cast<size_t>(v) * 4,
        logits_gathered_.get() + static_cast<size_t>(r) * shard, static_cast<size_t>(c.vocab) * 4,
        static_cast<size_t>(cols) * 4, static_cast<size_t>(t), cudaMemcpyDeviceToDevice, stream_));
  }
}

void Decoder::reduce_partial(__nv_bfloat16* buf) {
  const size_t n = static_cast<size_t>(in_.t * model_.kcfg().hidden);
  comm_->all_gather_bf16(buf, partials_.get(), n, stream_);
  launch_rank_sum({partials_.get(), buf, static_cast<int64_t>(n), comm_->size()}, stream_);
}

void Decoder::forward_embed(Trace* tr) {
  const ModelConfig& c = model_.kcfg();
  embed(nullptr);
  capture(tr, std::string(point::kEmbed), resid(), Elem::kBf16, in_.t, c.hidden, c.hidden, stream_);
}

void Decoder::final_norm(Trace* tr) {
  const ModelConfig& c = model_.kcfg();
  const int64_t t = in_.t, hd = c.hidden;
  launch_rms_norm({.x = resid(),
                   .weight = model_.final_norm.get(),
                   .out = h_.get(),
                   .rows = t,
                   .dim = hd,
                   .row_stride = hd,
                   .eps = static_cast<float>(c.rms_norm_eps),
                   .weight_offset = model_.norm_offset()},
                  stream_);
  capture(tr, std::string(point::kFinalNorm), h_.get(), Elem::kBf16, t, hd, hd, stream_);
}

void Decoder::forward_final(Trace* tr) {
  const int64_t t = in_.t;
  final_norm(tr);
  head_logits(nullptr);
  const int64_t v = model_.whole().vocab;
  capture(tr, std::string(point::kLogits), logits_.get(), Elem::kF32, t, v, v, stream_);
}

bool Decoder::moe_on_device(int64_t t) const {
  const ModelConfig& c = model_.kcfg();
  // bf16 experts: grouped skinny GEMMs. Quantized experts: grouped launches (decoder_moe.cpp)
  // when every quantized stack has them, else per expert from the host's grouping. A model with
  // both kinds of layers needs both.
  const bool bf16_ok = skinny_gemm_fits(t, c.hidden) &&
                       skinny_gemm_fits(t, c.moe_intermediate_size) && c.hidden % 8 == 0 &&
                       c.moe_intermediate_size % 8 == 0;
  if (quantized_experts_ && !(grouped_experts_ && t <= kGroupedExpertsMaxTokens)) return false;
  return !bf16_experts_ || bf16_ok;
}

void Decoder::check_moe_ids() const {
  if (!any_moe_) return;
  std::vector<int32_t> bad(moe_bad_.size());
  QPARITY_CUDA_CHECK(
      cudaMemcpy(bad.data(), moe_bad_.get(), bad.size() * 4, cudaMemcpyDeviceToHost));
  for (size_t l = 0; l < bad.size(); ++l)
    if (bad[l] != 0)
      throw Error(layer_prefix(static_cast<int64_t>(l)) + ".moe",
                  "the router returned " + std::to_string(bad[l]) + " expert id(s) outside [0, " +
                      std::to_string(model_.cfg.num_experts) +
                      ") (NaN router logits?): the forward's results are not usable");
}

// The last layer's MLP output joins the residual stream inside the next norm (fused add):
// x += mlp_out (bf16), out = norm(x) with `weight`. Captures layers.<last>.residual.
void Decoder::close_residual(Trace* tr, const __nv_bfloat16* weight, __nv_bfloat16* out,
                             const float* bias) {
  const ModelConfig& c = model_.kcfg();
  const int64_t hd = c.hidden;
  launch_rms_norm({.x = mlp_out_.get(),
                   .residual = resid(),
                   .residual_out = resid(),
                   .weight = weight,
                   .out = out,
                   .rows = in_.t,
                   .dim = hd,
                   .row_stride = hd,
                   .eps = static_cast<float>(c.rms_norm_eps),
                   .probe = probe("residual_norm"),
                   .bias = bias,
                   .weight_offset = model_.norm_offset()},
                  stream_);
  capture(tr, point_of(layer_prefix(last_layer_), point::kResidual), resid(), Elem::kBf16, in_.t,
          hd, hd, stream_);
}

void Decoder::linear(const __nv_bfloat16* in, const __nv_bfloat16* w, void* out, bool f32,
                     int64_t t, int64_t n, int64_t k, unsigned long long* argmax_keys,
                     KernelProbe* kernel_probe) {
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
    g.probe = kernel_probe;
    launch_skinny_gemm(g, stream_);
  } else {
    gemm_->nt(in, w, out, f32 ? GemmOut::kF32 : GemmOut::kBf16, t, n, k, stream_);
  }
}

void Decoder::project(const GpuLinearMethod* quantized, const __nv_bfloat16* w,
                      const __nv_bfloat16* in, __nv_bfloat16* out, int64_t n, int64_t k,
                      const char* label, Trace* tr, const std::string& layer_name) {
  const int64_t t = in_.t;
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
  capture(tr, point_of(layer_name, point::kXValues), codes.values, fp8 ? Elem::kE4m3 : Elem::kI8, t,
          k, k, stream_, {}, codes.zero_point);
  capture(tr, point_of(layer_name, point::kXScales), codes.scales, Elem::kF32, t, codes.scale_cols,
          codes.scale_cols, stream_);
}

SkinnyGemmParams Decoder::normed_linear(const __nv_bfloat16* add, const __nv_bfloat16* norm_weight,
                                        const __nv_bfloat16* w, void* y, int64_t n) const {
  SkinnyGemmParams g;
  g.x = resid();
  if (add) {
    g.add = add;
    g.residual_out = resid_next();
  }
  g.norm_weight = norm_weight;
  g.normed_out = h_.get();
  g.eps = static_cast<float>(model_.kcfg().rms_norm_eps);
  g.w = w;
  g.y = y;
  g.m = in_.t;
  g.n = n;
  g.k = model_.kcfg().hidden;
  return g;
}

void Decoder::run_layer(int64_t l, Trace* tr, bool pending_residual) {
  const ModelConfig& c = model_.kcfg();
  const int64_t t = in_.t;
  const int64_t hd = c.hidden, q = c.q_size(), qkv_w = model_.qkv_rows();
  const float eps = static_cast<float>(c.rms_norm_eps);
  cudaStream_t s = stream_;
  const GpuLayerWeights& w = model_.layers[static_cast<size_t>(l)];
  const std::string p = layer_prefix(l);
  // Decode-sized batches: each norm runs inside the GEMM that consumes it. A quantized qkv or
  // gate_up runs its own kernel after a separate norm, as do zero-centred norms (the skinny
  // GEMM's prologue takes a plain weight) and a Gated DeltaNet layer.
  const bool fused = skinny_gemm_fits(t, hd) && model_.norm_offset() == 0.f && !w.linear_attention;
  // An unquantized qkv with a bias keeps its fp32 sums for the bias (kernels/bias_add.h).
  const bool biased = w.qkv_bias.size() > 0 && !options_.ablate_linears;
  if (fused && !w.quantized_qkv()) {
    // The previous layer's MLP output (pending_residual) joins the residual stream here.
    SkinnyGemmParams g = normed_linear(pending_residual ? mlp_out_.get() : nullptr,
                                       w.input_norm.get(), w.qkv.get(), qkv_.get(), qkv_w);
    if (biased) g.y = qkv_f32_.get(), g.y_f32 = true;
    if (!options_.ablate_linears) {
      g.probe = probe("qkv");
      launch_skinny_gemm(g, s);
    }
    if (pending_residual) {
      cur_ = 1 - cur_;
      capture(tr, point_of(layer_prefix(last_layer_), point::kResidual), resid(), Elem::kBf16, t,
              hd, hd, s);
    }
    last_layer_ = l;
    capture(tr, point_of(p, point::kInputNorm), h_.get(), Elem::kBf16, t, hd, hd, s);
  } else {
    if (pending_residual)
      close_residual(tr, w.input_norm.get(), h_.get(), w.input_norm_bias.get());
    else {
      launch_rms_norm({.x = resid(),
                       .weight = w.input_norm.get(),
                       .out = h_.get(),
                       .rows = t,
                       .dim = hd,
                       .row_stride = hd,
                       .eps = eps,
                       .bias = w.input_norm_bias.get(),
                       .weight_offset = model_.norm_offset()},
                      s);
    }
    last_layer_ = l;
    capture(tr, point_of(p, point::kInputNorm), h_.get(), Elem::kBf16, t, hd, hd, s);
    if (w.linear_attention) {
      // (decoder_linear_attention.cpp projects h_ itself)
    } else if (biased)
      linear(h_.get(), w.qkv.get(), qkv_f32_.get(), true, t, qkv_w, hd, nullptr, probe("qkv"));
    else if (!options_.ablate_linears) {
      // A quantized qkv in the checkpoint's row order (Qwen3.5) is gathered into the kernels' row.
      const bool gather = w.qkv_q && model_.qkv_sources.size() > 0;
      project(w.qkv_q.get(), w.qkv.get(), h_.get(), gather ? qkv_raw_.get() : qkv_.get(), qkv_w, hd,
              "qkv", tr, point_of(p, point::kQkvProj));
      if (gather)
        launch_column_gather({.src = qkv_raw_.get(),
                              .dst = qkv_.get(),
                              .sources = model_.qkv_sources.get(),
                              .rows = t,
                              .cols = qkv_w,
                              .src_stride = qkv_w,
                              .dst_stride = qkv_w},
                             s);
    }
  }
  if (w.linear_attention) {
    linear_attention(l, tr);
  } else {
    if (biased) launch_bias_to_bf16(qkv_f32_.get(), w.qkv_bias.get(), qkv_.get(), t, qkv_w, s);
    // A gated q_proj's point is its own row order ([q | gate] per head, then k, v): qkv_cols_.
    capture(tr, point_of(p, point::kAttnQkv), qkv_.get(), Elem::kBf16, t, qkv_w, qkv_w, s,
            qkv_cols_);
    attention(l, tr);
    if (model_.attn_gate()) {  // core * sigmoid(gate): the gate rows after v
      launch_sigmoid_gate({.x = core_.get(),
                           .gate = qkv_.get() + c.q_size() + 2 * c.kv_size(),
                           .gate_stride = qkv_w,
                           .rows = t,
                           .cols = q},
                          s);
      capture(tr, point_of(p, point::kAttnGated), core_.get(), Elem::kBf16, t, q, q, s, core_cols_);
    }
    if (!options_.ablate_linears)
      project(w.o_proj_q.get(), w.o_proj.get(), core_.get(), attn_out_.get(), hd, q, "o_proj", tr,
              point_of(p, point::kOProj));
  }
  if (comm_) reduce_partial(attn_out_.get());
  capture(tr, point_of(p, point::kAttnOut), attn_out_.get(), Elem::kBf16, t, hd, hd, s);
  const int64_t in = c.intermediate;
  if (fused && !w.moe && !w.quantized_gate_up()) {  // (fused: plain norms only)
    // post-attention add + norm, gate_up and SiLU-and-mul in one launch
    SkinnyGemmParams g =
        normed_linear(attn_out_.get(), w.post_norm.get(), w.gate_up.get(), act_.get(), 2 * in);
    g.silu_mul = true;
    if (tr && tr->wants(point_of(p, point::kMlpGateUp))) g.gate_up_out = gate_up_.get();
    if (!options_.ablate_linears) {
      g.probe = probe("gate_up");
      launch_skinny_gemm(g, s);
    }
    cur_ = 1 - cur_;
    capture(tr, point_of(p, point::kPostAttnNorm), h_.get(), Elem::kBf16, t, hd, hd, s);
    capture(tr, point_of(p, point::kMlpGateUp), gate_up_.get(), Elem::kBf16, t, 2 * in, 2 * in, s,
            gate_up_cols_);
    capture(tr, point_of(p, point::kMlpAct), act_.get(), Elem::kBf16, t, in, in, s, act_cols_);
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
                     .bias = w.post_norm_bias.get(),
                     .weight_offset = model_.norm_offset()},
                    s);
    capture(tr, point_of(p, point::kPostAttnNorm), h_.get(), Elem::kBf16, t, hd, hd, s);
    if (w.moe) {
      moe_layer(l, tr);
      return;
    }
    if (!options_.ablate_linears)
      project(w.gate_up_q.get(), w.gate_up.get(), h_.get(), gate_up_.get(), 2 * in, hd, "gate_up",
              tr, point_of(p, point::kGateUpProj));
    capture(tr, point_of(p, point::kMlpGateUp), gate_up_.get(), Elem::kBf16, t, 2 * in, 2 * in, s,
            gate_up_cols_);
    launch_silu_and_mul({gate_up_.get(), act_.get(), t, in}, s);
    capture(tr, point_of(p, point::kMlpAct), act_.get(), Elem::kBf16, t, in, in, s, act_cols_);
  }
  if (!options_.ablate_linears)
    project(w.down_q.get(), w.down.get(), act_.get(), mlp_out_.get(), hd, in, "down", tr,
            point_of(p, point::kDownProj));
  if (comm_) reduce_partial(mlp_out_.get());
  capture(tr, point_of(p, point::kMlpOut), mlp_out_.get(), Elem::kBf16, t, hd, hd, s);
}

}  // namespace qparity::gpu
