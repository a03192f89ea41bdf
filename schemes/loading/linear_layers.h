#pragma once
// The linear layers of a model config: which checkpoint modules fuse into which engine layer,
// with which partitions (q/k/v -> qkv, gate/up -> gate_up, the expert stacks, Qwen3.5's
// Gated DeltaNet projections, lm_head). Both engines' loaders (weight_loader.h) and the checks
// made before loading (fixtures::scheme_exclusions) read the geometry from here only.
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "core/config/model_config.h"
#include "schemes/method/linear_method.h"

namespace qparity::reference {

// One engine linear layer: what the loader builds one LinearMethod for. The geometry (which
// checkpoint modules fuse into which layer, with which partitions) lives here only, so that
// checks made before loading (fixtures::scheme_exclusions) see the layers the loader builds.
enum class LinearLayerKind : uint8_t {
  kQkv,  // q/k/v_proj fused (partitions 0/1/2)
  kOProj,
  kGateUp,      // dense MLP gate/up_proj fused
  kDown,        // dense MLP down_proj
  kRouter,      // MoE mlp.gate
  kExpertsW13,  // expert stack, gate/up of every expert
  kExpertsW2,   // expert stack, down of every expert
  kLmHead,
  // Qwen3.5 Gated DeltaNet: in_proj_qkv | in_proj_z, in_proj_b | in_proj_a (fused as vLLM's
  // in_proj_qkvz / in_proj_ba, partitions in that order), out_proj.
  kLinearAttnQkvz,
  kLinearAttnBa,
  kLinearAttnOut,
};

struct LinearLayer {
  // A checkpoint module the layer holds, "model.layers.0.self_attn.k_proj" -> partition 1.
  struct Member {
    std::string module;
    int64_t partition = 0;
    int64_t expert = 0;
  };
  LinearLayerKind kind = LinearLayerKind::kOProj;
  int64_t layer = -1;  // decoder layer; -1 for lm_head
  LinearShape shape;
  std::vector<Member> members;
  // The plan entry whose scheme the layer runs: its first member, or the expert stack.
  std::string plan_entry;
  // The name of an already fused checkpoint module ("<prefix>.qkv_proj"), or empty.
  std::string fused_module;
};

// Every linear layer of `cfg`, in build order: per decoder layer qkv, o_proj (or a Gated
// DeltaNet layer's qkvz, ba, out_proj), then gate_up and down (dense MLP) or router, experts w13
// and w2 (MoE layer); lm_head last.
std::vector<LinearLayer> linear_layers(const ModelConfig& cfg, DType model_dtype,
                                       std::optional<DType> run_dtype = std::nullopt);

}  // namespace qparity::reference
