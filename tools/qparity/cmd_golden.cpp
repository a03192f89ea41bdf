// `qparity golden make --model DIR [--scheme ID] (--tokens FILE | --token-ids L | --text FILE |
//  --synthetic N --seq-len T)
//  --out FILE [--pixels FILE]`: runs the fp64 reference and writes a schema-v1 golden dataset
// (golden/SCHEMA.md); --pixels gives an image-text checkpoint's prompts their images (the
// sequences' placeholder runs take them in order), stored with the vision tower's features.
// `qparity golden info FILE [--json]`: what a golden file holds (metadata, inputs, points).
#include <iostream>
#include <memory>
#include <string>
#include <vector>

#include "commands.h"
#include "core/capture/capture_points.h"
#include "core/error.h"
#include "core/memory_budget.h"
#include "golden/reference_run.h"
#include "golden/shard.h"
#include "reference_cpu/models/model_loader.h"
#include "tools/qparity/cli_support.h"

namespace qparity::cli {
namespace {

namespace fs = std::filesystem;

// --capture auto's limit on the uncompressed points of a golden.
constexpr uint64_t kAutoCaptureLimit = uint64_t{1} << 30;

struct MakeOptions {
  TextInput text;
  std::string model, scheme, dialect = "ideal", mode = "exact", tokens, token_ids, out,
                             capture = "auto", run_dtype, memory_budget, pixels, shard;
  int64_t synthetic = 0, seq_len = 0;
  uint64_t seed = 1;
  int tp = 1;
  bool f32 = false, force = false;
};

DType parse_run_dtype(const std::string& s) {
  if (s == "bf16") return DType::kBF16;
  if (s == "f16") return DType::kF16;
  if (s == "f32") return DType::kF32;
  throw Error("--run-dtype", "'" + s + "' (bf16, f16, f32)");
}

void make(const MakeOptions& o) {
  check_output_file(o.out, o.force);  // before the run, not after it
  golden::ReferenceRunOptions ro;
  if (!o.scheme.empty()) ro.scheme = o.scheme;
  ro.dialect = parse_dialect(o.dialect);
  ro.mode = reference::parse_precision_mode(o.mode);
  if (!o.run_dtype.empty()) ro.run_dtype = parse_run_dtype(o.run_dtype);
  ro.point_precision = o.f32 ? golden::PointPrecision::kF32 : golden::PointPrecision::kF64;
  ro.memory_budget = memory_budget_of(o.memory_budget);
  ro.tp = o.tp;
  const ModelConfig cfg = load_model_config(fs::path(o.model) / "config.json");
  golden::TokenInputs in =
      token_inputs("golden make", o.tokens, o.token_ids, o.synthetic, o.seq_len, cfg.vocab, o.seed,
                   {o.text.file, o.model, o.text.stride});
  if (!o.pixels.empty()) {
    if (!cfg.image_text)
      throw Error("--pixels", cfg.arch_name + " takes no images (an image-text checkpoint does)");
    in.pixels = reference::read_pixel_file(o.pixels);
    in.description += ", images from " + fs::path(o.pixels).filename().string();
  }
  ro.capture = o.capture;
  if (o.capture == "auto") {
    uint64_t full = 0;
    ro.capture =
        auto_capture(cfg, in.sequences * in.seq_len, o.f32 ? 4 : 8, kAutoCaptureLimit, &full);
    if (ro.capture != "*")
      std::cerr << "qparity golden: --capture auto: every point would take " << format_bytes(full)
                << " before compression (more than " << format_bytes(kAutoCaptureLimit)
                << "); capturing the layer boundaries " << ro.capture
                << " (--capture '*' keeps every point)\n";
  }
  check_capture_globs(ro.capture,
                      model_capture_points(cfg, true));  // a quantized cache adds its points
  // --shard I/N: sequences I, I+N, ... of the run (--capture auto was decided on the whole run,
  // so every shard captures what the whole run would).
  golden::ShardSpec shard;
  const int64_t total = in.sequences;
  if (!o.shard.empty()) {
    shard = golden::parse_shard(o.shard, "--shard");
    if (!in.pixels.grids.empty())
      throw UsageError("--shard", "image prompts (--pixels) are not sharded yet");
    const std::vector<int64_t> seqs = golden::shard_sequences(shard, total);
    if (seqs.empty())
      throw UsageError("--shard " + o.shard, "holds no sequence: the run has " +
                                                 std::to_string(total) + " (use at most " +
                                                 std::to_string(total) + " shards)");
    std::vector<int64_t> tokens;
    for (int64_t q : seqs)
      tokens.insert(tokens.end(), in.tokens.begin() + q * in.seq_len,
                    in.tokens.begin() + (q + 1) * in.seq_len);
    in.tokens = std::move(tokens);
    in.sequences = static_cast<int64_t>(seqs.size());
    std::cerr << "qparity golden: shard " << o.shard << ": sequences " << shard.index << ", "
              << shard.index + shard.count << ", ... (" << in.sequences << " of " << total << ")\n";
  }
  std::cerr << "qparity golden: " << in.sequences << " sequence(s) of " << in.seq_len << " tokens";
  if (!in.pixels.grids.empty()) std::cerr << " with " << in.pixels.grids.size() << " image(s)";
  std::cerr << " through " << o.model << "\n";
  golden::Golden g = golden::run_reference(o.model, in, ro, &std::cerr);
  g.meta.producer_version = QPARITY_VERSION;
  if (!o.shard.empty()) {
    g.meta.shard_index = shard.index;
    g.meta.shard_count = shard.count;
    g.meta.shard_total = total;
  }
  golden::write_golden(o.out, g, o.force ? OverwritePolicy::kReplace : OverwritePolicy::kRefuse);
  std::cerr << "qparity golden: " << g.points.size() << " capture points, logits [" << g.logits.rows
            << ", " << g.logits.cols << "], scheme " << g.meta.scheme << ", dialect "
            << g.meta.dialect << ", mode " << g.meta.precision_mode << " -> " << o.out << " ("
            << format_bytes(fs::file_size(o.out)) << "; peak resident "
            << format_bytes(peak_resident_bytes()) << ")\n";
}

void merge(const std::string& out, const std::vector<std::string>& files, bool force) {
  check_output_file(out, force);
  std::vector<golden::Golden> shards;
  for (const auto& f : files)
    shards.push_back(golden::GoldenReader::open(f).read_all());
  const golden::Golden g = golden::merge_shards(std::move(shards), files);
  golden::write_golden(out, g, force ? OverwritePolicy::kReplace : OverwritePolicy::kRefuse);
  std::cerr << "qparity golden: merged " << files.size() << " shards into " << g.sequences
            << " sequences of " << g.seq_len << " tokens -> " << out << "\n";
}

void info(const std::string& file, bool json) {
  const auto r = golden::GoldenReader::open(file);
  const auto& m = r.meta();
  const auto nll = r.sequence_nll();
  const auto ppl = r.sequence_ppl();
  if (json) {
    Json j = {{"file", file}, {"schema_version", golden::kSchemaVersion}};
    for (const auto& [name, field] : golden::meta_string_fields())
      j[name] = m.*field;
    j["seed"] = m.seed;
    if (!m.model_dtype.empty()) j["model_dtype"] = m.model_dtype;  // what the weights ran in
    j["point_dtype"] = golden::to_string(m.point_precision);
    j["sequences"] = r.sequences();
    j["seq_len"] = r.seq_len();
    j["points"] = r.point_names();
    if (m.shard_count > 0)
      j["shard"] = {
          {"index", m.shard_index}, {"count", m.shard_count}, {"sequences", m.shard_total}};
    if (r.has_images()) j["images"] = r.images().images();
    j["sequence_nll"] = nll;
    j["sequence_ppl"] = ppl;
    std::cout << j.dump(2) << "\n";
    return;
  }
  std::cout << file << ": qparity golden v" << golden::kSchemaVersion << "\n"
            << "  producer   " << m.producer << " " << m.producer_version << " on " << m.device
            << ", " << m.created << "\n"
            << "  model      " << m.model << " (" << m.architecture << "), config sha256 "
            << m.model_config_hash.substr(0, 16) << "..., tensors sha256 "
            << m.checkpoint_hash.substr(0, 16) << "...\n"
            << "  scheme     " << m.scheme << ", dialect " << m.dialect << ", mode "
            << m.precision_mode
            << (m.model_dtype.empty() ? "" : ", weights run in " + m.model_dtype) << "\n"
            << "  inputs     " << r.sequences() << " x " << r.seq_len() << " tokens ("
            << m.input_set << ")\n"
            << "  points     " << r.point_names().size() << " ("
            << golden::to_string(m.point_precision) << ")\n";
  if (m.shard_count > 0)
    std::cout << "  shard      " << m.shard_index << "/" << m.shard_count << " of a run of "
              << m.shard_total << " sequences (golden merge assembles the run)\n";
  if (r.has_images()) {
    const golden::GoldenImages im = r.images();
    std::cout << "  images     " << im.images() << " (" << im.pixels.rows << " patches, "
              << im.embeds.rows << " image tokens, " << im.deepstack.size()
              << " deepstack features)\n";
  }
  for (size_t s = 0; s < nll.size(); ++s)
    std::cout << "  sequence " << s << ": NLL " << nll[s] << ", PPL " << ppl[s] << "\n";
}

}  // namespace

void add_golden_command(CLI::App& app, int& rc) {
  auto* golden = app.add_subcommand("golden", "Golden HDF5 datasets (golden/SCHEMA.md)");
  golden->require_subcommand(1);
  auto o = std::make_shared<MakeOptions>();
  auto* mk = golden->add_subcommand("make", "Run the fp64 reference and write a golden dataset");
  mk->add_option("--model", o->model, "Hugging Face checkpoint directory")->required();
  mk->add_option("--scheme", o->scheme, "override the checkpoint's quantization (scheme id)");
  mk->add_option("--dialect", o->dialect,
                 "ideal | compressed-tensors | vllm | sglang | msmodelslim")
      ->capture_default_str()
      ->check(dialect_choices());
  mk->add_option("--mode", o->mode, "exact | emulate")
      ->capture_default_str()
      ->check(mode_choices());
  mk->add_option("--run-dtype", o->run_dtype,
                 "run the weights (and emulate mode's stored activations) in this dtype, as the "
                 "engine being judged does: bf16 | f16 | f32 (default: the checkpoint's)")
      ->check(CLI::IsMember({"bf16", "f16", "f32"}));
  add_token_options(mk, o->tokens, o->token_ids, o->text);
  mk->add_option("--pixels", o->pixels,
                 "the prompts' images (image-text checkpoints): safetensors with pixel_values "
                 "[N, C*T*P*P] and image_grid_thw [n, 3], taken by the placeholder runs in order");
  mk->add_option("--synthetic", o->synthetic, "N synthetic sequences (with --seq-len, --seed)")
      ->check(CLI::Range(int64_t{1}, int64_t{1} << 24));
  mk->add_option("--seq-len", o->seq_len,
                 "tokens per sequence (--tokens / --token-ids are cut into sequences of it)")
      ->check(CLI::Range(int64_t{1}, int64_t{1} << 24));
  mk->add_option("--seed", o->seed, "seed of the synthetic tokens")
      ->check(seed_check())
      ->capture_default_str();
  mk->add_option("--capture", o->capture,
                 "capture-point globs, comma-separated; auto: every point while the golden stays "
                 "under 1 GiB before compression, else the layer boundaries (" +
                     std::string(kBoundaryCapture) + ")")
      ->capture_default_str();
  mk->add_flag("--f32", o->f32, "store capture points as float32 (logits stay float64)");
  mk->add_option("--tp", o->tp,
                 "the arithmetic of tensor parallelism N at the row-parallel layers (o_proj, "
                 "down_proj: each rank's partial product rounded as stored, then summed), the spec "
                 "an `engine run --tp N` dump is judged by; dense models")
      ->check(CLI::Range(1, 64))
      ->capture_default_str();
  add_memory_budget_option(mk, o->memory_budget);
  mk->add_option("--out", o->out, "golden .h5 file to write")->required();
  mk->add_flag("--force", o->force, "replace an existing golden file");
  mk->add_option("--shard", o->shard,
                 "I/N: compute only sequences I, I+N, I+2N, ... of the run (one task of a job "
                 "array); golden merge assembles the shards into the whole run's golden");
  mk->callback([o, &rc] {
    make(*o);
    rc = 0;
  });
  auto merge_out = std::make_shared<std::string>();
  auto merge_files = std::make_shared<std::vector<std::string>>();
  auto merge_force = std::make_shared<bool>(false);
  auto* mg = golden->add_subcommand(
      "merge", "Assemble the shards of golden make --shard into the whole run's golden");
  mg->add_option("shards", *merge_files, "the shards' .h5 files, all N of them")->required();
  mg->add_option("--out", *merge_out, "golden .h5 file to write")->required();
  mg->add_flag("--force", *merge_force, "replace an existing golden file");
  mg->callback([merge_out, merge_files, merge_force, &rc] {
    merge(*merge_out, *merge_files, *merge_force);
    rc = 0;
  });
  auto file = std::make_shared<std::string>();
  auto json = std::make_shared<bool>(false);
  auto* inf = golden->add_subcommand("info", "What a golden file holds");
  inf->add_option("file", *file, "golden .h5 file")->required();
  inf->add_flag("--json", *json, "machine-readable");
  inf->callback([file, json, &rc] {
    info(*file, *json);
    rc = 0;
  });
}

}  // namespace qparity::cli
