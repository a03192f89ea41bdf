// `qparity trace-vision --model DIR --pixels FILE --out FILE [--capture GLOBS] [--force]`: runs
// an image-text checkpoint's vision tower (Qwen3-VL, Qwen3.5:
// reference_cpu/models/qwen3_vl_vision.h) in fp64 on pixel patches and writes its capture points
// (visual.embed, visual.blocks.<i>.out, visual.deepstack.<j>, visual.merger) as F64 tensors. FILE
// is a safetensors file holding `pixel_values` [N, C·T·P·P] (any float dtype, rows in the
// processor's merge-window order) and `image_grid_thw` [n, 3] (I64 or I32: t, h, w per image, in
// patches). The language model does not run: image tokens in a decoder forward are not implemented
// yet.
#include <filesystem>
#include <iostream>

#include "core/capture/trace.h"
#include "core/error.h"
#include "core/safetensors/chatglm_names.h"  // open_model_checkpoint
#include "core/safetensors/safetensors_file.h"
#include "core/safetensors/safetensors_writer.h"
#include "reference_cpu/models/qwen3_vl_vision.h"
#include "reference_cpu/quant/host_tensor.h"
#include "reference_cpu/tensor_decode.h"
#include "tools/qparity/cli_support.h"
#include "tools/qparity/commands.h"

namespace qparity::cli {

namespace {

namespace fs = std::filesystem;
using namespace qparity::reference;

struct TraceVisionOptions {
  std::string model;
  std::string pixels;
  std::string capture = "*";
  std::string out;
  bool force = false;
};

void run(const TraceVisionOptions& o) {
  check_output_file(o.out, o.force);
  const fs::path cfg_path = fs::path(o.model) / "config.json";
  const Json raw = read_json_file(cfg_path);
  const ModelConfig cfg = parse_model_config(raw, cfg_path.string());
  // Qwen3.5's image-text class carries the same tower without deepstack taps.
  if (!cfg.image_text || (cfg.arch != Arch::kQwen3Vl && cfg.arch != Arch::kQwen3_5))
    throw Error(cfg_path.string(), cfg.arch_name +
                                       ": trace-vision runs the vision tower of "
                                       "Qwen3VLForConditionalGeneration or "
                                       "Qwen3_5ForConditionalGeneration");
  const VisionConfig vc = parse_vision_config(require_key(raw, "vision_config", cfg_path.string()),
                                              key_where(cfg_path.string(), "vision_config"));
  const Checkpoint ck = open_model_checkpoint(o.model, cfg);
  const Qwen3VlVisionTower tower(vc, ck);

  const SafetensorsFile in = SafetensorsFile::open(o.pixels);
  const TensorInfo* px = in.find("pixel_values");
  const TensorInfo* gr = in.find("image_grid_thw");
  if (!px || !gr)
    throw Error(o.pixels, "needs tensors 'pixel_values' [N, C*T*P*P] and 'image_grid_thw' [n, 3]");
  if (px->shape.size() != 2) throw Error(o.pixels + ": 'pixel_values'", "must be 2-D");
  if (gr->shape.size() != 2 || gr->shape[1] != 3 ||
      (gr->dtype != DType::kI64 && gr->dtype != DType::kI32))
    throw Error(o.pixels + ": 'image_grid_thw'", "must be I64 or I32 [n, 3]");
  Matrix pixels(static_cast<int64_t>(px->shape[0]), static_cast<int64_t>(px->shape[1]));
  pixels.data = decode_all(px->dtype, in.bytes(*px), px->shape[0] * px->shape[1], "pixel_values");
  const std::vector<double> g =
      decode_all(gr->dtype, in.bytes(*gr), gr->shape[0] * 3, "image_grid_thw");
  std::vector<GridThw> grids;
  for (uint64_t i = 0; i < gr->shape[0]; ++i)
    grids.push_back({static_cast<int64_t>(g[3 * i]), static_cast<int64_t>(g[3 * i + 1]),
                     static_cast<int64_t>(g[3 * i + 2])});

  Trace trace(o.capture);
  tower.forward(pixels, grids, &trace);
  if (trace.points().empty())
    throw Error("--capture " + o.capture,
                "matches no vision capture point (visual.embed, "
                "visual.blocks.<i>.out, visual.deepstack.<j>, "
                "visual.merger)");
  std::vector<HostTensor> keep;
  keep.reserve(trace.points().size());
  std::vector<TensorToWrite> out;
  for (const auto& [name, m] : trace.points()) {
    keep.push_back(encode(DType::kF64, {m.rows, m.cols}, m.data, Encoding::kExact, name));
    out.push_back({name,
                   DType::kF64,
                   {static_cast<uint64_t>(m.rows), static_cast<uint64_t>(m.cols)},
                   keep.back().bytes});
  }
  write_safetensors(
      o.out, std::move(out),
      std::map<std::string, std::string>{{"producer", "qparity trace-vision"}, {"model", o.model}},
      o.force ? OverwritePolicy::kReplace : OverwritePolicy::kRefuse);
  std::cerr << "qparity trace-vision: " << pixels.rows << " patches in " << grids.size()
            << " image(s), " << trace.points().size() << " capture points -> " << o.out << "\n";
}

}  // namespace

void add_trace_vision_command(CLI::App& app, int& rc) {
  auto o = std::make_shared<TraceVisionOptions>();
  auto* cmd = app.add_subcommand(
      "trace-vision",
      "Run an image-text checkpoint's vision tower (Qwen3-VL) in fp64 on pixel patches and write "
      "its capture points (F64)");
  cmd->add_option("--model", o->model, "Hugging Face checkpoint directory")->required();
  cmd->add_option("--pixels", o->pixels,
                  "safetensors file with pixel_values [N, C*T*P*P] and image_grid_thw [n, 3]")
      ->required();
  cmd->add_option("--capture", o->capture, "capture-point globs, comma-separated")
      ->capture_default_str();
  cmd->add_option("--out", o->out, "safetensors file to write")->required();
  cmd->add_flag("--force", o->force, "replace an existing output file");
  cmd->callback([o, &rc] {
    run(*o);
    rc = 0;
  });
}

}  // namespace qparity::cli
