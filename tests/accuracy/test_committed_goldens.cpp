// The committed goldens (golden/data/*.h5) reproduced by the current reference: the fixture
// generator and quantizer rebuild the same checkpoint bytes (its sha256 matches the golden's),
// and the reference reproduces every capture point and the logits within the cpu-reference
// policy (1e-12 relative) - so a change to the reference, the generator or the quantizer is
// caught. QPARITY_REGENERATE_GOLDENS=1 rewrites them instead (after a deliberate change).
#include <gtest/gtest.h>

#include <cstdio>
#include <cstdlib>
#include <filesystem>

#include "../unit/test_seed.h"
#include "accuracy_util.h"
#include "golden/compare.h"

namespace qparity::golden {
namespace {

namespace fs = std::filesystem;

struct Committed {
  const char* arch;
  const char* scheme;
};
const Committed kGoldens[] = {{"llama", "bf16"},
                              {"llama", "w8a8-static"},
                              {"qwen3", "fp8-block"},
                              {"qwen3-moe", "w4a16-g32"},
                              {"qwen3-moe", "nvfp4"}};
constexpr uint64_t kSeed = 11;

fs::path golden_path(const Committed& c) {
  return fs::path(QPARITY_SOURCE_DIR) / "golden/data" /
         ("tiny-" + std::string(c.arch) + "-" + c.scheme + ".h5");
}

TEST(CommittedGoldens, CurrentReferenceReproducesThem) {
  const fs::path root =
      fs::temp_directory_path() / ("qparity_committed_" + std::to_string(test::test_seed()));
  fs::create_directories(root);
  const bool regenerate = std::getenv("QPARITY_REGENERATE_GOLDENS") != nullptr;
  for (const Committed& c : kGoldens) {
    SCOPED_TRACE(golden_path(c).filename().string());
    const fs::path ckpt = test::tiny_checkpoint(root, c.arch, c.scheme, kSeed);
    const ModelConfig cfg = load_model_config(ckpt / "config.json");
    ReferenceRunOptions o;  // exact mode, all capture points, float64
    Golden now = run_reference(ckpt, synthetic_inputs(2, 8, cfg.vocab, 5), o, nullptr);
    now.meta.model = "tiny-" + std::string(c.arch) + "-seed" + std::to_string(kSeed);
    now.meta.producer_version = "committed";
    now.meta.created = "2026-11-21T00:00:00Z";
    if (regenerate) {
      fs::create_directories(golden_path(c).parent_path());
      write_golden(golden_path(c), now, OverwritePolicy::kReplace);
      continue;
    }
    ASSERT_TRUE(fs::exists(golden_path(c))) << "missing; QPARITY_REGENERATE_GOLDENS=1 writes it";
    const auto committed = GoldenReader::open(golden_path(c));
    EXPECT_EQ(now.meta.model_config_hash, committed.meta().model_config_hash)
        << "the fixture generator writes a different config.json";
    EXPECT_EQ(now.meta.checkpoint_hash, committed.meta().checkpoint_hash)
        << "the fixture generator or quantizer writes different tensors";
    EXPECT_EQ(now.meta.scheme, committed.meta().scheme);
    now.meta.device = "cpu-reference";
    const fs::path cand = root / "now.h5";
    write_golden(cand, now, OverwritePolicy::kReplace);
    const Policy policy =
        load_policy(fs::path(QPARITY_SOURCE_DIR) / "policies" / (std::string(c.scheme) + ".json"));
    CompareOptions co;
    co.policy = &policy;  // its cpu-reference section: the candidate's device
    const CompareReport r = compare_goldens(committed, GoldenReader::open(cand), co);
    EXPECT_EQ(r.policy_section, "engine.cpu-reference");
    EXPECT_TRUE(r.missing_in_candidate.empty());
    EXPECT_TRUE(r.pass) << to_text(r);
    double worst = 0;
    for (const auto& p : r.points)
      worst = std::max(worst, p.stats.rel_l2);
    char worst_text[32];
    std::snprintf(worst_text, sizeof worst_text, "%.3e", worst);
    RecordProperty(golden_path(c).filename().string() + ".worst_rel_l2", worst_text);
  }
  fs::remove_all(root);
}

}  // namespace
}  // namespace qparity::golden
