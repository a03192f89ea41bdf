#include "schemes/loading/layer_weights.h"

#include "core/error.h"

namespace qparity::reference {

std::vector<const LinearMethod*> linear_methods(const LayerWeights& l) {
  std::vector<const LinearMethod*> out;
  const auto add = [&](const std::unique_ptr<LinearMethod>& m) {
    if (m) out.push_back(m.get());
  };
  if (l.linear_attn) {
    add(l.linear_attn->qkvz);
    add(l.linear_attn->ba);
    add(l.linear_attn->out_proj);
  } else {
    add(l.attn.qkv);
    add(l.attn.o_proj);
  }
  if (l.mlp) {
    add(l.mlp->gate_up);
    add(l.mlp->down);
  }
  if (l.moe) {
    add(l.moe->router);
    add(l.moe->w13);
    add(l.moe->w2);
  }
  return out;
}

DType model_dtype_of(const ModelConfig& cfg) {
  if (cfg.dtype.empty() || cfg.dtype == "bfloat16") return DType::kBF16;
  if (cfg.dtype == "float16") return DType::kF16;
  if (cfg.dtype == "float32") return DType::kF32;
  throw Error("config.json: key 'torch_dtype'",
              "'" + cfg.dtype +
                  "' is not a model dtype the reference takes (bfloat16, float16, "
                  "float32)");
}

}  // namespace qparity::reference
