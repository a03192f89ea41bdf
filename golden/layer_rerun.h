#pragma once
// The reference as a layer runner for bisect (golden/bisect.h): re-runs the decoder layer of a
// capture point on the inputs a dump holds for it (its `layers.<i-1>.residual`, or `embed` for
// layer 0) and compares the re-run point with that dump's own value of the point. Fed the golden,
// it tells whether the layer is right on clean inputs; fed a candidate's dump, whether the
// reference's layer reproduces what the candidate computed from its own inputs.
#include <string>

#include "golden/bisect.h"
#include "golden/golden_file.h"
#include "golden/policy.h"
#include "reference_cpu/models/causal_lm.h"

namespace qparity::golden {

struct LayerRerun {
  bool available = false;
  std::string why_not;      // when not available
  std::string input_point;  // the golden point fed to the layer
  PointStats stats;         // re-run point against the golden point
  Verdict verdict;
  bool local = false;  // the layer's own error: it fails even on golden inputs
};

LayerRerun rerun_layer_point(reference::CausalLm& model, const GoldenReader& golden,
                             const std::string& point, const PolicySection* section);

// rerun_layer_point as a bisect Runner named `name` (the model must outlive it).
Runner reference_runner(reference::CausalLm& model, std::string name);

// Whether a point's slots follow its layer's router ids (expert_out, topk_weights): a re-run of
// it must also record "<layer>.moe.topk_ids" (slot_ids_point gives the name).
bool slots_follow_router(const std::string& point);
std::string slot_ids_point(const std::string& point);

// A re-run point (rows as the golden's) against the golden's, compared as compare_goldens does:
// per-slot MoE points aligned by expert id (`got_ids`: the re-run's router ids), router ids as
// sets. Any engine's layer re-run goes through here.
PointStats compare_rerun_point(const GoldenReader& golden, const std::string& point,
                               const std::vector<double>& got, const std::vector<double>& got_ids);

}  // namespace qparity::golden
