#pragma once
// The reference as a candidate engine (what golden/judge_matrix.h judges): a loaded model, with
// or without a deviation (reference_cpu/models/deviation.h), dumped the two ways an engine is:
//   free run    every sequence from its tokens through the whole model, each from an empty cache;
//   layer-local every layer on the golden's own input to it (embed, layers.<i-1>.residual), the
//               head on the golden's last residual, as gpu::engine_golden_local runs the engine.
// Unlike run_reference (a golden producer), non-finite values are kept: they are what a faulty
// candidate is judged on. meta: the model's dialect, mode and run dtype, the device below (an
// engine on the CPU: judged by a policy's engine "default" section, not by its "cpu-reference"
// section, which holds the reference to its own bits), producer "qparity-reference" or
// "qparity-reference+<deviation>" (never mistaken for a golden).
#include "golden/golden_file.h"
#include "golden/reference_run.h"
#include "reference_cpu/models/causal_lm.h"

namespace qparity::golden {

inline constexpr const char* kReferenceCandidateDevice = "cpu (the qparity reference as an engine)";

Golden reference_candidate_free(reference::CausalLm& model, const TokenInputs& inputs);
Golden reference_candidate_local(reference::CausalLm& model, const GoldenReader& golden);

}  // namespace qparity::golden
