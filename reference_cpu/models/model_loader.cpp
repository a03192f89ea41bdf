#include "reference_cpu/models/model_loader.h"

#include <map>
#include <set>

#include "core/error.h"
#include "reference_cpu/models/architectures.h"
#include "reference_cpu/quant/method_factory.h"
#include "reference_cpu/quant/numeric.h"

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
};

// An already fused checkpoint module (qkv_proj, gate_up_proj) and the method it fills.
struct FusedTarget {
  LinearMethod* method = nullptr;
};

// One norm's tensors, resolved once everything is read.
struct NormSlot {
  NormWeights* out = nullptr;
  int64_t dim = 0;
  std::map<std::string, TensorView> found;  // "weight", "bias", "module.weight", "module.bias"
};

class Loader {
 public:
  Loader(std::shared_ptr<const Checkpoint> ckpt, CausalLm& model, ArchBlocks blocks)
      : ckpt_(std::move(ckpt)), m_(model), cfg_(model.config()), blocks_(blocks) {}

  void build() {
    const QuantPlan& plan = m_.plan();
    for (int64_t i = 0; i < cfg_.num_layers; ++i) {
      DecoderLayer l;
      l.index = i;
      const std::string lp = "model.layers." + std::to_string(i);
      l.attn.prefix = lp + ".self_attn";
      m_.layers().push_back(std::move(l));
    }
    for (DecoderLayer& l : m_.layers()) {
      const std::string lp = "model.layers." + std::to_string(l.index);
      build_attention(plan, l);
      norm_slot(lp + ".input_layernorm", &l.input_norm, cfg_.hidden);
      norm_slot(lp + ".post_attention_layernorm", &l.post_attention_norm, cfg_.hidden);
      if (blocks_.moe && cfg_.is_moe_layer(l.index))
        build_moe(plan, l, lp + ".mlp");
      else
        build_mlp(plan, l, lp + ".mlp");
    }
    norm_slot("model.norm", &m_.final_norm(), cfg_.hidden);
    if (cfg_.tie_word_embeddings) {
      MethodConfig c;
      c.scheme = SchemeId{};
      c.dialect = m_.dialect();
      m_.lm_head() = make_linear_method(
          LinearShape::dense("lm_head", cfg_.vocab, cfg_.hidden, m_.model_dtype()), c);
      methods_.push_back(m_.lm_head().get());
    } else {
      m_.lm_head() = dense(plan, "lm_head", cfg_.vocab, cfg_.hidden, false);
    }
  }

  void load() {
    std::set<std::string> used;
    for (const auto& [name, ref] : ckpt_->tensors()) {
      const TensorView v = view_of(ref);
      if (!route(name, v))
        throw Error(ckpt_->root().string() + ": tensor '" + name + "'",
                    "is not used by a " + std::string(arch_name(cfg_.arch)) +
                        " model under this quantization plan (unexpected tensor)");
    }
    if (embed_.bytes.empty())
      throw Error(ckpt_->root().string() + ": tensor 'model.embed_tokens.weight'", "missing");
    m_.set_embedding(embed_);
    for (auto& [prefix, slot] : norms_)
      resolve_norm(prefix, slot);
    for (LinearMethod* lm : methods_)
      lm->process_weights_after_loading();
    for (DecoderLayer& l : m_.layers())
      l.attn.kv->process_weights_after_loading();
  }

 private:
  std::unique_ptr<LinearMethod> dense(const QuantPlan& plan, const std::string& prefix, int64_t n,
                                      int64_t k, bool bias) {
    auto lm = make_linear_method(LinearShape::dense(prefix, n, k, m_.model_dtype(), bias),
                                 method_config(plan.method_for(prefix), m_.dialect()));
    methods_.push_back(lm.get());
    shards_[prefix] = {lm.get(), 0, 0};
    return lm;
  }

