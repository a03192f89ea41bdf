// `qparity quantize --in FP_CHECKPOINT --scheme ID --out DIR [--dialect D] [--calib TOKENS]`:
// post-training quantization of any bf16 / fp16 / fp32 Llama, Qwen3 or Qwen3-MoE checkpoint into
// a scheme, laid out as the scheme's producer lays it out (fixtures/checkpoint_quantizer.h:
// compressed-tensors config.json + safetensors, or msModelSlim quant_model_weights +
// quant_model_description.json). Static-activation schemes, smooth-quant and KV-cache schemes
// take their statistics from running the fp64 reference of the input checkpoint on calibration
// tokens: --calib (token ids: comma / space / newline separated), or --calib-synthetic N
// pseudo-random tokens (seeded) when none are given. Progress on stderr.
// --ignore ENTRY (repeatable: a module name, or re:<regex> as compressed-tensors' ignore entries)
// leaves linears in the model dtype. Before calibrating, the scheme's shape rules are checked
// (fixtures::scheme_exclusions): a linear the scheme cannot take that is not ignored is an error
// naming it and its rule; --ignore-unsupported ignores exactly those linears instead.
#include <fstream>
#include <iostream>
#include <sstream>
#include <string>
#include <vector>

#include "core/config/model_config.h"
#include "core/error.h"
#include "fixtures/checkpoint_quantizer.h"
#include "golden/reference_run.h"
#include "reference_cpu/models/calibration.h"
#include "schemes/description/scheme_registry.h"
#include "tools/qparity/cli_support.h"
#include "tools/qparity/commands.h"

namespace qparity::cli {

namespace {

struct QuantizeOptions {
  std::string in, out, scheme, dialect = "ideal", calib;
  int64_t calib_synthetic = 2048;
  uint64_t seed = 0;
  bool force = false;
  std::vector<std::string> ignore;
  bool ignore_unsupported = false;
};

void run(const QuantizeOptions& o) {
  const SchemeId scheme = parse_scheme_id(o.scheme);
  const std::vector<Producer>& producers = scheme_info(scheme.kind).producers;
  // One default dialect everywhere (ideal: the format as written); the producer's own arithmetic
  // is one --dialect away, and every output says which was used.
  const Dialect dialect = parse_dialect(o.dialect);
  const bool msm_only = !producers.empty() && producers.front() == Producer::kMsModelSlim;
  if (o.dialect == "ideal")
    std::cerr << "quantize: dialect ideal (the default: the format as written; --dialect "
              << (msm_only ? "msmodelslim" : "compressed-tensors")
              << " for the producer's own arithmetic)\n";
  const ModelConfig cfg = load_model_config(std::filesystem::path(o.in) / "config.json");
  // Cheap checks first (headers only): calibration can take minutes.
  fixtures::QuantizeCheckpointOptions qo;
  qo.ignore = o.ignore;
  qo.ignore_unsupported = o.ignore_unsupported;
  const fixtures::IgnorePlan ignored = fixtures::plan_ignore(o.in, scheme, dialect, qo);
  for (const fixtures::SchemeExclusion& x : ignored.added)
    std::cerr << "quantize: ignoring " << x.module << " (" << x.rule << ")\n";
  qo.ignore = ignored.entries;
  qo.ignore_unsupported = false;
  fixtures::StatsProviders stats;
  if (fixtures::needs_calibration(scheme, dialect)) {
    const std::vector<int64_t> tokens =
        o.calib.empty() ? reference::synthetic_tokens(o.calib_synthetic, cfg.vocab, o.seed)
                        : golden::file_inputs(o.calib, 0).tokens;
    std::cerr << "quantize: calibrating on " << tokens.size()
              << (o.calib.empty() ? " synthetic" : "") << " tokens through the fp64 reference of "
              << o.in << "\n";
    stats = fixtures::calibrate_checkpoint(o.in, tokens);
  }
  std::cerr << "quantize: " << to_string(scheme) << " (dialect " << qparity::to_string(dialect)
            << ") -> " << o.out << "\n";
  fixtures::quantize_checkpoint(o.in, scheme, dialect, o.out, stats,
                                o.force ? OverwritePolicy::kReplace : OverwritePolicy::kRefuse,
                                &std::cerr, qo);
}

}  // namespace

void add_quantize_command(CLI::App& app, int& rc) {
  auto o = std::make_shared<QuantizeOptions>();
  auto* cmd = app.add_subcommand(
      "quantize", "Quantize a floating-point checkpoint into a scheme, as its producer writes it");
  cmd->add_option("--in", o->in, "floating-point Hugging Face checkpoint directory")->required();
  cmd->add_option("--scheme", o->scheme, "Scheme id (see `qparity schemes`)")->required();
  cmd->add_option("--out", o->out, "output directory")->required();
  cmd->add_option("--dialect", o->dialect,
                  "producer arithmetic: ideal (the format as written) | compressed-tensors | "
                  "msmodelslim | vllm | sglang")
      ->capture_default_str()
      ->check(dialect_choices());
  cmd->add_option("--calib", o->calib, "file of calibration token ids");
  cmd->add_option("--calib-synthetic", o->calib_synthetic,
                  "pseudo-random calibration tokens when --calib is not given")
      ->capture_default_str()
      ->check(CLI::Range(int64_t{1}, int64_t{1} << 24));
  cmd->add_option("--seed", o->seed, "seed of the synthetic calibration tokens")
      ->capture_default_str()
      ->check(seed_check());
  cmd->add_option("--ignore", o->ignore,
                  "leave a linear in the model dtype: a module name "
                  "(model.layers.0.mlp.down_proj) or re:<regex> (matched from the start, as "
                  "compressed-tensors' ignore); repeatable")
      ->allow_extra_args(false);
  cmd->add_flag("--ignore-unsupported", o->ignore_unsupported,
                "ignore every linear whose shape the scheme cannot take (each is printed)");
  cmd->add_flag("--force", o->force, "replace existing output files");
  cmd->callback([o, &rc] {
    run(*o);
    rc = 0;
  });
}

}  // namespace qparity::cli
