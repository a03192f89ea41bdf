#pragma once
// A checkpoint whose plan quantizes anything -> GpuModel (model_loader.h says when): the shared
// lifecycle of schemes/loading/weight_loader.h (create_weights, load with every tensor routed
// and checked, process_weights_after_loading) runs one decoder layer at a time on the host, in
// the checkpoint's own dtypes; the layer then goes to the device (quantized linears as
// GpuLinearMethods, unquantized ones as bf16 buffers from their stored bytes) and its host copy
// is freed before the next layer is read. No reference model is built.
#include <filesystem>
#include <iosfwd>
#include <memory>

#include "core/safetensors/checkpoint.h"
#include "gpu_engine/gpu_model.h"
#include "gpu_engine/load_options.h"
#include "schemes/description/quant_plan.h"

namespace qparity::gpu {

// Whether any linear, expert stack or KV cache is quantized or a norm carries a transform.
bool plan_quantizes_anything(const QuantPlan& plan);

// "bf16", the one quantized scheme of the plan's linears, or several joined by "+".
std::string plan_scheme_summary(const QuantPlan& plan);

// Refuses, naming the plan entry, what the GPU engine cannot run: a linear scheme without a GPU
// method, a quantized expert stack, lm_head or KV cache, a norm transform. Reads no weight.
void check_gpu_can_run(const QuantPlan& plan);

// `ck`: the checkpoint of `dir` or one rank's shard of it; cfg and plan: its shapes.
std::unique_ptr<GpuModel> load_planned_gpu_model(std::shared_ptr<const Checkpoint> ck,
                                                 const std::filesystem::path& dir, ModelConfig cfg,
                                                 QuantPlan plan, const GpuLoadOptions& options,
                                                 std::ostream* progress);

}  // namespace qparity::gpu
