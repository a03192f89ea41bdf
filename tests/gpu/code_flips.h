#pragma once
// A layer-local FAIL that one inherited bf16 flip explains: the flip moves an activation code
// across a boundary, which moves that token's output channels past the channel gate (the gates
// do not model code steps, tools/policies/make_policies.py). Such a failure must come with
// counted code mismatches in the failing point's layer, and be rare; a wrong kernel, scale,
// block or reduction fails without them or everywhere.
#include <cstdint>

#include "core/capture/capture_points.h"
#include "golden/compare.h"

namespace qparity::test {

struct CodeFlips {
  int64_t layer = -1;            // the first failing point's layer
  int64_t layer_mismatches = 0;  // activation-code mismatches in that layer
  int64_t mismatches = 0;        // in all layers
  int64_t codes = 0;             // activation codes compared in all layers
};

inline CodeFlips code_flips(const golden::CompareReport& r) {
  CodeFlips f;
  if (r.first_failing < 0) return f;
  f.layer = point_layer(r.points[static_cast<size_t>(r.first_failing)].name);
  for (const auto& p : r.points)
    if (is_activation_code_point(p.name)) {
      f.codes += static_cast<int64_t>(p.stats.row_rel_l2.size()) * p.cols;
      f.mismatches += p.stats.mismatches;
      if (point_layer(p.name) == f.layer) f.layer_mismatches += p.stats.mismatches;
    }
  return f;
}

}  // namespace qparity::test
