#include "gpu_engine/gpu_model.h"

#include <chrono>
#include <functional>
#include <ostream>

#include "core/error.h"
#include "core/safetensors/checkpoint.h"
#include "gpu_engine/cuda_check.h"
#include "gpu_engine/kernels/random_init.h"
#include "gpu_engine/staged_upload.h"
#include "reference_cpu/layers/rope.h"

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

bool looks_quantized(const std::string& name) {
  for (const char* suffix : {"weight_scale", "weight_packed", "weight_zero_point", "input_scale",
                             "weight_offset", "deq_scale", "quant_bias", "input_offset",
                             "weight_shape", "weight_global_scale", "weight_scale_2"})
    if (name.size() >= std::string_view(suffix).size() &&
        name.compare(name.size() - std::string_view(suffix).size(), std::string::npos, suffix) == 0)
      return true;
  return false;
}

}  // namespace

std::unique_ptr<GpuModel> load_gpu_model(const fs::path& dir, std::ostream* progress) {
  const auto t0 = std::chrono::steady_clock::now();
  auto m = std::make_unique<GpuModel>();
  m->dir = dir;
  m->cfg = load_model_config(dir / "config.json");
  const ModelConfig& c = m->cfg;
  const std::string where = (dir / "config.json").string();
  if (c.attention_bias || c.mlp_bias)
    throw Error(where, "attention_bias / mlp_bias: the GPU engine has no bias path yet");
  if (c.hidden_act != "silu")
    throw Error(where, "hidden_act '" + c.hidden_act + "': the GPU engine implements silu");
  const Checkpoint ck = Checkpoint::open(dir);
  for (const auto& [name, ref] : ck.tensors())
    if (looks_quantized(name))
      throw Error(ck.root().string(),
                  "tensor " + name +
                      " belongs to a quantized checkpoint; the GPU engine runs "
                      "unquantized (BF16 / F16 / F32) checkpoints in this version");

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
    plan.push_back({&l.qkv,
                    {{p + "self_attn.q_proj.weight", {q, h}},
                     {p + "self_attn.k_proj.weight", {kv, h}},
                     {p + "self_attn.v_proj.weight", {kv, h}}}});
    plan.push_back({&l.o_proj, {{p + "self_attn.o_proj.weight", {h, q}}}});
    if (c.has_qk_norm) {
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
  const reference::Rope rope(c);
  m->inv_freq = DeviceBuffer<double>(rope.inv_freq());
  m->rope_scaling = rope.attention_scaling();
  if (progress)
    *progress << "qparity engine: " << dir.string() << ": " << plan.size() << " buffers, "
              << (m->weight_bytes >> 20) << " MiB of bf16 weights allocated\n";

  // ---- weights ----
  StagedUploader up;
  for (const Pending& pb : plan) {
    uint64_t offset = 0;
    for (const Part& part : pb.parts) {
      const TensorRef& t = ck.at(part.name);
      up.upload_bf16(pb.buffer->get() + offset, t.bytes(), t.info->dtype, part.name);
      offset += elements(part.shape);
    }
  }
  up.finish();
  if (progress)
    *progress << "qparity engine: weights uploaded in "
              << std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count()
              << " s\n";
  return m;
}

std::unique_ptr<GpuModel> random_gpu_model(const ModelConfig& c, uint64_t seed) {
  auto m = std::make_unique<GpuModel>();
  m->cfg = c;
  const size_t h = static_cast<size_t>(c.hidden), q = static_cast<size_t>(c.q_size()),
               kv = static_cast<size_t>(c.kv_size()), d = static_cast<size_t>(c.head_dim),
               in = static_cast<size_t>(c.intermediate), e = static_cast<size_t>(c.num_experts),
               mi = static_cast<size_t>(c.moe_intermediate_size), v = static_cast<size_t>(c.vocab);
  uint64_t stream_seed = seed;
  const auto make = [&](Bf16Buffer& b, size_t n, float mean) {
    b = Bf16Buffer(n);
    launch_fill_random_bf16(b.get(), static_cast<int64_t>(n), mean, 0.02f, ++stream_seed, nullptr);
    m->weight_bytes += n * 2;
  };
  make(m->embed, v * h, 0.f);
  make(m->final_norm, h, 1.f);
  if (!c.tie_word_embeddings) make(m->lm_head_own, v * h, 0.f);
  m->lm_head = c.tie_word_embeddings ? m->embed.get() : m->lm_head_own.get();
  m->layers.resize(static_cast<size_t>(c.num_layers));
  for (int64_t i = 0; i < c.num_layers; ++i) {
    GpuLayerWeights& l = m->layers[static_cast<size_t>(i)];
    make(l.input_norm, h, 1.f);
    make(l.post_norm, h, 1.f);
    make(l.qkv, (q + 2 * kv) * h, 0.f);
    make(l.o_proj, h * q, 0.f);
    if (c.has_qk_norm) {
      make(l.q_norm, d, 1.f);
      make(l.k_norm, d, 1.f);
    }
    l.moe = c.is_moe_layer(i);
    if (l.moe) {
      make(l.router, e * h, 0.f);
      make(l.w13, e * 2 * mi * h, 0.f);
      make(l.w2, e * h * mi, 0.f);
    } else {
      make(l.gate_up, 2 * in * h, 0.f);
      make(l.down, h * in, 0.f);
    }
  }
  const reference::Rope rope(c);
  m->inv_freq = DeviceBuffer<double>(rope.inv_freq());
  m->rope_scaling = rope.attention_scaling();
  QPARITY_CUDA_CHECK(cudaDeviceSynchronize());
  return m;
}

}  // namespace qparity::gpu
