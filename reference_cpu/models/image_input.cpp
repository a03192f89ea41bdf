#include "reference_cpu/models/image_input.h"

#include <cmath>
#include <filesystem>

#include "core/error.h"
#include "core/json_util.h"
#include "core/safetensors/chatglm_names.h"  // open_model_checkpoint
#include "core/safetensors/safetensors_file.h"
#include "schemes/method/tensor_decode.h"

namespace qparity::reference {

PixelInput read_pixel_file(const std::string& path) {
  const SafetensorsFile in = SafetensorsFile::open(path);
  const TensorInfo* px = in.find("pixel_values");
  const TensorInfo* gr = in.find("image_grid_thw");
  if (!px || !gr)
    throw Error(path, "needs tensors 'pixel_values' [N, C*T*P*P] and 'image_grid_thw' [n, 3]");
  if (px->shape.size() != 2) throw Error(path + ": 'pixel_values'", "must be 2-D");
  if (gr->shape.size() != 2 || gr->shape[1] != 3 ||
      (gr->dtype != DType::kI64 && gr->dtype != DType::kI32))
    throw Error(path + ": 'image_grid_thw'", "must be I64 or I32 [n, 3]");
  PixelInput p;
  p.pixels = Matrix(static_cast<int64_t>(px->shape[0]), static_cast<int64_t>(px->shape[1]));
  p.pixels.data = decode_all(px->dtype, in.bytes(*px), px->shape[0] * px->shape[1], "pixel_values");
  for (size_t i = 0; i < p.pixels.data.size(); ++i)
    if (!std::isfinite(p.pixels.data[i]))
      throw Error(path + ": 'pixel_values'",
                  "value " + std::to_string(i) + " is " + std::to_string(p.pixels.data[i]));
  const std::vector<double> g =
      decode_all(gr->dtype, in.bytes(*gr), gr->shape[0] * 3, "image_grid_thw");
  for (uint64_t i = 0; i < gr->shape[0]; ++i) {
    const GridThw grid{static_cast<int64_t>(g[3 * i]), static_cast<int64_t>(g[3 * i + 1]),
                       static_cast<int64_t>(g[3 * i + 2])};
    if (grid.t <= 0 || grid.h <= 0 || grid.w <= 0)
      throw Error(path + ": 'image_grid_thw'",
                  "row " + std::to_string(i) + " (" + std::to_string(grid.t) + ", " +
                      std::to_string(grid.h) + ", " + std::to_string(grid.w) + ") is not positive");
    p.grids.push_back(grid);
  }
  return p;
}

Qwen3VlVisionTower load_vision_tower(const std::string& model_dir, const ModelConfig& cfg) {
  const std::filesystem::path cfg_path = std::filesystem::path(model_dir) / "config.json";
  // Qwen3.5's image-text class carries the same tower without deepstack taps.
  if (!cfg.image_text || (cfg.arch != Arch::kQwen3Vl && cfg.arch != Arch::kQwen3_5))
    throw Error(cfg_path.string(), cfg.arch_name +
                                       " has no vision tower the reference runs "
                                       "(Qwen3VLForConditionalGeneration, "
                                       "Qwen3_5ForConditionalGeneration have)");
  const Json raw = read_json_file(cfg_path);
  const VisionConfig vc = parse_vision_config(require_key(raw, "vision_config", cfg_path.string()),
                                              key_where(cfg_path.string(), "vision_config"));
  if (vc.out_hidden != cfg.hidden)
    throw Error(key_where(cfg_path.string(), "vision_config"),
                "out_hidden_size " + std::to_string(vc.out_hidden) +
                    " is not the language model's hidden size " + std::to_string(cfg.hidden));
  const Checkpoint ck = open_model_checkpoint(model_dir, cfg);
  return Qwen3VlVisionTower(vc, ck);
}

std::vector<std::string> vision_capture_points(const VisionConfig& vc) {
  std::vector<std::string> names = {"visual.embed"};
  for (int64_t b = 0; b < vc.depth; ++b) {
    names.push_back("visual.blocks." + std::to_string(b) + ".out");
    for (size_t j = 0; j < vc.deepstack_indexes.size(); ++j)
      if (vc.deepstack_indexes[j] == b) names.push_back("visual.deepstack." + std::to_string(j));
  }
  names.push_back("visual.merger");
  return names;
}

ImageFeatures image_features(const Qwen3VlVisionTower& tower, const PixelInput& in, Trace* trace) {
  VisionOutput out = tower.forward(in.pixels, in.grids, trace);
  ImageFeatures f;
  f.embeds = std::move(out.merged);
  f.deepstack = std::move(out.deepstack);
  f.grids = in.grids;
  f.merge = tower.config().merge;
  return f;
}

}  // namespace qparity::reference
