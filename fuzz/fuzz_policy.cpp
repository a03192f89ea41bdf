// libFuzzer: policy JSON text (tests/accuracy/policies/*.json) -> Policy, then every parsed
// section judged. Only qparity::Error may escape.
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <limits>
#include <string>

#include "core/error.h"
#include "golden/metrics.h"
#include "golden/policy.h"

namespace {

using qparity::golden::EndToEnd;
using qparity::golden::PointStats;
using qparity::golden::Policy;
using qparity::golden::PolicyRole;
using qparity::golden::PolicySection;

void judge(const PolicySection& s) {
  // Default stats pass every gate; the second set fails them, so the failure messages are built.
  static const PointStats ok;
  static const PointStats bad = [] {
    PointStats st;
    st.max_abs = st.rel_l2 = st.max_col_rel_l2 = std::numeric_limits<double>::infinity();
    st.median_row_rel_l2 = st.deepgemm_diff = std::nan("");
    st.cosine = -1;
    st.nan_candidate = 3;
    st.first_nonfinite = 7;
    st.worst_col = 2;
    st.integer_codes = true;
    st.mismatches = std::numeric_limits<int64_t>::max();
    return st;
  }();
  for (const char* point : {"embed", "layers.0.attn.qkv", "layers.1.moe.topk_ids", "logits", ""}) {
    (void)qparity::golden::judge_point(s, point, ok);
    (void)qparity::golden::judge_point(s, point, bad);
  }
  static const EndToEnd bad_e2e = [] {
    EndToEnd e;
    e.scored = 1;
    e.kld_mean.hi = e.dln_ppl.hi = std::numeric_limits<double>::infinity();
    e.top1.lo = std::nan("");
    return e;
  }();
  (void)qparity::golden::judge_end_to_end(s, EndToEnd{});
  (void)qparity::golden::judge_end_to_end(s, bad_e2e);
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  // QPARITY_FUZZ_VERBOSE=1 prints why each input was rejected (to check that seeds parse).
  static const bool verbose = std::getenv("QPARITY_FUZZ_VERBOSE") != nullptr;
  try {
    const Policy p = qparity::golden::parse_policy(
        std::string(reinterpret_cast<const char*>(data), size), "policy.json");
    for (const auto& [key, section] : p.engine)
      judge(section);
    if (p.format) judge(*p.format);
    for (const char* device : {"cpu-reference", "NVIDIA H100 80GB HBM3 sm90", "unknown"})
      (void)qparity::golden::policy_section(p, PolicyRole::kEngine,
                                            qparity::golden::device_key(device));
    // Throws when there is no format section.
    (void)qparity::golden::policy_section(p, PolicyRole::kFormat, "default");
    if (verbose) std::fprintf(stderr, "  ok\n");
  } catch (const qparity::Error& e) {
    if (verbose) std::fprintf(stderr, "  %s\n", e.what());
  }
  return 0;
}