  // A fused layer from split checkpoint modules `<prefix>.<names[p]>`, whose plan entries must
  // carry the same scheme and args.
  std::unique_ptr<LinearMethod> fused(const QuantPlan& plan, const std::string& prefix,
                                      std::vector<std::string> names, std::vector<int64_t> rows,
                                      int64_t k, bool bias, const std::string& fused_name) {
    const PlanEntry& first = plan.method_for(prefix + "." + names[0]);
    for (size_t p = 1; p < names.size(); ++p) {
      const PlanEntry& e = plan.method_for(prefix + "." + names[p]);
      if (e.scheme_string() != first.scheme_string() || e.weights != first.weights ||
          e.input_activations != first.input_activations)
        throw Error(prefix + "." + names[p], "scheme " + e.scheme_string() + " differs from " +
                                                 first.prefix + "'s " + first.scheme_string() +
                                                 ": a fused " + fused_name +
                                                 " layer needs one scheme (vLLM refuses the same)");
    }
    LinearShape s;
    s.prefix = prefix;
    s.partition_names = names;
    s.partitions = std::move(rows);
    s.in_features = k;
    s.model_dtype = m_.model_dtype();
    s.has_bias = bias;
    auto lm = make_linear_method(s, method_config(first, m_.dialect()));
    methods_.push_back(lm.get());
    for (size_t p = 0; p < names.size(); ++p)
      shards_[prefix + "." + names[p]] = {lm.get(), static_cast<int64_t>(p), 0};
    fused_[prefix + "." + fused_name] = {lm.get()};
    return lm;
  }

  void build_attention(const QuantPlan& plan, DecoderLayer& l) {
    AttentionBlock& a = l.attn;
    a.qkv = fused(plan, a.prefix, {"q_proj", "k_proj", "v_proj"},
                  {cfg_.q_size(), cfg_.kv_size(), cfg_.kv_size()}, cfg_.hidden, cfg_.attention_bias,
                  "qkv_proj");
    a.o_proj = dense(plan, a.prefix + ".o_proj", cfg_.hidden, cfg_.q_size(), cfg_.attention_bias);
    if (blocks_.qk_norm) {
      a.q_norm.emplace();
      a.k_norm.emplace();
      norm_slot(a.prefix + ".q_norm", &*a.q_norm, cfg_.head_dim);
      norm_slot(a.prefix + ".k_norm", &*a.k_norm, cfg_.head_dim);
    }
    a.kv =
        make_kv_cache_method(KvShape{a.prefix, cfg_.num_kv_heads, cfg_.head_dim, m_.model_dtype()},
                             method_config(plan.method_for(a.prefix), m_.dialect()));
    kv_[a.prefix] = a.kv.get();
  }

  void build_mlp(const QuantPlan& plan, DecoderLayer& l, const std::string& prefix) {
    MlpBlock b;
    b.prefix = prefix;
    b.gate_up =
        fused(plan, prefix, {"gate_proj", "up_proj"}, {cfg_.intermediate, cfg_.intermediate},
              cfg_.hidden, cfg_.mlp_bias, "gate_up_proj");
    b.down = dense(plan, prefix + ".down_proj", cfg_.hidden, cfg_.intermediate, cfg_.mlp_bias);
    l.mlp = std::move(b);
  }

  void build_moe(const QuantPlan& plan, DecoderLayer& l, const std::string& prefix) {
    MoeBlock b;
    b.prefix = prefix;
    b.router = dense(plan, prefix + ".gate", cfg_.num_experts, cfg_.hidden, false);
    const std::string stack = prefix + ".experts";
    const MethodConfig c = method_config(plan.method_for(stack), m_.dialect());
    const int64_t e = cfg_.num_experts, i = cfg_.moe_intermediate_size;
    LinearShape s13;
    s13.prefix = stack;
    s13.partition_names = {"gate_proj", "up_proj"};
    s13.partitions = {i, i};
    s13.in_features = cfg_.hidden;
    s13.num_experts = e;
    s13.model_dtype = m_.model_dtype();
    LinearShape s2 = s13;
    s2.partition_names = {"down_proj"};
    s2.partitions = {cfg_.hidden};
    s2.in_features = i;
    b.w13 = make_linear_method(s13, c);
    b.w2 = make_linear_method(s2, c);
    methods_.push_back(b.w13.get());
    methods_.push_back(b.w2.get());
    for (int64_t x = 0; x < e; ++x) {
      const std::string ep = stack + "." + std::to_string(x);
      shards_[ep + ".gate_proj"] = {b.w13.get(), 0, x};
      shards_[ep + ".up_proj"] = {b.w13.get(), 1, x};
      shards_[ep + ".down_proj"] = {b.w2.get(), 0, x};
    }
    l.moe = std::move(b);
  }

