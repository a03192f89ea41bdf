// `qparity trace --model DIR (--tokens FILE | --token-ids 1,2,3 | --text FILE | --synthetic N)
// --out FILE`: runs the fp64 reference model on a token sequence and writes every selected
// capture point (ARCHITECTURE.md names: embed, layers.<i>.*, final_norm, logits) as an F64 [T, ...]
// tensor, plus `tokens` (I64) and metadata (scheme plan source, dialect, mode, model dir). The
// precursor of the HDF5 golden file: same capture-point names. --decode runs the tokens one decode
// step at a time over the KV cache instead of one prefill (the two must agree; see the integration
// tests); --prefill N runs the first N of them as one prefill before the decode steps.
// --pixels FILE (image-text checkpoints: Qwen3-VL, Qwen3.5's image-text class) gives the prompt's
// images (reference_cpu/models/image_input.h): the vision tower runs on them (its visual.* points
// join the trace), and the prompt's placeholder runs take its features
// (CausalLm::forward_image_prompt): the images must lie in the prefill.
#include <unistd.h>

#include <algorithm>
#include <fstream>
#include <iostream>
#include <random>
#include <sstream>

#include "core/capture/capture_points.h"
#include "core/error.h"
#include "core/safetensors/safetensors_writer.h"
#include "reference_cpu/models/image_input.h"
#include "reference_cpu/models/model_loader.h"
#include "schemes/method/host_tensor.h"
#include "tools/qparity/cli_support.h"
#include "tools/qparity/commands.h"

