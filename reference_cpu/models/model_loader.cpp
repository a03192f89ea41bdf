#include "reference_cpu/models/model_loader.h"

#include "core/error.h"
#include "core/memory_budget.h"
#include "core/safetensors/chatglm_names.h"
#include "schemes/loading/weight_loader.h"

namespace qparity::reference {

namespace {

WeightContext context_of(const CausalLm& m) {
  return {&m.config(), &m.plan(), m.dialect(), m.model_dtype(), m.weight_rounding()};
}

void take_top(CausalLm& model, TopWeights& top) {
  model.set_embedding(top.embed);
  model.final_norm() = std::move(top.final_norm);
  model.lm_head() = std::move(top.lm_head);
}

// One decoder layer's tensors read from the memory-mapped checkpoint when the model needs them.
class CheckpointLayerSource final : public LayerWeightSource {
 public:
  CheckpointLayerSource(std::shared_ptr<const Checkpoint> ckpt, WeightContext ctx,
                        std::vector<LinearLayer> linears,
                        std::vector<std::vector<std::string>> names)
      : ckpt_(std::move(ckpt)), ctx_(ctx), linears_(std::move(linears)), names_(std::move(names)) {}

  void load(DecoderLayer& layer) override {
    WeightLoader loader(ckpt_, ctx_, linears_);
    loader.build_layer(layer);
    loader.load(names_.at(static_cast<size_t>(layer.index)));
  }

 private:
  std::shared_ptr<const Checkpoint> ckpt_;
  WeightContext ctx_;  // points into the model, which owns this source
  std::vector<LinearLayer> linears_;
  std::vector<std::vector<std::string>> names_;  // per decoder layer
};

std::unique_ptr<CausalLm> load_impl(std::shared_ptr<const Checkpoint> checkpoint, ModelConfig cfg,
                                    QuantPlan plan, Dialect dialect, PrecisionMode mode,
                                    std::optional<DType> run_dtype, bool stream) {
  auto model =
      std::make_unique<CausalLm>(std::move(cfg), std::move(plan), dialect, mode, run_dtype);
  model->hold(checkpoint);
  const ModelConfig& c = model->config();
  if (c.tie_word_embeddings && !checkpoint->contains("model.embed_tokens.weight"))
    throw Error(checkpoint->root().string() + ": tensor 'model.embed_tokens.weight'", "missing");
  std::vector<LinearLayer> linears =
      linear_layers(c, model->model_dtype(), model->weight_rounding());
  WeightContext ctx = context_of(*model);
  ctx.transforms = OnlineTransformMatrices::read(*checkpoint, model->plan());
  for (int64_t i = 0; i < c.num_layers; ++i) {
    DecoderLayer l;
    l.index = i;
    model->layers().push_back(std::move(l));
  }
  if (!stream) {
    TopWeights top;
    WeightLoader loader(checkpoint, ctx, linears);
    for (DecoderLayer& l : model->layers())
      loader.build_layer(l);
    loader.build_top(top);
    std::vector<std::string> names;
    for (const auto& [name, ref] : checkpoint->tensors())
      names.push_back(name);
    loader.load(names);
    take_top(*model, top);
    return model;
  }
  // Streaming: the pieces outside the layers are loaded now; each layer's tensors are checked
  // for a consumer now (an unexpected tensor fails before any compute) and loaded when the layer
  // runs.
  TensorsByLayer names = tensors_by_layer(*checkpoint, c.num_layers);
  check_every_layer_tensor_used(checkpoint, ctx, linears, names);
  {
    TopWeights top;
    WeightLoader loader(checkpoint, ctx, linears);
    loader.build_top(top);
    loader.load(names.top);
    take_top(*model, top);
  }
  model->stream_layers_from(std::make_unique<CheckpointLayerSource>(
      checkpoint, ctx, std::move(linears), std::move(names.layers)));
  return model;
}

}  // namespace

std::unique_ptr<CausalLm> load_model(std::shared_ptr<const Checkpoint> checkpoint, ModelConfig cfg,
                                     QuantPlan plan, Dialect dialect, PrecisionMode mode,
                                     std::optional<DType> run_dtype) {
  return load_impl(std::move(checkpoint), std::move(cfg), std::move(plan), dialect, mode, run_dtype,
                   false);
}

uint64_t checkpoint_bytes(const Checkpoint& ckpt) {
  uint64_t n = 0;
  for (const auto& [name, ref] : ckpt.tensors())
    n += ref.info->nbytes();
  return n;
}

bool streams_under(const LoadOptions& o, uint64_t tensor_bytes) {
  switch (o.streaming) {
    case LayerStreaming::kNever:
      return false;
    case LayerStreaming::kAlways:
      return true;
    case LayerStreaming::kAuto:
      return tensor_bytes > (o.memory_budget > 0 ? o.memory_budget : available_memory_bytes());
  }
  return false;
}

std::unique_ptr<CausalLm> load_model(const std::filesystem::path& dir, const LoadOptions& o) {
  ModelConfig cfg = load_model_config(dir / "config.json");
  auto ckpt = std::make_shared<const Checkpoint>(open_model_checkpoint(dir, cfg));
  QuantPlan plan = build_quant_plan(cfg, dir, o.override_scheme);
  const bool stream = streams_under(o, checkpoint_bytes(*ckpt));
  return load_impl(std::move(ckpt), std::move(cfg), std::move(plan), o.dialect, o.mode, o.run_dtype,
                   stream);
}

}  // namespace qparity::reference
