#include "schemes/loading/weight_loader.h"

#include <algorithm>
#include <map>

#include "core/error.h"
#include "core/safetensors/language_model_names.h"
#include "schemes/int/pack_quantized_int.h"
#include "schemes/loading/architectures/architectures.h"
#include "schemes/math/numeric.h"
#include "schemes/method/method_factory.h"
#include "schemes/method/sparse_weight.h"

namespace qparity::reference {

namespace {

TensorView view_of(const TensorRef& r) {
  TensorView v;
  v.dtype = r.info->dtype;
  for (uint64_t d : r.info->shape)
    v.shape.push_back(static_cast<int64_t>(d));
  v.bytes = r.bytes();
  return v;
}

bool is_float(DType d) {
  return d == DType::kBF16 || d == DType::kF16 || d == DType::kF32 || d == DType::kF64;
}

// Where one linear shard's checkpoint tensors go.
struct ShardTarget {
  LinearMethod* method = nullptr;
  int64_t partition = 0;
  int64_t expert = 0;
  std::string sparsity;  // the plan entry's: its `weight` may come as sparse parts
};

// An already fused checkpoint module (qkv_proj, gate_up_proj) and the method it fills.
struct FusedTarget {
  LinearMethod* method = nullptr;
  std::string sparsity;
};

// The parts of one sparse-compressed `weight` seen so far (sparse_weight.h).
struct PendingSparse {
  std::string format;
  std::map<std::string, TensorView> parts;
};

// One norm's tensors, resolved once everything is read.
struct NormSlot {
  NormWeights* out = nullptr;
  int64_t dim = 0;
  std::map<std::string, TensorView> found;  // "weight", "bias", "module.weight", "module.bias"
  bool zero_centred = false;                // Qwen3.5: the model multiplies by 1 + weight
};

// A plain float tensor a block reads as fp64 values (Gated DeltaNet conv1d, A_log, dt_bias).
struct ParamSlot {
  std::vector<double>* out = nullptr;
  std::vector<int64_t> shape;
  std::optional<TensorView> found;
};

}  // namespace

class WeightLoader::Impl {
 public:
  Impl(std::shared_ptr<const Checkpoint> ckpt, WeightContext ctx,
       const std::vector<LinearLayer>& linears, bool dry)
      : ckpt_(std::move(ckpt)),
        ctx_(ctx),
        cfg_(*ctx.cfg),
        plan_(*ctx.plan),
        blocks_(blocks_of(*ctx.cfg)),
        linears_(linears),
        dry_(dry) {}

  void build_layer(LayerWeights& l) {
    const std::string lp = "model.layers." + std::to_string(l.index);
    const bool linear = cfg_.is_linear_attention_layer(l.index);
    l.attn.prefix = lp + ".self_attn";
    if (linear) build_linear_attention(l, lp + ".linear_attn");
    if (blocks_.moe && cfg_.is_moe_layer(l.index)) {
      l.moe.emplace();
      l.moe->prefix = lp + ".mlp";
    } else {
      l.mlp.emplace();
      l.mlp->prefix = lp + ".mlp";
    }
    if (!linear) build_attention(plan_, l);
    const bool zc = cfg_.zero_centred_norms;
    norm_slot(lp + ".input_layernorm", &l.input_norm, cfg_.hidden, zc);
    norm_slot(lp + ".post_attention_layernorm", &l.post_attention_norm, cfg_.hidden, zc);
    for (const LinearLayer& ll : linears_) {
      if (ll.layer != l.index) continue;
      std::unique_ptr<LinearMethod> lm = make(plan_, ll);
      switch (ll.kind) {
        case LinearLayerKind::kQkv:
          l.attn.qkv = std::move(lm);
          break;
        case LinearLayerKind::kOProj:
          l.attn.o_proj = std::move(lm);
          break;
        case LinearLayerKind::kGateUp:
          l.mlp->gate_up = std::move(lm);
          break;
        case LinearLayerKind::kDown:
          l.mlp->down = std::move(lm);
          break;
        case LinearLayerKind::kRouter:
          l.moe->router = std::move(lm);
          break;
        case LinearLayerKind::kExpertsW13:
          l.moe->w13 = std::move(lm);
          break;
        case LinearLayerKind::kExpertsW2:
          l.moe->w2 = std::move(lm);
          break;
        case LinearLayerKind::kLinearAttnQkvz:
          l.linear_attn->qkvz = std::move(lm);
          break;
        case LinearLayerKind::kLinearAttnBa:
          l.linear_attn->ba = std::move(lm);
          break;
        case LinearLayerKind::kLinearAttnOut:
          l.linear_attn->out_proj = std::move(lm);
          break;
        case LinearLayerKind::kLmHead:
          throw Error("model loader",
                      "lm_head listed inside decoder layer " + std::to_string(l.index));
      }
    }
  }

