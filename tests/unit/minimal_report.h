#pragma once
// A report JSON with every field the report writer and the index read, for tests of the report
// root (test_golden_report, test_golden_junit): an engine row that PASSes with zero error.
#include <string>

#include "core/json_util.h"

namespace qparity::test {

inline Json minimal_report(const std::string& device, const std::string& model,
                           const std::string& scheme) {
  Json s = {{"device", device},
            {"device_name", device},
            {"model", model},
            {"scheme", scheme},
            {"baseline_scheme", "bf16"},
            {"role", "engine"},
            {"verdict", "PASS"},
            {"pass", true},
            {"positions", 4},
            {"kld_mean", 0.0},
            {"kld_mean_hi", 0.0},
            {"kld_p99", 0.0},
            {"kld_max", 0.0},
            {"top1", 1.0},
            {"top1_lo", 0.5},
            {"dp_rms", 0.0},
            {"dln_ppl", 0.0},
            {"dln_ppl_lo", 0.0},
            {"dln_ppl_hi", 0.0},
            {"ppl_ratio", 1.0},
            {"first_greedy_divergence", -1},
            {"logits_rel_l2", 0.0},
            {"worst_point", "embed"},
            {"worst_point_rel_l2", 0.0},
            {"router_flip_rate", nullptr},
            {"policy", "engine.default"}};
  Json c = {{"points", Json::array()},
            {"router", Json::array()},
            {"activation_stats", Json::array()},
            {"kv_error_by_position", Json::array()},
            {"end_to_end", {{"kld", Json::array()}}},
            {"golden", {{"file", "g.h5"}}},
            {"candidate", {{"file", "c.h5"}}}};
  return {{"summary", s}, {"compare", c}};
}

}  // namespace qparity::test
