#include "gpu_engine/planned_model_loader.h"

#include <chrono>
#include <functional>
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
#include "schemes/loading/weight_loader.h"
#include "schemes/method/method_factory.h"
#include "schemes/method/tensor_decode.h"
#include "schemes/method/unquantized.h"

namespace qparity::gpu {

namespace fs = std::filesystem;

bool plan_quantizes_anything(const QuantPlan& plan) {
  for (const PlanEntry& e : plan)
    // A sparse-compressed weight is decompressed by the host loader (sparse_weight.h) as well.
    if (e.quantized() || !e.sparsity.empty() || !e.transforms.empty() ||
        (e.role == ModuleRole::kNorm && e.scheme))
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
    if (!e.transforms.empty())
      throw Error(e.prefix, "an online " + to_string(e.transforms.front().location) + " " +
                                to_string(e.transforms.front().type) + " transform (" +
                                e.transforms.front().key +
                                ") is not run on the GPU yet (the reference applies it); the "
                                "engine never runs a rotated layer without its rotation");
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

// The same, known from the plan before any method is built (what WeightLoader will make).
bool runs_bf16(const QuantPlan& plan, const reference::LinearLayer& ll, Dialect dialect) {
  return reference::method_config(plan.method_for(ll.plan_entry), dialect).scheme.kind ==
         SchemeKind::kBf16;
}

const reference::UnquantizedLinearMethod& unquantized(const reference::LinearMethod& lm) {
  const auto* u = dynamic_cast<const reference::UnquantizedLinearMethod*>(&lm);
  if (!u) throw Error(lm.shape().prefix, "scheme bf16 without the unquantized method");
  return *u;
}

// An unquantized method's weight of expert e as the checkpoint stored it, each partition
// converted to bf16 on the way up (BF16 copied; F16 / F32 rounded to nearest even once, the
// rounding upload_values applied to their exactly decoded values before).
void upload_stored(StagedUploader& up, __nv_bfloat16* dst, const reference::LinearMethod& lm,
                   int64_t e) {
  const reference::UnquantizedLinearMethod& u = unquantized(lm);
  const auto& s = lm.shape();
  for (int64_t p = 0; p < s.partition_count(); ++p) {
    const reference::HostTensor& t = u.stored_weight(p, e);
    up.upload_bf16(dst + static_cast<size_t>(s.partition_offset(p) * s.in_features), t.bytes,
                   t.dtype, lm.where("weight", p, e));
  }
}

// The dense weight of an unquantized method, experts stacked in order.
Bf16Buffer dense_buffer(const reference::LinearMethod& lm, size_t& bytes) {
  const auto& s = lm.shape();
  const size_t per = static_cast<size_t>(s.out_features() * s.in_features);
  Bf16Buffer b(per * static_cast<size_t>(s.expert_count()));
  StagedUploader up;
  for (int64_t e = 0; e < s.expert_count(); ++e)
    upload_stored(up, b.get() + per * static_cast<size_t>(e), lm, e);
  up.finish();
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
  StagedUploader up;
  size_t at = 0;
  for (const reference::LinearMethod* lm : parts) {
    upload_stored(up, b.get() + at, *lm, 0);
    at += static_cast<size_t>(lm->shape().out_features() * lm->shape().in_features);
  }
  up.finish();
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

// Qwen3.5's gated attention, q / k rows in the checkpoint's order (the loader leaves them for a
// quantized plan): an unquantized qkv's rows moved into the kernels' [q | k | v | gate] row here;
// a quantized method's output gathered into it by the decoder (qkv_sources).
void place_gated_qkv(const reference::LinearMethod& lm, const ModelConfig& c, GpuLayerWeights& l,
                     GpuModel& m, const GpuMethodOptions& o) {
  const std::vector<int32_t> sources = kernel_qkv_sources(c);
  if (is_bf16_method(lm)) {
    const reference::UnquantizedLinearMethod& u = unquantized(lm);
    const auto& s = lm.shape();
    const int64_t k = s.in_features;
    // Each kernel row decoded exactly from its partition and rounded once to bf16, as the bf16
    // upload rounds it; host memory is the bf16 rows, not an fp64 copy.
    std::vector<uint16_t> codes(sources.size() * static_cast<size_t>(k));
    std::vector<double> row(static_cast<size_t>(k));
    for (size_t r = 0; r < sources.size(); ++r) {
      int64_t src = sources[r], p = 0;
      while (src >= s.partitions.at(static_cast<size_t>(p)))
        src -= s.partitions[static_cast<size_t>(p++)];
      const reference::HostTensor& t = u.stored_weight(p, 0);
      reference::decode_to_double(t.dtype, t.bytes, static_cast<uint64_t>(src * k), row,
                                  lm.where("weight", p, 0));
      for (int64_t j = 0; j < k; ++j)
        codes[r * static_cast<size_t>(k) + static_cast<size_t>(j)] =
            codec::double_to_bf16(row[static_cast<size_t>(j)]);
    }
    l.qkv = Bf16Buffer(codes.size());
    QPARITY_CUDA_CHECK(
        cudaMemcpy(l.qkv.get(), codes.data(), codes.size() * 2, cudaMemcpyHostToDevice));
    m.weight_bytes += l.qkv.bytes();
    return;
  }
  l.qkv_q = make_gpu_linear_method(lm, o);
  m.weight_bytes += l.qkv_q->device_bytes();
  if (m.qkv_sources.size() == 0) m.qkv_sources = DeviceBuffer<int32_t>(sources);
}

// The GPU buffers of one decoder layer, from its processed host weights.
void place_layer(const reference::LayerWeights& hl, const ModelConfig& c, GpuModel& m,
                 const GpuMethodOptions& o,
                 const std::function<Bf16Buffer(const reference::NormWeights&, const std::string&,
                                                DeviceBuffer<float>*)>& norm) {
  GpuLayerWeights& l = m.layers[static_cast<size_t>(hl.index)];
  const std::string p = "model.layers." + std::to_string(hl.index);
  l.input_norm = norm(hl.input_norm, p + ".input_layernorm", &l.input_norm_bias);
  l.post_norm = norm(hl.post_attention_norm, p + ".post_attention_layernorm", &l.post_norm_bias);
  if (hl.linear_attn) {
    // Qwen3.5's Gated DeltaNet: its projections unquantized (check_gpu_can_run), lin_in as the
    // bf16 loader stacks it; conv, A_log, dt_bias and the gated norm: attach_linear_attention.
    const reference::LinearAttentionBlock& la = *hl.linear_attn;
    l.linear_attention = true;
    l.lin_in = dense_rows_buffer({la.qkvz.get(), la.ba.get()}, m.weight_bytes);
    l.lin_out = dense_rows_buffer({la.out_proj.get()}, m.weight_bytes);
  } else {
    if (hl.attn.q_norm) l.q_norm = norm(*hl.attn.q_norm, p + ".self_attn.q_norm", nullptr);
    if (hl.attn.k_norm) l.k_norm = norm(*hl.attn.k_norm, p + ".self_attn.k_norm", nullptr);
    if (c.attn_output_gate)
      place_gated_qkv(*hl.attn.qkv, c, l, m, o);
    else
      place(*hl.attn.qkv, l.qkv, l.qkv_q, o, m.weight_bytes);
    place(*hl.attn.o_proj, l.o_proj, l.o_proj_q, o, m.weight_bytes);
  }
  l.moe = hl.moe.has_value();
  if (l.moe) {
    l.router = dense_buffer(*hl.moe->router, m.weight_bytes);
    // Each stack bf16 (stacked for the grouped kernels) or one GPU method per expert.
    const auto stack = [&](const reference::LinearMethod& lm, Bf16Buffer& dense,
                           std::vector<std::unique_ptr<GpuLinearMethod>>& q) {
      if (is_bf16_method(lm)) {
        dense = dense_buffer(lm, m.weight_bytes);
        return;
      }
      for (int64_t x = 0; x < lm.shape().num_experts; ++x) {
        q.push_back(make_gpu_linear_method(lm, o, x));
        m.weight_bytes += q.back()->device_bytes();
      }
    };
    stack(*hl.moe->w13, l.w13, l.w13_q);
    stack(*hl.moe->w2, l.w2, l.w2_q);
  } else {
    place(*hl.mlp->gate_up, l.gate_up, l.gate_up_q, o, m.weight_bytes);
    place(*hl.mlp->down, l.down, l.down_q, o, m.weight_bytes);
  }
}

// A quantized linear is never padded (its layout is its kernel's): refused from the plan, before
// any tensor is read.
void require_quantized_unpadded(const ModelConfig& c, const QuantPlan& plan,
                                const std::vector<reference::LinearLayer>& linears,
                                Dialect dialect) {
  using K = reference::LinearLayerKind;
  for (const reference::LinearLayer& ll : linears) {
    const char* name = nullptr;
    switch (ll.kind) {
      case K::kQkv:
        name = "self_attn.qkv_proj";
        break;
      case K::kOProj:
        name = "self_attn.o_proj";
        break;
      case K::kGateUp:
        name = "mlp.gate_up_proj";
        break;
      case K::kDown:
        name = "mlp.down_proj";
        break;
      case K::kExpertsW13:
      case K::kExpertsW2:
        name = "mlp.experts";
        break;
      case K::kRouter:
      case K::kLmHead:
      case K::kLinearAttnQkvz:
      case K::kLinearAttnBa:
      case K::kLinearAttnOut:  // (Qwen3.5: never padded, shape_padding.h)
        break;
    }
    if (name) require_unpadded(c, ll.layer, name, !runs_bf16(plan, ll, dialect));
  }
}

double seconds_since(std::chrono::steady_clock::time_point t) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t).count();
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
  m->cfg = std::move(cfg);
  m->scheme = plan_scheme_summary(plan);
  m->dialect = options.dialect;
  const ModelConfig& c = m->cfg;
  // The shared lifecycle (schemes/loading/weight_loader.h: every tensor routed, every shape and
  // dtype checked, every method processed), one decoder layer at a time: its host weights are
  // freed once its buffers are on the device, so host memory beyond the memory map is one
  // layer's processed weights (and the lm_head's checkpoint copy).
  const reference::WeightContext ctx{&c, &plan, options.dialect, reference::model_dtype_of(c),
                                     std::nullopt};
  if (c.tie_word_embeddings && !ck->contains("model.embed_tokens.weight"))
    throw Error(ck->root().string() + ": tensor 'model.embed_tokens.weight'", "missing");
  const std::vector<reference::LinearLayer> linears = reference::linear_layers(c, ctx.model_dtype);
  require_quantized_unpadded(c, plan, linears, options.dialect);
  const reference::TensorsByLayer names = reference::tensors_by_layer(*ck, c.num_layers);
  reference::check_every_layer_tensor_used(ck, ctx, linears, names);
  // The shape rules that need no weight (a dialect's divisibility and fused-partition alignment)
  // for every layer before anything is read or allocated: a checkpoint refused at its last layer
  // is refused before the first upload, as the whole-model load refused it.
  for (int64_t i = 0; i < c.num_layers; ++i) {
    reference::LayerWeights hl;
    hl.index = i;
    reference::WeightLoader(ck, ctx, linears).build_layer(hl);
    for (const reference::LinearMethod* lm : reference::linear_methods(hl))
      lm->check_shape();
  }
  double host_s = 0;
  {
    const std::string name = "model.embed_tokens.weight";
    const TensorRef& t = ck->at(name);
    m->embed = Bf16Buffer(static_cast<size_t>(c.vocab * c.hidden));
    StagedUploader up;
    up.upload_bf16(m->embed.get(), t.bytes(), t.info->dtype, name);
    up.finish();
    m->weight_bytes += m->embed.bytes();
  }
  // Zero-centred norms (Qwen3.5) from the checkpoint, the others from the processed weights
  // (where smooth-quant folds left their weight and bias).
  const auto norm = [&](const reference::NormWeights& w, const std::string& prefix,
                        DeviceBuffer<float>* bias) {
    Bf16Buffer b =
        c.zero_centred_norms ? checkpoint_norm(*ck, w, prefix) : norm_buffer(w, prefix, bias);
    // (counted as the bf16 loader counts them: every weight the device holds)
    m->weight_bytes += b.bytes() + (bias ? bias->size() * sizeof(float) : 0);
    return b;
  };
  {
    const auto th = std::chrono::steady_clock::now();
    reference::TopWeights top;
    reference::WeightLoader loader(ck, ctx, linears);
    loader.build_top(top);
    loader.load(names.top);
    host_s += seconds_since(th);
    m->final_norm = norm(top.final_norm, "model.norm", nullptr);
    const bool tied = c.tie_word_embeddings && !ck->contains("lm_head.weight");
    if (tied) {
      m->lm_head = m->embed.get();
    } else {
      m->lm_head_own = dense_buffer(*top.lm_head, m->weight_bytes);
      m->lm_head = m->lm_head_own.get();
    }
  }
  m->layers.resize(static_cast<size_t>(c.num_layers));
  // The KV-cache methods (a few scales each) wait for the kernels' head layout (pad_for_kernels).
  std::vector<std::unique_ptr<reference::KvCacheMethod>> kv(static_cast<size_t>(c.num_layers));
  for (int64_t i = 0; i < c.num_layers; ++i) {
    const auto th = std::chrono::steady_clock::now();
    reference::LayerWeights hl;
    hl.index = i;
    reference::WeightLoader loader(ck, ctx, linears);
    loader.build_layer(hl);
    loader.load(names.layers[static_cast<size_t>(i)]);
    host_s += seconds_since(th);
    place_layer(hl, c, *m, options.methods, norm);
    if (!hl.linear_attn)  // (a Gated DeltaNet layer's cache slot holds its recurrent state)
      kv[static_cast<size_t>(i)] = std::move(hl.attn.kv);
  }
  attach_rope(*m);
  pad_for_kernels(*m);
  // The caches' parameters in the kernels' (possibly padded) head layout.
  for (size_t i = 0; i < kv.size(); ++i)
    if (kv[i]) m->layers[i].kv = upload_kv_cache(*kv[i], m->kcfg().head_dim);
  QPARITY_CUDA_CHECK(cudaDeviceSynchronize());
  if (progress)
    *progress << "qparity engine: " << (m->weight_bytes >> 20) << " MiB of weights (" << m->scheme
              << ") on the device in " << seconds_since(t0) << " s (" << host_s
              << " s of it reading and processing on the host, one layer at a time)\n";
  return m;
}

}  // namespace qparity::gpu