  // The final norm and lm_head (the embedding is routed by name).
  void build_top(TopWeights& top) {
    top_ = &top;
    norm_slot("model.norm", &top.final_norm, cfg_.hidden, cfg_.zero_centred_norms);
    for (const LinearLayer& ll : linears_)
      if (ll.kind == LinearLayerKind::kLmHead) top.lm_head = make(plan_, ll);
  }

  // Routes the named checkpoint tensors (each must have a consumer built here), resolves the
  // norms and processes every method built here. The routed tensors' mapped pages are returned
  // to the kernel afterwards: the methods hold copies (the embedding is read in place, and its
  // pages come back as rows are read).
  void load(const std::vector<std::string>& names) {
    for (const std::string& name : names)
      if (!route(name, view_of(ckpt_->at(name))))
        throw Error(ckpt_->root().string() + ": tensor '" + name + "'",
                    "is not used by a " + std::string(arch_name(cfg_.arch)) +
                        " model under this quantization plan (unexpected tensor)");
    if (dry_) return;
    for (const auto& [prefix, ps] : pending_sparse_)
      for (const std::string& p : sparse_weight_parts(ps.format))
        if (!ps.parts.count(p))
          throw Error(ckpt_->root().string() + ": tensor '" + prefix + "." + p + "'",
                      "missing (the " + ps.format + " parts of " + prefix + ".weight)");
    if (top_) {
      if (embed_.bytes.empty())
        throw Error(ckpt_->root().string() + ": tensor 'model.embed_tokens.weight'", "missing");
      top_->embed = embed_;
    }
    for (auto& [prefix, slot] : norms_)
      resolve_norm(prefix, slot);
    for (auto& [name, slot] : params_)
      resolve_param(name, slot);
    for (auto& [prefix, out] : gated_norm_owner_) {
      const NormWeights& n = gated_norms_.at(prefix);
      if (!n.bias.empty()) throw Error(prefix + ".norm.bias", "a gated norm has no bias");
      *out = n.weight;
    }
    for (LinearMethod* lm : methods_)
      lm->process_weights_after_loading();
    for (auto& [prefix, kv] : kv_)
      kv->process_weights_after_loading();
    for (const std::string& name : names)
      ckpt_->at(name).drop_pages();
  }

 private:
  // The method of one linear layer; its members' plan entries must carry the same scheme and
  // args (fused q/k/v and gate/up: vLLM refuses otherwise; expert stacks: QuantPlan::finalize).
  std::unique_ptr<LinearMethod> make(const QuantPlan& plan, const LinearLayer& ll) {
    if (ll.kind == LinearLayerKind::kLmHead && cfg_.tie_word_embeddings) {
      if (!plan.method_for(ll.plan_entry).transforms.empty())
        throw Error(ll.plan_entry,
                    "online transforms on a tied lm_head (it shares "
                    "model.embed_tokens.weight, which the embedding reads "
                    "unrotated)");
      // Reads model.embed_tokens.weight (route()); never quantized.
      MethodConfig c;
      c.scheme = SchemeId{};
      c.dialect = ctx_.dialect;
      auto lm = make_linear_method(ll.shape, c);
      methods_.push_back(lm.get());
      return lm;
    }
    const PlanEntry& first = plan.method_for(ll.plan_entry);
    if (ll.shape.num_experts == 0)
      for (const LinearLayer::Member& mb : ll.members) {
        const PlanEntry& e = plan.method_for(mb.module);
        if (e.scheme_string() != first.scheme_string() || e.weights != first.weights ||
            e.input_activations != first.input_activations)
          throw Error(mb.module, "scheme " + e.scheme_string() + " differs from " + first.prefix +
                                     "'s " + first.scheme_string() + ": a fused " +
                                     ll.fused_module.substr(ll.fused_module.rfind('.') + 1) +
                                     " layer needs one scheme (vLLM refuses the same)");
      }
    MethodConfig config = method_config(first, ctx_.dialect);
    LinearTransforms transforms = transforms_of(plan, ll, config);
    auto lm = make_linear_method(ll.shape, config);
    if (!config.transforms.empty()) lm->set_online_transforms(std::move(transforms));
    methods_.push_back(lm.get());
    for (const LinearLayer::Member& mb : ll.members)
      shards_[mb.module] = {lm.get(), mb.partition, mb.expert, plan.method_for(mb.module).sparsity};
    if (!ll.fused_module.empty()) fused_[ll.fused_module] = {lm.get(), first.sparsity};
    return lm;
  }

