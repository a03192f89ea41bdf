// `qparity trace-vision --model DIR --pixels FILE --out FILE [--capture GLOBS] [--force]`: runs
// an image-text checkpoint's vision tower (Qwen3-VL, Qwen3.5:
// reference_cpu/models/qwen3_vl_vision.h) in fp64 on pixel patches and writes its capture points
// (visual.embed, visual.blocks.<i>.out, visual.deepstack.<j>, visual.merger) as F64 tensors. FILE
// is a safetensors file holding `pixel_values` [N, C·T·P·P] (any float dtype, rows in the
// processor's merge-window order) and `image_grid_thw` [n, 3] (I64 or I32: t, h, w per image, in
// patches). The language model does not run: `qparity trace --pixels` runs both.
#include <filesystem>
#include <iostream>

#include "core/capture/trace.h"
#include "core/error.h"
#include "core/safetensors/safetensors_writer.h"
#include "reference_cpu/models/image_input.h"
#include "reference_cpu/models/model_loader.h"
#include "schemes/method/host_tensor.h"
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
  const ModelConfig cfg = load_model_config(fs::path(o.model) / "config.json");
  const Qwen3VlVisionTower tower = load_vision_tower(o.model, cfg);
  const PixelInput in = read_pixel_file(o.pixels);
  const Matrix& pixels = in.pixels;
  const std::vector<GridThw>& grids = in.grids;

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
