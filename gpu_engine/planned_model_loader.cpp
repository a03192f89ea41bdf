#include "gpu_engine/planned_model_loader.h"

#include <chrono>
#include <ostream>
#include <set>

#include "core/codecs/float_format.h"
#include "core/error.h"
#include "core/safetensors/checkpoint.h"
#include "gpu_engine/cuda_check.h"
#include "gpu_engine/quant/upload_util.h"
#include "gpu_engine/rope_layout.h"
#include "gpu_engine/shape_padding.h"
#include "gpu_engine/staged_upload.h"
#include "reference_cpu/models/model_loader.h"

namespace qparity::gpu {

namespace fs = std::filesystem;

bool plan_quantizes_anything(const QuantPlan& plan) {
  for (const PlanEntry& e : plan)
    // A sparse-compressed weight is decompressed by the host loader (sparse_weight.h) as well.
    if (e.quantized() || !e.sparsity.empty() || (e.role == ModuleRole::kNorm && e.scheme))
      return true;
  return false;
}

std::string plan_scheme_summary(const QuantPlan& plan) {
  std::set<std::string> schemes;
  for (const PlanEntry& e : plan)
    if ((e.quantized() && e.role != ModuleRole::kExpertStack) ||
        (e.role == ModuleRole::kNorm && e.scheme))
      schemes.insert(e.scheme_string());
  if (schemes.empty()) return "bf16";
  std::string out;
  for (const auto& s : schemes)
    out += (out.empty() ? "" : "+") + s;
  return out;
}

void check_gpu_can_run(const QuantPlan& plan) {
  for (const PlanEntry& e : plan) {
    if (!e.scheme) continue;
    const std::string scheme = e.scheme_string();
    const std::string why_entry = e.why.file.empty() ? "" : " (from " + e.why.file + ")";
    switch (e.role) {
      case ModuleRole::kLinear: {
        if (!e.quantized() || e.expert >= 0) break;  // experts: judged as their stack
        if (e.prefix.find(".linear_attn.") != std::string::npos)
          throw Error(e.prefix, "scheme " + scheme + why_entry +
                                    ": quantized Gated DeltaNet projections are not on the GPU "
                                    "yet (producers leave them unquantized: llm-compressor's "
                                    "Qwen3.5 recipes ignore linear_attn); the engine never runs "
                                    "a quantized layer as bf16");
        if (e.prefix == "lm_head")
          throw Error(e.prefix, "scheme " + scheme + why_entry +
                                    ": a quantized lm_head is not on the GPU yet; the engine "
                                    "never runs a quantized layer as bf16");
        std::string why;
        if (!gpu_supports_linear_scheme(*e.scheme, &why))
          throw Error(e.prefix, "scheme " + scheme + why_entry + ": " + why +
                                    "; the engine never runs a quantized layer as bf16");
        break;
      }
      case ModuleRole::kExpertStack: {
        std::string why;
        if (e.quantized() && !gpu_supports_expert_scheme(*e.scheme, &why))
          throw Error(e.prefix, "scheme " + scheme + why_entry + ": quantized MoE experts: " + why +
                                    "; the engine never runs a quantized layer as bf16");
        break;
      }
      case ModuleRole::kKvCache:
        if (e.quantized() && e.scheme->kind != SchemeKind::kKvInt8 &&
            e.scheme->kind != SchemeKind::kKvFp8)
          throw Error(e.prefix, "KV-cache scheme " + scheme + why_entry +
                                    " is not on the GPU; the engine never runs a quantized cache "
                                    "as bf16");
        break;
      case ModuleRole::kNorm:
        // A folded transform (smoothquant): the norm's weight and bias run in the engine's
        // RMSNorm (norm_buffer refuses a bias where the engine has none).
        break;
    }
  }
}

namespace {

// fp64 values as bf16 on the device, each rounded once (round to nearest even). Exact for the
// values of a bf16 checkpoint; an F32 / F16 checkpoint's weights are rounded here, as the bf16
// path rounds them at upload.
void upload_values(Bf16Buffer& dst, const std::vector<double>& v, size_t offset = 0) {
  std::vector<uint16_t> codes(v.size());
  for (size_t i = 0; i < v.size(); ++i)
    codes[i] = codec::double_to_bf16(v[i]);
  QPARITY_CUDA_CHECK(
      cudaMemcpy(dst.get() + offset, codes.data(), codes.size() * 2, cudaMemcpyHostToDevice));
}

// A norm's weight as bf16; its bias (anti-outlier / smooth-quant folds) only where the engine
// takes one (`bias` non-null: the decoder layers' input and post-attention norms), as fp32.
Bf16Buffer norm_buffer(const reference::NormWeights& w, const std::string& prefix,
                       DeviceBuffer<float>* bias = nullptr) {
  if (!w.bias.empty()) {
    if (!bias)
      throw Error(prefix + ".bias",
                  "a bias on this norm is not on the GPU (only the decoder "
                  "layers' input and post-attention norms take one)");
    *bias = DeviceBuffer<float>(exact_f32(w.bias, prefix + ".bias"));
  }
  Bf16Buffer b(w.weight.size());
  upload_values(b, w.weight);
  return b;
}

// Qwen3.5's zero-centred norm weight as the checkpoint holds it: the kernels add the 1 in fp32
// (GpuModel::norm_offset), where the host model holds 1 + w.
Bf16Buffer checkpoint_norm(const Checkpoint& ck, const reference::NormWeights& host,
                           const std::string& prefix) {
  const std::string name = prefix + ".weight";
  if (!host.bias.empty())
    throw Error(prefix + ".bias", "a bias on a zero-centred norm is not on the GPU");
  const TensorRef& t = ck.at(name);
  if (t.info->shape != std::vector<uint64_t>{host.weight.size()})
    throw Error(ck.origin(name), "expected shape [" + std::to_string(host.weight.size()) + "]");
  Bf16Buffer b(host.weight.size());
  StagedUploader up;
  up.upload_bf16(b.get(), t.bytes(), t.info->dtype, name);
  up.finish();
  return b;
}

bool is_bf16_method(const reference::LinearMethod& lm) {
  return lm.config().scheme.kind == SchemeKind::kBf16;
}

// The dense weight of an unquantized method, experts stacked in order.
Bf16Buffer dense_buffer(const reference::LinearMethod& lm, size_t& bytes) {
  const auto& s = lm.shape();
  const size_t per = static_cast<size_t>(s.out_features() * s.in_features);
  Bf16Buffer b(per * static_cast<size_t>(s.expert_count()));
  for (int64_t e = 0; e < s.expert_count(); ++e)
    upload_values(b, lm.dequantized_weight(e).data, per * static_cast<size_t>(e));
  bytes += b.bytes();
  return b;
}

// Unquantized methods' weights stacked by rows into one buffer (Qwen3.5's Gated DeltaNet input
// projections: [qkvz | ba] as the bf16 loader's lin_in).
Bf16Buffer dense_rows_buffer(std::initializer_list<const reference::LinearMethod*> parts,
                             size_t& bytes) {
  size_t n = 0;
  for (const reference::LinearMethod* lm : parts) {
    if (!is_bf16_method(*lm))
      throw Error(lm->shape().prefix,
                  "a quantized Gated DeltaNet projection is not on the GPU yet");
    n += static_cast<size_t>(lm->shape().out_features() * lm->shape().in_features);
  }
  Bf16Buffer b(n);
  size_t at = 0;
  for (const reference::LinearMethod* lm : parts) {
    const std::vector<double>& w = lm->dequantized_weight(0).data;
    upload_values(b, w, at);
    at += w.size();
  }
  bytes += b.bytes();
  return b;
}

// One dense-layer linear: bf16 buffer or GPU method.
void place(const reference::LinearMethod& lm, Bf16Buffer& dense,
           std::unique_ptr<GpuLinearMethod>& quant, const GpuMethodOptions& o, size_t& bytes) {
  if (is_bf16_method(lm)) {
    dense = dense_buffer(lm, bytes);
    return;
  }
  quant = make_gpu_linear_method(lm, o);
  bytes += quant->device_bytes();
}

// Qwen3.5's gated attention, q / k rows in the checkpoint's order (model_loader.cpp leaves them
// for a quantized plan): an unquantized qkv's rows moved into the kernels' [q | k | v | gate]
// row here; a quantized method's output gathered into it by the decoder (qkv_sources).
void place_gated_qkv(const reference::LinearMethod& lm, const ModelConfig& c, GpuLayerWeights& l,
                     GpuModel& m, const GpuMethodOptions& o) {
  const std::vector<int32_t> sources = kernel_qkv_sources(c);
  if (is_bf16_method(lm)) {
    const std::vector<double> w = lm.dequantized_weight(0).data;
    const size_t k = static_cast<size_t>(lm.shape().in_features);
    std::vector<double> rows(sources.size() * k);
    for (size_t r = 0; r < sources.size(); ++r)
      std::copy_n(w.begin() + static_cast<std::ptrdiff_t>(static_cast<size_t>(sources[r]) * k), k,
                  rows.begin() + static_cast<std::ptrdiff_t>(r * k));
    l.qkv = Bf16Buffer(rows.size());
    upload_values(l.qkv, rows);
    m.weight_bytes += l.qkv.bytes();
    return;
  }
  l.qkv_q = make_gpu_linear_method(lm, o);
  m.weight_bytes += l.qkv_q->device_bytes();
  if (m.qkv_sources.size() == 0) m.qkv_sources = DeviceBuffer<int32_t>(sources);
}

}  // namespace

std::unique_ptr<GpuModel> load_planned_gpu_model(std::shared_ptr<const Checkpoint> ck,
                                                 const fs::path& dir, ModelConfig cfg,
                                                 QuantPlan plan, const GpuLoadOptions& options,
                                                 std::ostream* progress) {
  const auto t0 = std::chrono::steady_clock::now();
  check_gpu_can_run(plan);
  auto m = std::make_unique<GpuModel>();
  m->dir = dir;
  m->cfg = cfg;
  m->scheme = plan_scheme_summary(plan);
  m->dialect = options.dialect;
  // Steps 1-3 of the lifecycle, shared with the reference (every tensor routed, every shape and
  // dtype checked, an unexpected tensor an Error naming it).
  const std::unique_ptr<reference::CausalLm> host = reference::load_model(
      ck, std::move(cfg), std::move(plan), options.dialect, reference::PrecisionMode::kExact);
  const ModelConfig& c = m->cfg;
  if (progress)
    *progress << "qparity engine: " << dir.string() << ": plan " << m->scheme
              << " loaded and processed on the host in "
              << std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count()
              << " s\n";
  {
    const std::string name = "model.embed_tokens.weight";
    const TensorRef& t = ck->at(name);
    m->embed = Bf16Buffer(static_cast<size_t>(c.vocab * c.hidden));
    StagedUploader up;
    up.upload_bf16(m->embed.get(), t.bytes(), t.info->dtype, name);
    up.finish();
    m->weight_bytes += m->embed.bytes();
  }
  // Zero-centred norms (Qwen3.5) from the checkpoint, the others from the host model (where
  // smooth-quant folds left their weight and bias).
  const auto norm = [&](const reference::NormWeights& w, const std::string& prefix,
                        DeviceBuffer<float>* bias) {
    return c.zero_centred_norms ? checkpoint_norm(*ck, w, prefix) : norm_buffer(w, prefix, bias);
  };
  m->final_norm = norm(host->final_norm(), "model.norm", nullptr);
  const bool tied = c.tie_word_embeddings && !ck->contains("lm_head.weight");
  if (tied) {
    m->lm_head = m->embed.get();
  } else {
    m->lm_head_own = dense_buffer(*host->lm_head(), m->weight_bytes);
    m->lm_head = m->lm_head_own.get();
  }
  // A quantized linear is never padded (its layout is its kernel's): refused before any upload.
  for (const reference::DecoderLayer& hl : host->layers()) {
    if (hl.linear_attn) continue;  // (Qwen3.5: never padded, model_loader.cpp)
    require_unpadded(c, hl.index, "self_attn.qkv_proj", !is_bf16_method(*hl.attn.qkv));
    require_unpadded(c, hl.index, "self_attn.o_proj", !is_bf16_method(*hl.attn.o_proj));
    if (hl.mlp) {
      require_unpadded(c, hl.index, "mlp.gate_up_proj", !is_bf16_method(*hl.mlp->gate_up));
      require_unpadded(c, hl.index, "mlp.down_proj", !is_bf16_method(*hl.mlp->down));
    }
    if (hl.moe)
      require_unpadded(c, hl.index, "mlp.experts",
                       !is_bf16_method(*hl.moe->w13) || !is_bf16_method(*hl.moe->w2));
  }
  m->layers.resize(host->layers().size());
  for (const reference::DecoderLayer& hl : host->layers()) {
    GpuLayerWeights& l = m->layers[static_cast<size_t>(hl.index)];
    const std::string p = "model.layers." + std::to_string(hl.index);
    l.input_norm = norm(hl.input_norm, p + ".input_layernorm", &l.input_norm_bias);
    l.post_norm = norm(hl.post_attention_norm, p + ".post_attention_layernorm", &l.post_norm_bias);
    if (hl.linear_attn) {
      // Qwen3.5's Gated DeltaNet: its projections unquantized (check_gpu_can_run), lin_in as the
      // bf16 loader stacks it; conv, A_log, dt_bias and the gated norm: attach_linear_attention.
      const reference::LinearAttentionBlock& la = *hl.linear_attn;
      l.linear_attention = true;
      l.lin_in = dense_rows_buffer({la.qkvz.get(), la.ba.get()}, m->weight_bytes);
      l.lin_out = dense_rows_buffer({la.out_proj.get()}, m->weight_bytes);
    } else {
      if (hl.attn.q_norm) l.q_norm = norm(*hl.attn.q_norm, p + ".self_attn.q_norm", nullptr);
      if (hl.attn.k_norm) l.k_norm = norm(*hl.attn.k_norm, p + ".self_attn.k_norm", nullptr);
      if (c.attn_output_gate)
        place_gated_qkv(*hl.attn.qkv, c, l, *m, options.methods);
      else
        place(*hl.attn.qkv, l.qkv, l.qkv_q, options.methods, m->weight_bytes);
      place(*hl.attn.o_proj, l.o_proj, l.o_proj_q, options.methods, m->weight_bytes);
    }
    l.moe = hl.moe.has_value();
    if (l.moe) {
      l.router = dense_buffer(*hl.moe->router, m->weight_bytes);
      // Each stack bf16 (stacked for the grouped kernels) or one GPU method per expert.
      const auto stack = [&](const reference::LinearMethod& lm, Bf16Buffer& dense,
                             std::vector<std::unique_ptr<GpuLinearMethod>>& q) {
        if (is_bf16_method(lm)) {
          dense = dense_buffer(lm, m->weight_bytes);
          return;
        }
        for (int64_t x = 0; x < lm.shape().num_experts; ++x) {
          q.push_back(make_gpu_linear_method(lm, options.methods, x));
          m->weight_bytes += q.back()->device_bytes();
        }
      };
      stack(*hl.moe->w13, l.w13, l.w13_q);
      stack(*hl.moe->w2, l.w2, l.w2_q);
    } else {
      place(*hl.mlp->gate_up, l.gate_up, l.gate_up_q, options.methods, m->weight_bytes);
      place(*hl.mlp->down, l.down, l.down_q, options.methods, m->weight_bytes);
    }
  }
  attach_rope(*m);
  pad_for_kernels(*m);
  // The caches' parameters in the kernels' (possibly padded) head layout.
  for (const reference::DecoderLayer& hl : host->layers())
    if (!hl.linear_attn)  // (a Gated DeltaNet layer's cache slot holds its recurrent state)
      m->layers[static_cast<size_t>(hl.index)].kv =
          upload_kv_cache(*hl.attn.kv, m->kcfg().head_dim);
  QPARITY_CUDA_CHECK(cudaDeviceSynchronize());
  if (progress)
    *progress << "qparity engine: " << (m->weight_bytes >> 20) << " MiB of weights (" << m->scheme
              << ") on the device in "
              << std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count()
              << " s\n";
  return m;
}

}  // namespace qparity::gpu