  // The layer's online transforms from its members' plan entries (into config.transforms) and
  // their matrices. Fused members and experts share one input transform (vLLM: "Must have same
  // input"); every expert's partition p has the same output transform.
  LinearTransforms transforms_of(const QuantPlan& plan, const LinearLayer& ll,
                                 MethodConfig& config) {
    auto find = [](const PlanEntry& e, TransformLocation l) -> const OnlineTransform* {
      for (const OnlineTransform& t : e.transforms)
        if (t.location == l) return &t;
      return nullptr;
    };
    auto same = [](const OnlineTransform* a, const OnlineTransform* b) {
      return (!a && !b) || (a && b && *a == *b);
    };
    const size_t parts = static_cast<size_t>(ll.shape.partition_count());
    const OnlineTransform* input = nullptr;
    std::vector<const OnlineTransform*> output(parts, nullptr);
    std::vector<std::string> owner(parts);
    const std::string& first = ll.members.front().module;
    for (size_t i = 0; i < ll.members.size(); ++i) {
      const LinearLayer::Member& mb = ll.members[i];
      const PlanEntry& e = plan.method_for(mb.module);
      const OnlineTransform* in = find(e, TransformLocation::kInput);
      if (i == 0)
        input = in;
      else if (!same(in, input))
        throw Error(mb.module, "its online input transform differs from " + first +
                                   "'s: one layer (fused partitions, an expert stack) runs one "
                                   "input transform (vLLM: 'Must have same input')");
      const size_t p = static_cast<size_t>(mb.partition);
      const OnlineTransform* out = find(e, TransformLocation::kOutput);
      if (owner[p].empty()) {
        owner[p] = mb.module;
        output[p] = out;
      } else if (!same(out, output[p])) {
        throw Error(mb.module, "its online output transform differs from " + owner[p] +
                                   "'s: an expert stack applies one per partition");
      }
    }
    config.transforms.clear();
    if (input) config.transforms.push_back(*input);
    for (const OnlineTransform* o : output)
      if (o) config.transforms.push_back(*o);
    LinearTransforms lt;
    if (config.transforms.empty()) return lt;
    if (!ctx_.transforms)
      throw Error(first, "online transforms (" + config.transforms.front().key +
                             ") but no transform matrices were read for this load");
    if (input) lt.input = ctx_.transforms->matrix(*input, first);
    bool any_output = false;
    for (const OnlineTransform* o : output)
      any_output = any_output || o;
    if (any_output) {
      lt.output.resize(parts);
      for (size_t p = 0; p < parts; ++p)
        if (output[p]) lt.output[p] = ctx_.transforms->matrix(*output[p], owner[p]);
    }
    return lt;
  }

  void build_attention(const QuantPlan& plan, LayerWeights& l) {
    AttentionBlock& a = l.attn;
    if (blocks_.qk_norm) {
      a.q_norm.emplace();
      a.k_norm.emplace();
      norm_slot(a.prefix + ".q_norm", &*a.q_norm, cfg_.head_dim, cfg_.zero_centred_norms);
      norm_slot(a.prefix + ".k_norm", &*a.k_norm, cfg_.head_dim, cfg_.zero_centred_norms);
    }
    if (cfg_.attention_sinks) params_[a.prefix + ".sinks"] = {&a.sinks, {cfg_.num_heads}, {}};
    a.kv =
        make_kv_cache_method(KvShape{a.prefix, cfg_.num_kv_heads, cfg_.head_dim, ctx_.model_dtype},
                             method_config(plan.method_for(a.prefix), ctx_.dialect));
    kv_[a.prefix] = a.kv.get();
  }

