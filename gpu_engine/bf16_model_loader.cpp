#include "gpu_engine/bf16_model_loader.h"

#include <chrono>
#include <ostream>
#include <set>

#include "core/error.h"
#include "core/safetensors/checkpoint.h"
#include "core/safetensors/language_model_names.h"
#include "gpu_engine/shape_padding.h"
#include "gpu_engine/staged_upload.h"

namespace qparity::gpu {

namespace fs = std::filesystem;

namespace {

// Parts that make up one device buffer: (tensor name, expected shape) in the order they fill it.
struct Part {
  std::string name;
  std::vector<uint64_t> shape;
};

struct Pending {
  Bf16Buffer* buffer;
  std::vector<Part> parts;
};

uint64_t elements(const std::vector<uint64_t>& s) {
  uint64_t n = 1;
  for (uint64_t d : s)
    n *= d;
  return n;
}

std::string shape_text(const std::vector<uint64_t>& s) {
  std::string t = "[";
  for (size_t i = 0; i < s.size(); ++i)
    t += (i ? ", " : "") + std::to_string(s[i]);
  return t + "]";
}

}  // namespace

std::unique_ptr<GpuModel> load_bf16_gpu_model(const Checkpoint& ck, const fs::path& dir,
                                              ModelConfig cfg, std::ostream* progress) {
  const auto t0 = std::chrono::steady_clock::now();
  auto m = std::make_unique<GpuModel>();
  m->dir = dir;
  m->cfg = std::move(cfg);
  const ModelConfig& c = m->cfg;

  // ---- structure: every buffer's parts, checked, then allocated ----
  const uint64_t h = static_cast<uint64_t>(c.hidden), q = static_cast<uint64_t>(c.q_size()),
                 kv = static_cast<uint64_t>(c.kv_size()), d = static_cast<uint64_t>(c.head_dim),
                 inter = static_cast<uint64_t>(c.intermediate),
                 e = static_cast<uint64_t>(c.num_experts),
                 mi = static_cast<uint64_t>(c.moe_intermediate_size),
                 v = static_cast<uint64_t>(c.vocab);
  std::vector<Pending> plan;
  plan.push_back({&m->embed, {{"model.embed_tokens.weight", {v, h}}}});
  plan.push_back({&m->final_norm, {{"model.norm.weight", {h}}}});
  const bool tied = c.tie_word_embeddings && !ck.contains("lm_head.weight");
  if (!tied) plan.push_back({&m->lm_head_own, {{"lm_head.weight", {v, h}}}});
  m->layers.resize(static_cast<size_t>(c.num_layers));
  for (int64_t i = 0; i < c.num_layers; ++i) {
    GpuLayerWeights& l = m->layers[static_cast<size_t>(i)];
    const std::string p = "model.layers." + std::to_string(i) + ".";
    plan.push_back({&l.input_norm, {{p + "input_layernorm.weight", {h}}}});
    plan.push_back({&l.post_norm, {{p + "post_attention_layernorm.weight", {h}}}});
    if (c.is_linear_attention_layer(i)) {
      const LinearAttentionDims& ld = c.linear;
      const uint64_t cd = static_cast<uint64_t>(ld.conv_dim()),
                     vd = static_cast<uint64_t>(ld.value_dim()),
                     hv = static_cast<uint64_t>(ld.num_value_heads);
      const std::string la = p + "linear_attn.";
      l.linear_attention = true;
      plan.push_back({&l.lin_in,
                      {{la + "in_proj_qkv.weight", {cd, h}},
                       {la + "in_proj_z.weight", {vd, h}},
                       {la + "in_proj_b.weight", {hv, h}},
                       {la + "in_proj_a.weight", {hv, h}}}});
      plan.push_back({&l.lin_out, {{la + "out_proj.weight", {h, vd}}}});
    } else {
      // A gated q_proj ([q | gate] rows per head) is uploaded split: q first, the gate after v.
      plan.push_back({&l.qkv,
                      {{p + "self_attn.q_proj.weight", {c.attn_output_gate ? 2 * q : q, h}},
                       {p + "self_attn.k_proj.weight", {kv, h}},
                       {p + "self_attn.v_proj.weight", {kv, h}}}});
      plan.push_back({&l.o_proj, {{p + "self_attn.o_proj.weight", {h, q}}}});
    }
    if (c.has_qk_norm && !c.is_linear_attention_layer(i)) {
      plan.push_back({&l.q_norm, {{p + "self_attn.q_norm.weight", {d}}}});
      plan.push_back({&l.k_norm, {{p + "self_attn.k_norm.weight", {d}}}});
    }
    l.moe = c.is_moe_layer(i);
    if (l.moe) {
      plan.push_back({&l.router, {{p + "mlp.gate.weight", {e, h}}}});
      Pending w13{&l.w13, {}}, w2{&l.w2, {}};
      for (uint64_t x = 0; x < e; ++x) {
        const std::string ep = p + "mlp.experts." + std::to_string(x) + ".";
        w13.parts.push_back({ep + "gate_proj.weight", {mi, h}});
        w13.parts.push_back({ep + "up_proj.weight", {mi, h}});
        w2.parts.push_back({ep + "down_proj.weight", {h, mi}});
      }
      plan.push_back(std::move(w13));
      plan.push_back(std::move(w2));
    } else {
      plan.push_back(
          {&l.gate_up,
           {{p + "mlp.gate_proj.weight", {inter, h}}, {p + "mlp.up_proj.weight", {inter, h}}}});
      plan.push_back({&l.down, {{p + "mlp.down_proj.weight", {h, inter}}}});
    }
  }
  // Every checkpoint tensor has a consumer: anything else is not this model (or is a quantized
  // checkpoint whose quantization config is missing), never silently dropped.
  std::set<std::string> consumed;
  for (const Pending& pb : plan)
    for (const Part& part : pb.parts)
      consumed.insert(part.name);
  for (int64_t i = 0; i < c.num_layers; ++i)  // read by attach_linear_attention (fp32)
    if (c.is_linear_attention_layer(i))
      for (const char* t : {"conv1d.weight", "A_log", "dt_bias", "norm.weight"})
        consumed.insert("model.layers." + std::to_string(i) + ".linear_attn." + t);
  if (c.has_qkv_bias())  // read by attach_qkv_bias (gpu_model.h)
    for (int64_t i = 0; i < c.num_layers; ++i)
      for (const char* proj : {"q_proj", "k_proj", "v_proj"})
        consumed.insert("model.layers." + std::to_string(i) + ".self_attn." + proj + ".bias");
  for (const auto& [name, ref] : ck.tensors())
    // An image-text checkpoint's vision tower is not the engine's (the reference runs it), nor
    // Qwen3.5's multi-token-prediction head.
    if (!consumed.count(name) && !is_unused_by_text(c, name))
      throw Error(ck.root().string() + ": tensor '" + name + "'",
                  "is not used by an unquantized " + std::string(arch_name(c.arch)) +
                      " model (unexpected tensor; a quantized checkpoint needs its quantization "
                      "config: quant_model_description.json or config.json quantization_config)");
  for (Pending& pb : plan) {
    uint64_t n = 0;
    for (const Part& part : pb.parts) {
      const TensorRef& t = ck.at(part.name);  // throws naming the checkpoint and the tensor
      if (t.info->shape != part.shape)
        throw Error(ck.root().string(), "tensor " + part.name + " has shape " +
                                            shape_text(t.info->shape) + ", the config implies " +
                                            shape_text(part.shape));
      n += elements(part.shape);
    }
    *pb.buffer = Bf16Buffer(n);
    m->weight_bytes += n * 2;
  }
  m->lm_head = tied ? m->embed.get() : m->lm_head_own.get();
  attach_rope(*m);
  if (progress)
    *progress << "qparity engine: " << dir.string() << ": " << plan.size() << " buffers, "
              << (m->weight_bytes >> 20) << " MiB of bf16 weights allocated\n";

  // ---- weights ----
  StagedUploader up;
  for (const Pending& pb : plan) {
    uint64_t offset = 0;
    for (const Part& part : pb.parts) {
      const TensorRef& t = ck.at(part.name);
      if (c.attn_output_gate && part.name.ends_with(".self_attn.q_proj.weight")) {
        // Per head [q (d) | gate (d)] rows: q rows to the front, gate rows after k and v.
        const auto bytes = t.bytes();
        const size_t row = bytes.size() / part.shape[0];
        const uint64_t gate_at = q + 2 * kv;
        for (uint64_t head = 0; head < static_cast<uint64_t>(c.num_heads); ++head)
          for (const bool gate : {false, true})
            up.upload_bf16(pb.buffer->get() + ((gate ? gate_at : 0) + head * d) * h,
                           bytes.subspan((2 * head + (gate ? 1 : 0)) * d * row, d * row),
                           t.info->dtype, part.name);
        offset += q * h;  // (its q rows; the gate rows lie beyond v)
        continue;
      }
      up.upload_bf16(pb.buffer->get() + offset, t.bytes(), t.info->dtype, part.name);
      offset += elements(part.shape);
    }
  }
  up.finish();
  pad_for_kernels(*m);
  if (progress)
    *progress << "qparity engine: weights uploaded in "
              << std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count()
              << " s\n";
  return m;
}

}  // namespace qparity::gpu
