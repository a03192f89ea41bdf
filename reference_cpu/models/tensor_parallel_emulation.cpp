#include "reference_cpu/models/tensor_parallel_emulation.h"

#include <functional>
#include <memory>

#include "core/capture/capture_points.h"
#include "core/error.h"
#include "core/parallel/tp_sharding.h"
#include "core/safetensors/chatglm_names.h"
#include "reference_cpu/models/model_loader.h"
#include "schemes/parallel/checkpoint_shard.h"

namespace qparity::reference {

namespace {

// One row-parallel linear at TP = N (header): the ranks' methods on their input columns, each
// partial rounded as stored, their sum (fp64, rank order) rounded once.
class RowParallelLinear : public LinearMethod {
 public:
  RowParallelLinear(const LinearMethod& whole, std::vector<const LinearMethod*> ranks,
                    std::shared_ptr<const void> keep_alive, std::function<void(Matrix&)> round)
      : LinearMethod(whole.shape(), whole.config()),
        ranks_(std::move(ranks)),
        keep_alive_(std::move(keep_alive)),
        round_(std::move(round)) {
    int64_t k = 0;
    for (const LinearMethod* r : ranks_)
      k += r->shape().in_features;
    if (k != shape().in_features)
      throw Error(shape().prefix, "the ranks' input columns (" + std::to_string(k) +
                                      ") do not add up to the layer's " +
                                      std::to_string(shape().in_features));
    process_weights_after_loading();
  }
  std::vector<ParamSpec> create_weights(int64_t) const override { return {}; }

 private:
  void process() override {}
  Matrix do_apply(const Matrix& x, int64_t expert) const override {
    Matrix sum;
    int64_t col = 0;
    for (size_t r = 0; r < ranks_.size(); ++r) {
      const int64_t k = ranks_[r]->shape().in_features;
      Matrix xr(x.rows, k);
      for (int64_t i = 0; i < x.rows; ++i)
        for (int64_t j = 0; j < k; ++j)
          xr(i, j) = x(i, col + j);
      col += k;
      Matrix p = ranks_[r]->apply(xr, expert);
      round_(p);
      if (r == 0) {
        sum = std::move(p);
        continue;
      }
      for (size_t i = 0; i < sum.data.size(); ++i)
        sum.data[i] += p.data[i];
    }
    round_(sum);
    return sum;
  }
  Matrix do_dequantized_weight(int64_t expert) const override {
    Matrix w(shape().out_features(), shape().in_features);
    int64_t col = 0;
    for (const LinearMethod* r : ranks_) {
      const Matrix p = r->dequantized_weight(expert);
      for (int64_t i = 0; i < p.rows; ++i)
        for (int64_t j = 0; j < p.cols; ++j)
          w(i, col + j) = p(i, j);
      col += p.cols;
    }
    return w;
  }

  std::vector<const LinearMethod*> ranks_;
  std::shared_ptr<const void> keep_alive_;  // the rank models that own ranks_
  std::function<void(Matrix&)> round_;
};

}  // namespace

void emulate_tensor_parallel(CausalLm& model, const std::filesystem::path& dir,
                             const std::optional<std::string>& override_scheme, int tp) {
  if (tp == 1) return;
  if (model.streams_layers())
    throw Error("reference --tp",
                "a streamed model cannot emulate tensor parallelism (it holds "
                "every rank's row-parallel layers at once)");
  const ModelConfig& cfg = model.config();
  for (const DecoderLayer& l : model.layers())
    if (l.moe)
      throw Error(layer_prefix(l.index) + ".moe",
                  "the reference does not emulate tensor parallelism inside MoE experts yet");
  const auto full = std::make_shared<const Checkpoint>(open_model_checkpoint(dir, cfg));
  const QuantPlan plan = build_quant_plan(cfg, dir, override_scheme);
  for (const PlanEntry& e : plan)
    if (!e.transforms.empty())
      throw Error(e.prefix, "reference --tp: an online transform (" + e.transforms.front().key +
                                ") spans the whole layer, which a rank does not hold (vLLM: "
                                "'Online transforms with tensor parallelism is not supported')");
  const ModelConfig local = tp_rank_config(cfg, tp);
  auto ranks = std::make_shared<std::vector<std::unique_ptr<CausalLm>>>();
  for (int r = 0; r < tp; ++r) {
    auto shard = std::make_shared<const Checkpoint>(shard_checkpoint(*full, cfg, plan, r, tp));
    ranks->push_back(load_model(shard, local, build_quant_plan(local, dir, override_scheme),
                                model.dialect(), model.mode(), model.weight_rounding()));
  }
  const CausalLm* m = &model;
  const auto round = [m](Matrix& x) { m->round_activation(x); };
  for (DecoderLayer& l : model.layers()) {
    const size_t i = static_cast<size_t>(l.index);
    std::vector<const LinearMethod*> o, d;
    for (const auto& rank : *ranks) {
      o.push_back(rank->layers()[i].attn.o_proj.get());
      d.push_back(rank->layers()[i].mlp->down.get());
    }
    l.attn.o_proj = std::make_unique<RowParallelLinear>(*l.attn.o_proj, o, ranks, round);
    l.mlp->down = std::make_unique<RowParallelLinear>(*l.mlp->down, d, ranks, round);
  }
}

}  // namespace qparity::reference