  // A Gated DeltaNet layer's non-linear tensors (its linears come from linear_layers()).
  void build_linear_attention(LayerWeights& l, const std::string& prefix) {
    LinearAttentionBlock& b = l.linear_attn.emplace();
    b.prefix = prefix;
    GatedDeltaNetParams& p = b.params;
    p.dims = cfg_.linear;
    p.eps = cfg_.rms_norm_eps;
    const LinearAttentionDims& d = cfg_.linear;
    params_[prefix + ".conv1d.weight"] = {&p.conv, {d.conv_dim(), 1, d.conv_kernel}, {}};
    params_[prefix + ".A_log"] = {&p.a_log, {d.num_value_heads}, {}};
    params_[prefix + ".dt_bias"] = {&p.dt_bias, {d.num_value_heads}, {}};
    norm_slot(prefix + ".norm", &gated_norms_[prefix], d.value_head_dim, false);
    gated_norm_owner_[prefix] = &p.norm;
  }

  void norm_slot(const std::string& prefix, NormWeights* out, int64_t dim, bool zero_centred) {
    norms_[prefix] = NormSlot{out, dim, {}, zero_centred};
  }

  std::string sparsity_of(const std::string& prefix) const {
    if (const auto it = shards_.find(prefix); it != shards_.end()) return it->second.sparsity;
    if (const auto it = fused_.find(prefix); it != fused_.end()) return it->second.sparsity;
    return "";
  }

  void resolve_param(const std::string& name, ParamSlot& slot) {
    if (!slot.found) throw Error(ckpt_->root().string() + ": tensor '" + name + "'", "missing");
    const TensorView& t = *slot.found;
    if (!is_float(t.dtype) || t.shape != slot.shape)
      throw Error(name, "expected a float " + shape_string(slot.shape) + " tensor, got " +
                            std::string(dtype_name(t.dtype)) + " " + shape_string(t.shape));
    *slot.out = decode(t, name);
    require_finite(*slot.out, name);
    if (const auto r = ctx_.weight_rounding; r && t.dtype != *r)
      for (double& v : *slot.out)
        v = in(arith_of(*r), v);
  }

  bool route(const std::string& name, const TensorView& v) {
    // An image-text checkpoint's vision tower, Qwen3.5's mtp head: the text path does not run
    // them (transformers' Qwen3_5ForCausalLM ignores them on load too).
    if (is_unused_by_text(cfg_, name)) return true;
    // Online transform matrices: read once for the whole checkpoint (online_transform_matrices.h).
    if (ctx_.transforms && ctx_.transforms->consumed(name)) return true;
    if (name == "model.embed_tokens.weight") {
      if (!is_float(v.dtype) || v.shape != std::vector<int64_t>{cfg_.vocab, cfg_.hidden})
        throw Error(name, "expected a float [" + std::to_string(cfg_.vocab) + ", " +
                              std::to_string(cfg_.hidden) + "] table, got " +
                              std::string(dtype_name(v.dtype)) + " " + shape_string(v.shape));
      if (!top_) return false;
      embed_ = v;
      if (cfg_.tie_word_embeddings && !dry_) top_->lm_head->load("weight", v);
      return true;
    }
    if (const auto it = params_.find(name); it != params_.end()) {
      if (it->second.found) throw Error(name, "given twice");
      it->second.found = v;
      return true;
    }
    const size_t dot = name.rfind('.');
    if (dot == std::string::npos) return false;
    // Norms: <norm>.weight / .bias, and the old anti-outlier <norm>.module.weight / .module.bias.
    for (const char* suffix : {".module.weight", ".module.bias", ".weight", ".bias"}) {
      const std::string sfx(suffix);
      if (name.size() > sfx.size() &&
          name.compare(name.size() - sfx.size(), sfx.size(), sfx) == 0) {
        const auto it = norms_.find(name.substr(0, name.size() - sfx.size()));
        if (it != norms_.end()) {
          it->second.found[sfx.substr(1)] = v;
          return true;
        }
      }
    }
    // KV-cache parameters, named relative to the attention module (may contain dots).
    for (const auto& [prefix, kv] : kv_) {
      if (name.compare(0, prefix.size() + 1, prefix + ".") != 0) continue;
      const std::string rest = name.substr(prefix.size() + 1);
      for (const ParamSpec& s : kv->create_weights())
        if (s.name == rest) {
          if (!dry_) kv->load(rest, v);
          return true;
        }
    }
    const std::string prefix = name.substr(0, dot), param = name.substr(dot + 1);
    if (const std::string sp = sparsity_of(prefix); !sp.empty()) {
      const auto& parts = sparse_weight_parts(sp);
      if (std::find(parts.begin(), parts.end(), param) != parts.end()) {
        if (dry_) return true;
        PendingSparse& ps = pending_sparse_[prefix];
        ps.format = sp;
        if (!ps.parts.emplace(param, v).second) throw Error(name, "given twice");
        if (ps.parts.size() < parts.size()) return true;
        // The dense weight the scheme's method would have found; the method copies it.
        const HostTensor w = decompress_sparse_weight(sp, ps.parts, prefix);
        pending_sparse_.erase(prefix);
        return route(prefix + ".weight", w.view());
      }
    }
    if (const auto it = shards_.find(prefix); it != shards_.end()) {
      if (!dry_) it->second.method->load(param, v, it->second.partition, it->second.expert);
      return true;
    }
    if (const auto it = fused_.find(prefix); it != fused_.end()) {
      if (!dry_) load_fused(name, param, v, *it->second.method);
      return true;
    }
    return false;
  }

