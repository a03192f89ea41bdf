// `qparity make-fixture --shape {llama3-8b,qwen3-0.6b} [--layers N] --seed S --out DIR`: a released
// model's shape with random bf16 weights (fixtures/shaped_checkpoint.h), for size and speed.
// `qparity make-fixture --arch {llama,qwen3,qwen3-moe,mistral,chatglm2,qwen3.5,qwen3-vl} [--scheme
// ID]
// [--dialect D]
// [--size tiny|small] [--hidden H] [--intermediate I] [--moe-intermediate I] --seed S --out DIR
// [--force]`: a deterministic fixture checkpoint
// (fixtures/fixture_model.h). Without --scheme, the floating-point checkpoint; with it, the
// floating-point checkpoint is written to a temporary directory and quantized into DIR the way
// the scheme's producer writes it (fixtures/checkpoint_quantizer.h), with statistics from running
// the fp64 reference of the floating-point fixture on --calib-tokens synthetic tokens. --dialect
// defaults to ideal, as in every command (the producer's own arithmetic: --dialect msmodelslim or
// compressed-tensors); the file layout is the scheme's producer's. One line per step on stderr.
// Existing files are kept unless --force. --hidden / --intermediate / --moe-intermediate
// override the size's own (e.g. --hidden 64 --intermediate 172, a real small checkpoint's shapes
// that break the group schemes' K rules).
#include <unistd.h>

#include <filesystem>
#include <iostream>
#include <memory>
#include <optional>
#include <string>
#include <tuple>
#include <utility>

#include "core/error.h"
#include "fixtures/checkpoint_quantizer.h"
#include "fixtures/fixture_model.h"
#include "fixtures/shaped_checkpoint.h"
#include "schemes/description/scheme_registry.h"
#include "tools/qparity/cli_support.h"
#include "tools/qparity/commands.h"

namespace qparity::cli {

namespace {

namespace fs = std::filesystem;

struct MakeFixtureOptions {
  std::string arch, shape;
  int64_t layers = 0;
  std::string scheme;
  std::string dialect;
  std::string size = "tiny";
  uint64_t seed = 0;
  int64_t hidden = 0, intermediate = 0, moe_intermediate = 0;
  int64_t calib_tokens = 64;
  std::string out;
  bool force = false;
};

// Removes the temporary floating-point checkpoint however the command ends.
class TempDir {
 public:
  explicit TempDir(fs::path p) : path_(std::move(p)) {}
  ~TempDir() {
    std::error_code ec;
    fs::remove_all(path_, ec);
  }
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;
  const fs::path& path() const { return path_; }

