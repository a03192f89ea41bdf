#pragma once
// Local or inherited? Re-runs the decoder layer of a failing capture point on the golden's own
// inputs to that layer (the golden's `layers.<i-1>.residual`, or `embed` for layer 0), in a
// candidate engine that can run one layer (the reference can), and judges the re-run point: still
// failing means the layer itself is wrong; passing means its inputs carried the error in.
#include <string>

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

}  // namespace qparity::golden