namespace qparity::cli {

namespace {

using namespace qparity::reference;

struct TraceOptions {
  TextInput text;
  std::string model;
  std::string tokens;
  std::string token_ids;
  std::string pixels;
  int64_t prefill = 0;
  int64_t synthetic = 0;
  uint64_t seed = 0;
  std::string scheme;
  std::string dialect = "ideal";
  std::string mode = "exact";
  std::string capture = "*";
  std::string out;
  std::string memory_budget;
  bool decode = false;
  bool force = false;
};

void run(const TraceOptions& o) {
  check_output_file(o.out, o.force);  // before the run, not after it
  const ModelConfig cfg = load_model_config(std::filesystem::path(o.model) / "config.json");
  std::vector<std::string> points = model_capture_points(cfg, true);  // a quantized cache's too
  std::optional<Qwen3VlVisionTower> tower;
  std::optional<PixelInput> pixels;
  if (!o.pixels.empty()) {
    tower.emplace(load_vision_tower(o.model, cfg));
    pixels.emplace(read_pixel_file(o.pixels));
    const std::vector<std::string> vp = vision_capture_points(tower->config());
    points.insert(points.begin(), vp.begin(), vp.end());
  }
  check_capture_globs(o.capture, points);
  if (o.prefill > 0 && !o.decode)
    throw Error("--prefill", "splits a --decode run (the first N tokens as one prefill)");
  // One sequence: every id of the file or list, or --synthetic N tokens.
  const golden::TokenInputs in =
      token_inputs("trace", o.tokens, o.token_ids, o.synthetic > 0 ? 1 : 0, o.synthetic, cfg.vocab,
                   o.seed, {o.text.file, o.model, o.text.stride});
  const std::vector<int64_t>& tokens = in.tokens;
  if (o.prefill > static_cast<int64_t>(tokens.size()))
    throw Error("--prefill", std::to_string(o.prefill) + " tokens of a sequence of " +
                                 std::to_string(tokens.size()));
  if (pixels) {
    const auto last = std::find(tokens.rbegin(), tokens.rend(), cfg.image_token_id);
    const auto need = static_cast<int64_t>(tokens.rend() - last);  // 1 + the last placeholder
    if (o.decode && o.prefill < need)
      throw Error("--prefill",
                  "the images are placed by the prompt's prefill: with --decode it "
                  "must cover the last image placeholder (token " +
                      std::to_string(need - 1) + "), got " + std::to_string(o.prefill));
  }
  LoadOptions lo;
  if (!o.scheme.empty()) lo.override_scheme = o.scheme;
  lo.dialect = parse_dialect(o.dialect);
  lo.mode = parse_precision_mode(o.mode);
  lo.streaming = LayerStreaming::kAuto;
  lo.memory_budget = memory_budget_of(o.memory_budget);
  auto model = load_model(o.model, lo);
  if (model->streams_layers()) {
    if (o.decode)
      throw Error("--decode",
                  "the checkpoint is larger than the memory budget, so the reference "
                  "streams it one layer at a time and keeps no KV cache between "
                  "steps: decode needs the whole model (a larger --memory-budget)");
    std::cerr << "qparity trace: streaming the model one decoder layer at a time\n";
  }
  Trace trace(o.capture);
  ForwardHooks hooks;
  hooks.trace = &trace;
  const size_t first =
      o.decode ? static_cast<size_t>(o.prefill) : tokens.size();  // tokens in the prefill
  if (first > 0) {
    const std::span<const int64_t> prompt(tokens.data(), first);
    if (pixels)
      model->forward_image_prompt(prompt, image_features(*tower, *pixels, &trace), hooks);
    else
      model->forward(prompt, hooks);
  }
  if (o.decode) {
    // Progress on one line on a terminal; plain lines (every 10 %) into a pipe or a CI log.
    const bool tty = ::isatty(STDERR_FILENO) != 0;
    const size_t every = std::max<size_t>(1, tokens.size() / 10);
    for (size_t i = first; i < tokens.size(); ++i) {
      model->forward(std::span<const int64_t>(tokens).subspan(i, 1), hooks);
      if (tty)
        std::cerr << "\rqparity trace: token " << (i + 1) << "/" << tokens.size() << std::flush;
      else if ((i + 1) % every == 0 || i + 1 == tokens.size())
        std::cerr << "qparity trace: token " << (i + 1) << "/" << tokens.size() << "\n";
    }
    if (tty) std::cerr << "\n";
  }
  std::vector<HostTensor> keep;
  keep.reserve(trace.points().size() + 1);
  std::vector<TensorToWrite> out;
  keep.push_back(encode_ints(DType::kI64, {static_cast<int64_t>(tokens.size())}, tokens, "tokens"));
  out.push_back({"tokens", DType::kI64, {tokens.size()}, keep.back().bytes});
  for (const auto& [name, m] : trace.points()) {
    keep.push_back(encode(DType::kF64, {m.rows, m.cols}, m.data, Encoding::kExact, name));
    out.push_back({name,
                   DType::kF64,
                   {static_cast<uint64_t>(m.rows), static_cast<uint64_t>(m.cols)},
                   keep.back().bytes});
  }
  const std::map<std::string, std::string> meta = {
      {"producer", "qparity trace"},
      {"model", o.model},
      {"arch", std::string(arch_name(model->config().arch))},
      {"scheme_source", std::string(to_string(model->plan().source()))},
      {"scheme_override", o.scheme},
      {"dialect", std::string(to_string(lo.dialect))},
      {"mode", std::string(to_string(lo.mode))},
      {"steps", o.decode ? "decode" : "prefill"},
      {"prefill_tokens", std::to_string(first)},
      {"pixels", o.pixels},
      {"images", std::to_string(pixels ? pixels->grids.size() : 0)}};
  write_safetensors(o.out, std::move(out), meta,
                    o.force ? OverwritePolicy::kReplace : OverwritePolicy::kRefuse);
  std::cerr << "qparity trace: " << tokens.size() << " tokens, " << trace.points().size()
            << " capture points, dialect " << to_string(lo.dialect) << ", mode "
            << to_string(lo.mode) << " -> " << o.out << "\n";
}

}  // namespace

void add_trace_command(CLI::App& app, int& rc) {
  auto o = std::make_shared<TraceOptions>();
  auto* cmd = app.add_subcommand(
      "trace", "Run the fp64 reference model on tokens and write every capture point (F64)");
  cmd->add_option("--model", o->model, "Hugging Face checkpoint directory")->required();
  add_token_options(cmd, o->tokens, o->token_ids, o->text);
  cmd->add_option("--synthetic", o->synthetic, "N random tokens (with --seed)")
      ->check(CLI::Range(int64_t{1}, int64_t{1} << 24));
  cmd->add_option("--seed", o->seed, "seed for --synthetic")
      ->check(seed_check())
      ->capture_default_str();
  cmd->add_option("--scheme", o->scheme, "override the checkpoint's quantization (scheme id)");
  cmd->add_option("--dialect", o->dialect,
                  "ideal | compressed-tensors | vllm | sglang | msmodelslim")
      ->capture_default_str()
      ->check(dialect_choices());
  cmd->add_option("--mode", o->mode, "exact | emulate (bf16 activations between ops)")
      ->capture_default_str()
      ->check(mode_choices());
  cmd->add_option("--capture", o->capture, "capture-point globs, comma-separated")
      ->capture_default_str();
  cmd->add_flag("--decode", o->decode, "one decode step per token instead of one prefill");
  cmd->add_option("--prefill", o->prefill,
                  "with --decode: the first N tokens as one prefill, then decode steps")
      ->check(CLI::NonNegativeNumber);
  cmd->add_option("--pixels", o->pixels,
                  "the prompt's images (image-text checkpoints): safetensors with pixel_values "
                  "[N, C*T*P*P] and image_grid_thw [n, 3]");
  add_memory_budget_option(cmd, o->memory_budget);
  cmd->add_option("--out", o->out, "safetensors file to write")->required();
  cmd->add_flag("--force", o->force, "replace an existing output file");
  cmd->callback([o, &rc] {
    run(*o);
    rc = 0;
  });
}

}  // namespace qparity::cli