 private:
  fs::path path_;
};

void run(const MakeFixtureOptions& o) {
  if (!o.shape.empty()) {
    if (!o.arch.empty() || !o.scheme.empty() || o.hidden || o.intermediate || o.moe_intermediate)
      throw UsageError("--shape",
                       "a real model's shape fixes the architecture and sizes, and "
                       "its weights stay bf16 (quantize them with `qparity quantize`)");
    std::cerr << "make-fixture: writing " << o.shape << "-shaped random bf16 weights (seed "
              << o.seed << ") to " << o.out << "\n";
    fixtures::write_shaped_checkpoint(
        o.shape, o.seed, o.out, o.force ? OverwritePolicy::kReplace : OverwritePolicy::kRefuse,
        o.layers, &std::cerr);
    std::cerr << "make-fixture: done\n";
    return;
  }
  if (o.arch.empty()) throw UsageError("--arch", "required (or --shape)");
  if (o.layers) throw UsageError("--layers", "only with --shape");
  // A fixture is small by purpose (real sizes: --shape); the bound names the option instead of
  // an allocation failing somewhere inside the writer (main: std::bad_alloc at --hidden 1048576).
  constexpr int64_t kMaxFixtureDim = 16384;
  for (const auto& [name, v] :
       {std::pair{"--hidden", o.hidden}, std::pair{"--intermediate", o.intermediate},
        std::pair{"--moe-intermediate", o.moe_intermediate}})
    if (v > kMaxFixtureDim)
      throw UsageError(name, std::to_string(v) + " is beyond a fixture's " +
                                 std::to_string(kMaxFixtureDim) +
                                 " (a real model's sizes: --shape, e.g. llama3-8b)");
  fixtures::FixtureSpec spec;
  spec.arch = fixtures::parse_fixture_arch(o.arch);
  spec.size = fixtures::parse_fixture_size(o.size);
  spec.seed = o.seed;
  spec.hidden = o.hidden;
  spec.intermediate = o.intermediate;
  spec.moe_intermediate = o.moe_intermediate;
  const OverwritePolicy policy = o.force ? OverwritePolicy::kReplace : OverwritePolicy::kRefuse;
  const std::string label = o.arch + " " + o.size + " (seed " + std::to_string(o.seed) + ")";
  if (o.scheme.empty()) {
    if (!o.dialect.empty())
      throw UsageError("--dialect", "only meaningful with --scheme (the producer's arithmetic)");
    std::cerr << "make-fixture: writing floating-point " << label << " to " << o.out << "\n";
    fixtures::write_fp_checkpoint(spec, o.out, policy);
    std::cerr << "make-fixture: done\n";
    return;
  }
  const SchemeId scheme = parse_scheme_id(o.scheme);
  // One default dialect everywhere: ideal, the format as written (docs/DIALECTS.md).
  const Dialect dialect = parse_dialect(o.dialect.empty() ? "ideal" : o.dialect);
  const TempDir tmp(
      fs::temp_directory_path() /
      ("qparity-make-fixture-" + std::to_string(::getpid()) + "-" + std::to_string(o.seed)));
  std::cerr << "make-fixture: writing floating-point " << label << " to " << tmp.path().string()
            << "\n";
  fixtures::write_fp_checkpoint(spec, tmp.path(), OverwritePolicy::kReplace);
  const ModelConfig cfg = load_model_config(tmp.path() / "config.json");
  std::cerr << "make-fixture: calibrating on " << o.calib_tokens
            << " synthetic tokens through the fp64 reference\n";
  const auto tokens = reference::synthetic_tokens(o.calib_tokens, cfg.vocab, o.seed);
  const auto stats = fixtures::calibrate_checkpoint(tmp.path(), tokens);
  std::cerr << "make-fixture: quantizing with " << to_string(scheme) << " (dialect "
            << qparity::to_string(dialect) << ") into " << o.out << "\n";
  fixtures::quantize_checkpoint(tmp.path(), scheme, dialect, o.out, stats, policy, &std::cerr);
  std::cerr << "make-fixture: done\n";
}

}  // namespace

void add_make_fixture_command(CLI::App& app, int& rc) {
  auto o = std::make_shared<MakeFixtureOptions>();
  auto* cmd = app.add_subcommand(
      "make-fixture",
      "Write a deterministic fixture checkpoint (tiny/small Llama, Qwen3, Qwen3-MoE, Mistral, "
      "ChatGLM2, Qwen3.5, Qwen3-VL), floating "
      "point or quantized with a scheme the way its producer writes it");
  cmd->add_option("--arch", o->arch,
                  "llama | qwen3 | qwen3-moe | mistral | chatglm2 | qwen3.5 | qwen3-vl")
      ->check(CLI::IsMember({"llama", "qwen3", "qwen3-moe", "mistral", "chatglm2", "qwen3.5",
                             "qwen3-vl", "gpt-oss"}));
  cmd->add_option("--shape", o->shape,
                  "instead of --arch: a released model's shape with random bf16 weights, sharded "
                  "(llama3-8b: 16 GB, qwen3-0.6b), for measuring the reference at real size")
      ->check(CLI::IsMember(fixtures::shaped_checkpoint_names()));
  cmd->add_option("--layers", o->layers, "--shape: this many decoder layers instead of the model's")
      ->check(CLI::Range(int64_t{1}, int64_t{1024}));
  cmd->add_option("--scheme", o->scheme, "Scheme id (see `qparity schemes`); omit for bf16");
  cmd->add_option("--dialect", o->dialect,
                  "producer dialect: ideal | compressed-tensors | vllm | sglang | msmodelslim "
                  "(default: the scheme's producer)");
  cmd->add_option("--calib-tokens", o->calib_tokens,
                  "synthetic calibration tokens run through the reference (static schemes)")
      ->capture_default_str()
      ->check(CLI::Range(int64_t{1}, int64_t{1} << 20));
  cmd->add_option("--size", o->size, "tiny | small")
      ->capture_default_str()
      ->check(CLI::IsMember({"tiny", "small"}));
  for (auto [flag, v, what] :
       {std::tuple{"--hidden", &o->hidden, "hidden_size (head_dim follows: hidden / heads)"},
        std::tuple{"--intermediate", &o->intermediate, "intermediate_size (dense MLP)"},
        std::tuple{"--moe-intermediate", &o->moe_intermediate, "moe_intermediate_size"}})
    cmd->add_option(flag, *v, std::string(what) + "; default: the size's own")
        ->check(CLI::Range(int64_t{1}, int64_t{1} << 20));
  cmd->add_option("--seed", o->seed, "generator seed (same seed -> identical files)")
      ->check(seed_check())
      ->required();
  cmd->add_option("--out", o->out, "output directory")->required();
  cmd->add_flag("--force", o->force, "replace existing output files");
  cmd->callback([o, &rc] {
    run(*o);
    rc = 0;
  });
}

}  // namespace qparity::cli