  // An already fused tensor: rows split in proportion to the partitions (weights, per-row and
  // per-group scales); a one-element tensor (per-tensor scale) is given to every partition.
  void load_fused(const std::string& name, const std::string& param, const TensorView& v,
                  LinearMethod& lm) {
    const LinearShape& s = lm.shape();
    const int64_t total = s.out_features();
    // GPTQ / AWQ tensors are [K.., N] and [G, N]: their output features run along dim 1.
    if (is_producer_int_storage(int_code_storage(lm.config().format)))
      throw Error(name, "a fused " + lm.config().format +
                            " tensor (output features along dim 1) is not implemented; the "
                            "unfused q/k/v and gate/up tensors are");
    if (v.numel() == 1) {
      for (int64_t p = 0; p < s.partition_count(); ++p)
        lm.load(param, v, p, 0);
      return;
    }
    if (v.shape.empty() || v.shape[0] % total != 0 || (v.shape[0] / total) * total != v.shape[0])
      throw Error(name, "cannot split a fused tensor of shape " + shape_string(v.shape) +
                            " into partitions of " + std::to_string(total) + " rows");
    const int64_t per_out = v.shape[0] / total;  // rows per output feature (1 for weights)
    const uint64_t row_bytes = storage_bytes(v.dtype, v.numel() / v.shape[0]);
    if (row_bytes * 8 != static_cast<uint64_t>(v.numel() / v.shape[0]) * dtype_bits(v.dtype))
      throw Error(name, "rows of a sub-byte tensor do not end on a byte boundary");
    int64_t row = 0;
    for (int64_t p = 0; p < s.partition_count(); ++p) {
      const int64_t rows = s.partitions[static_cast<size_t>(p)] * per_out;
      TensorView part = v;
      part.shape[0] = rows;
      part.bytes = v.bytes.subspan(static_cast<size_t>(row) * row_bytes,
                                   static_cast<size_t>(rows) * row_bytes);
      lm.load(param, part, p, 0);
      row += rows;
    }
  }

  void resolve_norm(const std::string& prefix, NormSlot& slot) {
    auto values = [&](const std::string& key) -> std::vector<double> {
      const TensorView& t = slot.found.at(key);
      const std::string w = prefix + "." + key;
      if (!is_float(t.dtype) || t.shape != std::vector<int64_t>{slot.dim})
        throw Error(w, "expected a float [" + std::to_string(slot.dim) + "] vector, got " +
                           std::string(dtype_name(t.dtype)) + " " + shape_string(t.shape));
      auto d = decode(t, w);
      require_finite(d, w);
      return d;
    };
    // Old anti-outlier files keep the smoothed norm under module.* and the original weight as a
    // fallback; new files put the smoothed weight and its bias directly on the norm.
    const bool old = slot.found.count("module.weight") > 0;
    const std::string wkey = old ? "module.weight" : "weight";
    if (!slot.found.count(wkey)) throw Error(prefix + ".weight", "missing");
    slot.out->weight = values(wkey);
    // The norm weight as an engine running in run_dtype holds it (the fp32 bias stays exact).
    if (const auto r = ctx_.weight_rounding; r && slot.found.at(wkey).dtype != *r)
      for (double& v : slot.out->weight)
        v = in(arith_of(*r), v);
    const std::string bkey = old ? "module.bias" : "bias";
    if (slot.found.count(bkey)) slot.out->bias = values(bkey);
    // Qwen3.5's zero-centred norms: x̂ * (1 + w), the sum taken once here in fp64 (the
    // product's operands are then HF's, which adds 1.0 to the weight before multiplying).
    if (slot.zero_centred)
      for (double& v : slot.out->weight)
        v = 1.0 + v;
    if (old && slot.found.count("bias"))
      throw Error(prefix + ".bias", "present beside module.weight: ambiguous anti-outlier norm");
    if (!old && slot.found.count("module.bias"))
      throw Error(prefix + ".module.bias", "present without module.weight");
  }

