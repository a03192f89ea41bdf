#pragma once
// The engine as a golden producer: runs token sequences (each from an empty cache, as many per
// forward as fit in max_tokens and max_seqs), teacher-forced, and fills a schema-v1 Golden:
// logits (fp32 values as doubles), targets, log-probs, NLL / PPL, every capture point the glob
// wants, and the metadata (producer qparity-gpu-engine, device "<GPU name> sm_NN"). What
// `qparity engine run --dump` writes and the engine-vs-reference tests compare.
#include <iosfwd>
#include <string>

#include "golden/golden_file.h"
#include "golden/layer_rerun.h"
#include "golden/reference_run.h"
#include "gpu_engine/engine.h"

namespace qparity::gpu {

// "<device name> sm_NN" of device 0; throws naming why when there is none.
std::string device_name();

golden::Golden engine_golden(Engine& e, const golden::TokenInputs& in, const std::string& capture,
                             bool want_points, std::ostream* progress);

// A layer-local dump: the golden's tokens, and every layer run on the golden's own input to that
// layer (embed, layers.<i-1>.residual), the head (final_norm, logits) on its last residual. Each
// point then carries the engine's own error of that layer only, not what upstream layers passed
// on and the model amplified: what per-point tolerance gates judge (a free run is judged end to
// end). input_set is marked "layer-local:<golden input set>".
golden::Golden engine_golden_local(Engine& e, const golden::GoldenReader& reference,
                                   const std::string& capture, std::ostream* progress);

// Local or inherited, in the engine: re-runs `layer` on the golden's own input to it and compares
// every point of that layer the golden holds (golden::compare_rerun_point), in execution order.
struct LayerPointStats {
  std::string name;
  golden::PointStats stats;
};
std::vector<LayerPointStats> engine_rerun_layer(Engine& e, const golden::GoldenReader& reference,
                                                int64_t layer);

}  // namespace qparity::gpu
