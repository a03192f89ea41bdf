// `qparity quantize --in FP_CHECKPOINT --scheme ID --out DIR [--dialect D] [--calib TOKENS]`:
// post-training quantization of any bf16 / fp16 / fp32 Llama, Qwen3 or Qwen3-MoE checkpoint into
// a scheme, laid out as the scheme's producer lays it out (fixtures/checkpoint_quantizer.h:
// compressed-tensors config.json + safetensors, or msModelSlim quant_model_weights +
// quant_model_description.json). Static-activation schemes, smooth-quant and KV-cache schemes
// take their statistics from running the fp64 reference of the input checkpoint on calibration
// tokens: --calib (token ids: comma / space / newline separated), or --calib-synthetic N
// pseudo-random tokens (seeded) when none are given. Progress on stderr.
#include <fstream>
#include <iostream>
#include <sstream>

#include "core/config/model_config.h"
#include "core/error.h"
#include "core/quant/scheme_registry.h"
#include "fixtures/checkpoint_quantizer.h"
#include "golden/reference_run.h"
#include "reference_cpu/models/calibration.h"
#include "tools/qparity/commands.h"

namespace qparity::cli {

namespace {

struct QuantizeOptions {
  std::string in, out, scheme, dialect, calib;
  int64_t calib_synthetic = 128;
  uint64_t seed = 0;
  bool force = false;
};

void run(const QuantizeOptions& o) {
  const SchemeId scheme = parse_scheme_id(o.scheme);
  const std::vector<Producer>& producers = scheme_info(scheme.kind).producers;
  const reference::Dialect dialect =
      !o.dialect.empty() ? reference::parse_dialect(o.dialect)
      : (!producers.empty() && producers.front() == Producer::kMsModelSlim)
          ? reference::Dialect::kMsModelSlim
          : reference::Dialect::kCompressedTensors;
  const ModelConfig cfg = load_model_config(std::filesystem::path(o.in) / "config.json");
  const std::vector<int64_t> tokens =
      o.calib.empty() ? reference::synthetic_tokens(o.calib_synthetic, cfg.vocab, o.seed)
                      : golden::file_inputs(o.calib, 0).tokens;
  std::cerr << "quantize: calibrating on " << tokens.size() << (o.calib.empty() ? " synthetic" : "")
            << " tokens through the fp64 reference of " << o.in << "\n";
  const auto stats = fixtures::calibrate_checkpoint(o.in, tokens);
  std::cerr << "quantize: " << to_string(scheme) << " (dialect " << reference::to_string(dialect)
            << ") -> " << o.out << "\n";
  fixtures::quantize_checkpoint(o.in, scheme, dialect, o.out, stats,
                                o.force ? OverwritePolicy::kReplace : OverwritePolicy::kRefuse,
                                &std::cerr);
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
                  "producer arithmetic: compressed-tensors | msmodelslim | ideal | vllm | sglang "
                  "(default: the scheme's producer)");
  cmd->add_option("--calib", o->calib, "file of calibration token ids");
  cmd->add_option("--calib-synthetic", o->calib_synthetic,
                  "pseudo-random calibration tokens when --calib is not given")
      ->capture_default_str()
      ->check(CLI::Range(int64_t{1}, int64_t{1} << 24));
  cmd->add_option("--seed", o->seed, "seed of the synthetic calibration tokens")
      ->capture_default_str();
  cmd->add_flag("--force", o->force, "replace existing output files");
  cmd->callback([o, &rc] {
    run(*o);
    rc = 0;
  });
}

}  // namespace qparity::cli