  std::shared_ptr<const Checkpoint> ckpt_;
  WeightContext ctx_;
  const ModelConfig& cfg_;
  const QuantPlan& plan_;
  ArchBlocks blocks_;
  const std::vector<LinearLayer>& linears_;
  bool dry_ = false;
  TopWeights* top_ = nullptr;  // build_top ran: the embedding, final norm and lm_head route here
  std::vector<LinearMethod*> methods_;
  std::map<std::string, ShardTarget> shards_;
  std::map<std::string, FusedTarget> fused_;
  std::map<std::string, PendingSparse> pending_sparse_;
  std::map<std::string, KvCacheMethod*> kv_;
  std::map<std::string, NormSlot> norms_;
  std::map<std::string, ParamSlot> params_;
  // Gated DeltaNet output norms, resolved as norms and handed to their block's params.
  std::map<std::string, NormWeights> gated_norms_;
  std::map<std::string, std::vector<double>*> gated_norm_owner_;  // by linear_attn prefix
  TensorView embed_;
};

WeightLoader::WeightLoader(std::shared_ptr<const Checkpoint> ckpt, WeightContext ctx,
                           const std::vector<LinearLayer>& linears, bool dry)
    : impl_(std::make_unique<Impl>(std::move(ckpt), ctx, linears, dry)) {}
WeightLoader::~WeightLoader() = default;
void WeightLoader::build_layer(LayerWeights& layer) {
  impl_->build_layer(layer);
}
void WeightLoader::build_top(TopWeights& top) {
  impl_->build_top(top);
}
void WeightLoader::load(const std::vector<std::string>& names) {
  impl_->load(names);
}

namespace {

// "model.layers.<i>.…" -> i when i < num_layers; -1 for every other name (embedding, final norm,
// lm_head, and names that are not a layer's: those are refused by the top-level routing).
int64_t layer_of_tensor(const std::string& name, int64_t num_layers) {
  static constexpr std::string_view kPrefix = "model.layers.";
  if (name.compare(0, kPrefix.size(), kPrefix) != 0) return -1;
  int64_t i = 0;
  size_t p = kPrefix.size();
  for (; p < name.size() && name[p] >= '0' && name[p] <= '9' && i < num_layers; ++p)
    i = i * 10 + (name[p] - '0');
  if (p == kPrefix.size() || p >= name.size() || name[p] != '.' || i >= num_layers) return -1;
  return i;
}

}  // namespace

TensorsByLayer tensors_by_layer(const Checkpoint& ckpt, int64_t num_layers) {
  TensorsByLayer out;
  out.layers.resize(static_cast<size_t>(num_layers));
  for (const auto& [name, ref] : ckpt.tensors()) {
    const int64_t l = layer_of_tensor(name, num_layers);
    (l < 0 ? out.top : out.layers[static_cast<size_t>(l)]).push_back(name);
  }
  return out;
}

void check_every_layer_tensor_used(std::shared_ptr<const Checkpoint> ckpt, WeightContext ctx,
                                   const std::vector<LinearLayer>& linears,
                                   const TensorsByLayer& names) {
  for (size_t i = 0; i < names.layers.size(); ++i) {
    WeightLoader dry(ckpt, ctx, linears, true);
    LayerWeights probe;
    probe.index = static_cast<int64_t>(i);
    dry.build_layer(probe);
    dry.load(names.layers[i]);
  }
}

}  // namespace qparity::reference
