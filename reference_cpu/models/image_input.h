#pragma once
// Images for an image-text checkpoint (Qwen3-VL, Qwen3.5's image-text class): the pixel file the
// CLI reads, the checkpoint's vision tower, and the features it hands the decoder
// (CausalLm::forward_image_prompt).
//
// A pixel file is a safetensors file holding `pixel_values` [N, C·T·P·P] (any float dtype, one
// patch per row in the processor's merge-window order, as transformers' Qwen2VLImageProcessor
// emits it) and `image_grid_thw` [n, 3] (I64 or I32: t, h, w per image, in patches).
#include <string>
#include <vector>

#include "core/capture/trace.h"
#include "core/config/model_config.h"
#include "reference_cpu/models/causal_lm.h"
#include "reference_cpu/models/qwen3_vl_vision.h"

namespace qparity::reference {

struct PixelInput {
  Matrix pixels;
  std::vector<GridThw> grids;
};

// Throws naming the file and tensor when one is missing, mis-shaped or of another dtype, a value
// is not finite, or a grid entry is not positive.
PixelInput read_pixel_file(const std::string& path);

// The vision tower of the image-text checkpoint in `model_dir` (config.json's vision_config,
// model.visual.*). Throws naming config.json for a checkpoint without one.
Qwen3VlVisionTower load_vision_tower(const std::string& model_dir, const ModelConfig& cfg);

// The tower's capture points in execution order: visual.embed, visual.blocks.<i>.out,
// visual.deepstack.<j> (after its block), visual.merger.
std::vector<std::string> vision_capture_points(const VisionConfig& vc);

// Runs the tower on `in` (recording its points into `trace` when given) and packs what the
// decoder takes.
ImageFeatures image_features(const Qwen3VlVisionTower& tower, const PixelInput& in,
                             Trace* trace = nullptr);

}  // namespace qparity::reference
