#pragma once
// Shared by the accuracy tests: fixture checkpoints quantized the way `qparity make-fixture`
// quantizes them, and reference goldens of them.
#include <filesystem>
#include <string>

#include "core/config/model_config.h"
#include "fixtures/checkpoint_quantizer.h"
#include "fixtures/fixture_model.h"
#include "golden/reference_run.h"
#include "reference_cpu/models/calibration.h"

namespace qparity::test {

namespace fs = std::filesystem;

// The tiny fixture of `arch` (seed), quantized into `scheme` with statistics from 32 synthetic
// calibration tokens (seed); "bf16" is the unquantized checkpoint itself.
inline fs::path tiny_checkpoint(const fs::path& root, const std::string& arch,
                                const std::string& scheme, uint64_t seed) {
  const fs::path fp = root / (arch + ".fp");
  if (!fs::exists(fp)) {
    fixtures::FixtureSpec spec;
    spec.arch = fixtures::parse_fixture_arch(arch);
    spec.seed = seed;
    fixtures::write_fp_checkpoint(spec, fp, OverwritePolicy::kRefuse);
  }
  if (scheme == "bf16") return fp;
  const fs::path out = root / (arch + "." + scheme);
  if (fs::exists(out)) return out;
  const ModelConfig cfg = load_model_config(fp / "config.json");
  fixtures::quantize_checkpoint(
      fp, parse_scheme_id(scheme), Dialect::kIdeal, out,
      fixtures::calibrate_checkpoint(fp, reference::synthetic_tokens(32, cfg.vocab, seed)),
      OverwritePolicy::kRefuse, nullptr);
  return out;
}

}  // namespace qparity::test
