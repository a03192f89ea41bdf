// The decoder's attention block (decoder.h): the qkv rows -> q/k norm (Qwen3), RoPE, the KV-cache
// write and softmax(QK^T)V into core_, with the attn.* capture points. Decode-sized batches run
// it as one decode_attention launch a layer; larger batches as attention_prologue, then the
// query-tiled prefill kernel (a sequence with several rows) or the per-token paged kernel.
#include <cmath>
#include "core/capture/capture_points.h"

#include "core/capture/trace.h"
#include "gpu_engine/decoder.h"
#include "gpu_engine/kernels/attention_prologue.h"
#include "gpu_engine/kernels/decode_attention.h"
#include "gpu_engine/kernels/paged_attention.h"
#include "gpu_engine/kernels/prefill_attention.h"

namespace qparity::gpu {

void Decoder::attention(int64_t l, Trace* tr) {
  const ModelConfig& c = model_.kcfg();
  const int64_t t = in_.t;
  const int64_t q = c.q_size(), kv = c.kv_size(), qkv_w = model_.qkv_rows();
  const float eps = static_cast<float>(c.rms_norm_eps);
  cudaStream_t s = stream_;
  const GpuLayerWeights& w = model_.layers[static_cast<size_t>(l)];
  const std::string p = layer_prefix(l);
  __nv_bfloat16* qp = qkv_.get();
  __nv_bfloat16* kp = qkv_.get() + q;
  const KvCacheShape& ks = cache_.shape();
  const bool want_normed =
      c.has_qk_norm && tr &&
      (tr->wants(point_of(p, point::kAttnQNorm)) || tr->wants(point_of(p, point::kAttnKNorm)));
  // The model's own head_dim sets the softmax scale and the q/k norm's divisor; a zero-padded
  // kernel head_dim (shape_padding.h) changes neither.
  const int64_t head_dim = model_.cfg.head_dim;
  const float scale = static_cast<float>(1.0 / std::sqrt(static_cast<double>(head_dim)));
  const int64_t norm_dim = head_dim == c.head_dim ? 0 : head_dim;
  // Decode-sized: norm, RoPE, cache write and attention in one launch (an image prompt's M-RoPE
  // rows, different per frequency, take the prologue's path at any size).
  if (t <= kSkinnyMaxM && !in_.mrope) {
    DecodeAttentionParams da;
    da.qkv = qp, da.qkv_stride = qkv_w, da.eps = eps, da.norm_offset = model_.norm_offset();
    da.q_norm = c.has_qk_norm ? w.q_norm.get() : nullptr;
    da.k_norm = c.has_qk_norm ? w.k_norm.get() : nullptr;
    da.positions = in_.positions, da.seq = in_.slots, da.rope_positions = in_.rope_positions;
    da.inv_freq = model_.inv_freq.get(), da.rope_scaling = model_.rope_scaling;
    da.k_cache = cache_.k(l), da.v_cache = cache_.v(l), da.block_table = cache_.block_table();
    da.kv = w.kv.quant;
    da.block_size = ks.block_size, da.max_blocks_per_seq = ks.max_blocks_per_seq;
    da.token_table = in_.token_tables;
    da.out = core_.get(), da.out_stride = q;
    const bool want_roped = tr && (tr->wants(point_of(p, point::kAttnRopeQ)) ||
                                   tr->wants(point_of(p, point::kAttnRopeK)));
    da.normed_out = want_normed ? qk_normed_.get() : nullptr;
    da.rope_out = want_roped ? qk_roped_.get() : nullptr;
    da.tokens = t, da.num_heads = c.num_heads, da.num_kv_heads = c.num_kv_heads;
    da.head_dim = c.head_dim, da.scale = scale, da.norm_dim = norm_dim;
    da.chunk = attn_chunk_, da.max_chunks = attn_max_chunks_;
    da.partial_acc = attn_partial_acc_.get(), da.partial_ml = attn_partial_ml_.get();
    da.chunks_done = attn_chunks_done_.get();
    if (options_.attention_stages) da.stages = decode_attention_stage_buffer();
    if (!options_.ablate_attention) {
      da.probe = probe("attention");
      launch_decode_attention(da, s);
    }
    if (want_normed) {
      capture(tr, point_of(p, point::kAttnQNorm), qk_normed_.get(), Elem::kBf16, t, q, q + kv, s,
              q_cols_);
      capture(tr, point_of(p, point::kAttnKNorm), qk_normed_.get() + q, Elem::kBf16, t, kv, q + kv,
              s, k_cols_);
    }
    capture(tr, point_of(p, point::kAttnRopeQ), qk_roped_.get(), Elem::kBf16, t, q, q + kv, s,
            q_cols_);
    capture(tr, point_of(p, point::kAttnRopeK), qk_roped_.get() + q, Elem::kBf16, t, kv, q + kv, s,
            k_cols_);
    capture_kv_cache(l, tr);
    capture(tr, point_of(p, point::kAttnCore), core_.get(), Elem::kBf16, t, q, q, s, core_cols_);
    return;
  }
  // Larger batches: q/k norm, RoPE and the cache write in one launch, then attention.
  const AttentionPrologueParams pro{.qkv = qp,
                                    .row_stride = qkv_w,
                                    .q_norm = c.has_qk_norm ? w.q_norm.get() : nullptr,
                                    .k_norm = c.has_qk_norm ? w.k_norm.get() : nullptr,
                                    .eps = eps,
                                    .norm_offset = model_.norm_offset(),
                                    .normed_out = want_normed ? qk_normed_.get() : nullptr,
                                    .positions = in_.positions,
                                    .mrope = in_.mrope,
                                    .mrope_rows = in_.mrope ? model_.mrope_rows.get() : nullptr,
                                    .rope_positions = in_.rope_positions,
                                    .inv_freq = model_.inv_freq.get(),
                                    .rope_scaling = model_.rope_scaling,
                                    .k_cache = cache_.k(l),
                                    .v_cache = cache_.v(l),
                                    .kv = w.kv.quant,
                                    .block_table = cache_.block_table(),
                                    .seq = in_.slots,
                                    .tokens = t,
                                    .num_heads = c.num_heads,
                                    .num_kv_heads = c.num_kv_heads,
                                    .head_dim = c.head_dim,
                                    .block_size = ks.block_size,
                                    .max_blocks_per_seq = ks.max_blocks_per_seq,
                                    .norm_dim = norm_dim};
  if (!options_.ablate_attention) launch_attention_prologue(pro, s);
  if (want_normed) {
    capture(tr, point_of(p, point::kAttnQNorm), qk_normed_.get(), Elem::kBf16, t, q, q + kv, s,
            q_cols_);
    capture(tr, point_of(p, point::kAttnKNorm), qk_normed_.get() + q, Elem::kBf16, t, kv, q + kv, s,
            k_cols_);
  }
  capture(tr, point_of(p, point::kAttnRopeQ), qp, Elem::kBf16, t, q, qkv_w, s, q_cols_);
  capture(tr, point_of(p, point::kAttnRopeK), kp, Elem::kBf16, t, kv, qkv_w, s, k_cols_);
  if (options_.ablate_attention) {
    // a timing study: no attention
  } else if (in_.tiled_attention &&
             (w.kv.quant.format == KvCacheFormat::kBf16 || w.kv.quant.read_bf16)) {
    // The tensor-core kernel takes bf16 operands: a cache read in fp32 goes to the paged kernel.
    PrefillAttentionParams pa;
    pa.q = qp, pa.q_stride = qkv_w, pa.k_cache = cache_.k(l), pa.v_cache = cache_.v(l);
    pa.kv = w.kv.quant;
    pa.block_table = cache_.block_table(), pa.seq = in_.slots, pa.pos = in_.positions;
    pa.tiles = in_.tiles, pa.max_tiles = in_.attention_tiles, pa.out = core_.get();
    pa.out_stride = q, pa.num_heads = c.num_heads, pa.num_kv_heads = c.num_kv_heads;
    pa.head_dim = c.head_dim, pa.block_size = ks.block_size;
    pa.max_blocks_per_seq = ks.max_blocks_per_seq, pa.scale = scale;
    launch_prefill_attention(pa, s);
  } else {
    // Blocks enough without splitting keys: one chunk covering max_context.
    launch_paged_attention({.q = qp,
                            .q_stride = qkv_w,
                            .k_cache = cache_.k(l),
                            .v_cache = cache_.v(l),
                            .block_table = cache_.block_table(),
                            .seq = in_.slots,
                            .pos = in_.positions,
                            .out = core_.get(),
                            .out_stride = q,
                            .tokens = t,
                            .num_heads = c.num_heads,
                            .num_kv_heads = c.num_kv_heads,
                            .head_dim = c.head_dim,
                            .block_size = ks.block_size,
                            .max_blocks_per_seq = ks.max_blocks_per_seq,
                            .scale = scale,
                            .chunk = attn_whole_,
                            .max_chunks = 1,
                            .kv = w.kv.quant},
                           s);
  }
  capture_kv_cache(l, tr);
  capture(tr, point_of(p, point::kAttnCore), core_.get(), Elem::kBf16, t, q, q, s, core_cols_);
}

void Decoder::capture_kv_cache(int64_t l, Trace* tr) {
  const std::string p = layer_prefix(l);
  if (!tr || cache_.format(l) == KvCacheFormat::kBf16 ||
      !(tr->wants(point_of(p, point::kAttnKCache)) || tr->wants(point_of(p, point::kAttnVCache))))
    return;
  const ModelConfig& c = model_.kcfg();
  const int64_t t = in_.t, kv = c.kv_size();
  const KvCacheShape& ks = cache_.shape();
  launch_kv_cache_read({.k_cache = cache_.k(l),
                        .v_cache = cache_.v(l),
                        .k = kv_read_.get(),
                        .v = kv_read_.get() + t * kv,
                        .k_stride = kv,
                        .v_stride = kv,
                        .block_table = cache_.block_table(),
                        .seq = in_.slots,
                        .pos = in_.positions,
                        .tokens = t,
                        .num_kv_heads = c.num_kv_heads,
                        .head_dim = c.head_dim,
                        .block_size = ks.block_size,
                        .max_blocks_per_seq = ks.max_blocks_per_seq,
                        .kv = model_.layers[static_cast<size_t>(l)].kv.quant},
                       stream_);
  capture(tr, point_of(p, point::kAttnKCache), kv_read_.get(), Elem::kBf16, t, kv, kv, stream_,
          k_cols_);
  capture(tr, point_of(p, point::kAttnVCache), kv_read_.get() + t * kv, Elem::kBf16, t, kv, kv,
          stream_, v_cols_);
}

}  // namespace qparity::gpu