  void norm_slot(const std::string& prefix, NormWeights* out, int64_t dim) {
    norms_[prefix] = NormSlot{out, dim, {}};
  }

  bool route(const std::string& name, const TensorView& v) {
    if (name == "model.embed_tokens.weight") {
      if (!is_float(v.dtype) || v.shape != std::vector<int64_t>{cfg_.vocab, cfg_.hidden})
        throw Error(name, "expected a float [" + std::to_string(cfg_.vocab) + ", " +
                              std::to_string(cfg_.hidden) + "] table, got " +
                              std::string(dtype_name(v.dtype)) + " " + shape_string(v.shape));
      embed_ = v;
      if (cfg_.tie_word_embeddings) m_.lm_head()->load("weight", v);
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
          kv->load(rest, v);
          return true;
        }
    }
    const std::string prefix = name.substr(0, dot), param = name.substr(dot + 1);
    if (const auto it = shards_.find(prefix); it != shards_.end()) {
      it->second.method->load(param, v, it->second.partition, it->second.expert);
      return true;
    }
    if (const auto it = fused_.find(prefix); it != fused_.end()) {
      load_fused(name, param, v, *it->second.method);
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
    const std::string bkey = old ? "module.bias" : "bias";
    if (slot.found.count(bkey)) slot.out->bias = values(bkey);
    if (old && slot.found.count("bias"))
      throw Error(prefix + ".bias", "present beside module.weight: ambiguous anti-outlier norm");
    if (!old && slot.found.count("module.bias"))
      throw Error(prefix + ".module.bias", "present without module.weight");
  }

  std::shared_ptr<const Checkpoint> ckpt_;
  CausalLm& m_;
  const ModelConfig& cfg_;
  ArchBlocks blocks_;
  std::vector<LinearMethod*> methods_;
  std::map<std::string, ShardTarget> shards_;
  std::map<std::string, FusedTarget> fused_;
  std::map<std::string, KvCacheMethod*> kv_;
  std::map<std::string, NormSlot> norms_;
  TensorView embed_;
};

}  // namespace

std::unique_ptr<CausalLm> load_model(std::shared_ptr<const Checkpoint> checkpoint, ModelConfig cfg,
                                     QuantPlan plan, Dialect dialect, PrecisionMode mode) {
  const ArchBlocks blocks = blocks_of(cfg);
  auto model = std::make_unique<CausalLm>(std::move(cfg), std::move(plan), dialect, mode);
  model->hold(checkpoint);
  Loader loader(checkpoint, *model, blocks);
  loader.build();
  if (model->config().tie_word_embeddings && !checkpoint->contains("model.embed_tokens.weight"))
    throw Error(checkpoint->root().string() + ": tensor 'model.embed_tokens.weight'", "missing");
  loader.load();
  return model;
}

std::unique_ptr<CausalLm> load_model(const std::filesystem::path& dir, const LoadOptions& o) {
  ModelConfig cfg = load_model_config(dir / "config.json");
  auto ckpt = std::make_shared<const Checkpoint>(Checkpoint::open(dir));
  QuantPlan plan = build_quant_plan(cfg, dir, o.override_scheme);
  return load_model(std::move(ckpt), std::move(cfg), std::move(plan), o.dialect, o.mode);
}

}  // namespace qparity::reference
