// Sharded goldens (golden/shard.h): shard I of N holds sequences I, I+N, ...; merge_shards puts
// any order of all N back into the whole run, value for value and, written with the same
// `created`, byte for byte; every way shards can fail to be one run is refused by name.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <random>

#include "error_of.h"
#include "golden/shard.h"
#include "scratch_dir.h"
#include "test_seed.h"

namespace qparity::golden {
namespace {

namespace fs = std::filesystem;
using test::error_of;
using ::testing::HasSubstr;

constexpr int64_t kS = 5, kT = 3, kVocab = 7;

Golden whole_run() {
  std::mt19937_64 rng(test::test_seed());
  std::uniform_real_distribution<double> u(-4.0, 4.0);
  Golden g;
  g.meta.model = "m";
  g.meta.architecture = "LlamaForCausalLM";
  g.meta.model_config_hash = std::string(64, 'a');
  g.meta.checkpoint_hash = std::string(64, 'b');
  g.meta.scheme = "w8a8-int8-dyn";
  g.meta.dialect = "vllm";
  g.meta.precision_mode = "emulate";
  g.meta.input_set = "synthetic:5x3:seed=1";
  g.meta.device = "cpu-reference";
  g.meta.created = "2026-12-03T10:00:00Z";
  g.sequences = kS;
  g.seq_len = kT;
  for (int64_t r = 0; r < kS * kT; ++r) {
    g.tokens.push_back(static_cast<int64_t>(rng() % kVocab));
    g.targets.push_back(r % kT == kT - 1 ? -1 : static_cast<int64_t>(rng() % kVocab));
    g.target_logprobs.push_back(r % kT == kT - 1 ? std::nan("") : -std::abs(u(rng)));
  }
  for (const char* n : {"embed", "layers.0.attn.qkv", "layers.0.residual"}) {
    Array2D a{kS * kT, 4, {}};
    for (int64_t i = 0; i < a.rows * a.cols; ++i)
      a.data.push_back(u(rng));
    g.points.push_back({n, a});
  }
  g.logits = Array2D{kS * kT, kVocab, {}};
  for (int64_t i = 0; i < kS * kT * kVocab; ++i)
    g.logits.data.push_back(u(rng));
  for (int64_t s = 0; s < kS; ++s) {
    g.sequence_nll.push_back(std::abs(u(rng)));
    g.sequence_ppl.push_back(std::exp(g.sequence_nll.back()));
  }
  g.activation_stats = {{"layers.0.attn.qkv_proj", 0, 0, 0, 0},
                        {"layers.0.attn.o_proj", 0, 0, 0, 0}};
  return g;
}

// Shard k of n of `g`, as golden make --shard k/n writes it (its sequences, its counts).
Golden shard_of(const Golden& g, int64_t k, int64_t n) {
  Golden s = g;
  s.meta.shard_index = k;
  s.meta.shard_count = n;
  s.meta.shard_total = g.sequences;
  const std::vector<int64_t> seqs = shard_sequences({k, n}, g.sequences);
  s.sequences = static_cast<int64_t>(seqs.size());
  s.tokens.clear();
  s.targets.clear();
  s.target_logprobs.clear();
  s.sequence_nll.clear();
  s.sequence_ppl.clear();
  const auto rows_of = [&](const Array2D& a) {
    Array2D out{s.sequences * kT, a.cols, {}};
    for (int64_t q : seqs)
      out.data.insert(out.data.end(), a.data.begin() + q * kT * a.cols,
                      a.data.begin() + (q + 1) * kT * a.cols);
    return out;
  };
  for (int64_t q : seqs) {
    for (int64_t t = 0; t < kT; ++t) {
      s.tokens.push_back(g.tokens[static_cast<size_t>(q * kT + t)]);
      s.targets.push_back(g.targets[static_cast<size_t>(q * kT + t)]);
      s.target_logprobs.push_back(g.target_logprobs[static_cast<size_t>(q * kT + t)]);
    }
    s.sequence_nll.push_back(g.sequence_nll[static_cast<size_t>(q)]);
    s.sequence_ppl.push_back(g.sequence_ppl[static_cast<size_t>(q)]);
  }
  for (auto& p : s.points)
    p.values = rows_of(p.values);
  s.logits = rows_of(g.logits);
  // Each shard counts its own codes; the whole run's are the sums.
  s.activation_stats = {{"layers.0.attn.qkv_proj", 100 * (k + 1), k, 10, 1},
                        {"layers.0.attn.o_proj", 50, 2 * k, 5, 0}};
  return s;
}

std::vector<std::string> names(size_t n) {
  std::vector<std::string> out;
  for (size_t i = 0; i < n; ++i)
    out.push_back("shard" + std::to_string(i) + ".h5");
  return out;
}

std::string bytes_of(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

TEST(GoldenShard, ShardsInAnyOrderMergeIntoTheWholeRunByteForByte) {
  Golden whole = whole_run();
  for (int64_t n : {1, 2, 3, 5}) {
    SCOPED_TRACE("N = " + std::to_string(n));
    std::vector<Golden> shards;
    for (int64_t k = n - 1; k >= 0; --k)  // reverse order: the merge places them by index
      shards.push_back(shard_of(whole, k, n));
    whole.activation_stats = {{"layers.0.attn.qkv_proj", 0, 0, 0, 0},
                              {"layers.0.attn.o_proj", 0, 0, 0, 0}};
    for (int64_t k = 0; k < n; ++k)
      for (size_t a = 0; a < 2; ++a) {
        const ActivationCodeStats st = shard_of(whole, k, n).activation_stats[a];
        whole.activation_stats[a].codes += st.codes;
        whole.activation_stats[a].saturated += st.saturated;
        whole.activation_stats[a].scales += st.scales;
        whole.activation_stats[a].zero_scales += st.zero_scales;
      }
    shards.back().meta.created = "2026-12-03T09:59:59Z";  // the earliest is kept
    Golden merged = merge_shards(shards, names(shards.size()));
    EXPECT_EQ(merged.meta.created, "2026-12-03T09:59:59Z");
    merged.meta.created = whole.meta.created;
    const fs::path dir = test::scratch_dir("qparity_golden_shard");
    write_golden(dir / "whole.h5", whole, OverwritePolicy::kReplace);
    write_golden(dir / "merged.h5", merged, OverwritePolicy::kReplace);
    EXPECT_EQ(bytes_of(dir / "whole.h5"), bytes_of(dir / "merged.h5"));
    // A shard round-trips its attributes.
    write_golden(dir / "shard.h5", shards[0], OverwritePolicy::kReplace);
    const auto r = GoldenReader::open(dir / "shard.h5");
    EXPECT_EQ(r.meta().shard_index, n - 1);
    EXPECT_EQ(r.meta().shard_count, n);
    EXPECT_EQ(r.meta().shard_total, kS);
  }
}

TEST(GoldenShard, WhatIsNotOneRunIsRefusedByName) {
  const Golden whole = whole_run();
  const auto three = [&] {
    return std::vector<Golden>{shard_of(whole, 0, 3), shard_of(whole, 1, 3), shard_of(whole, 2, 3)};
  };
  EXPECT_THAT(error_of([&] {
                auto s = three();
                s.pop_back();
                merge_shards(s, names(2));
              }),
              HasSubstr("shard 2/3 is missing"));
  EXPECT_THAT(error_of([&] {
                auto s = three();
                s[2] = s[0];
                merge_shards(s, names(3));
              }),
              HasSubstr("shard2.h5: repeats shard 0/3 of 5 sequences (shard0.h5 is it too)"));
  EXPECT_THAT(error_of([&] {
                auto s = three();
                s[1] = shard_of(whole, 1, 2);
                merge_shards(s, names(3));
              }),
              HasSubstr("not shards of one run"));
  for (const auto& [what, edit] : std::vector<std::pair<std::string, std::function<void(Golden&)>>>{
           {"checkpoint_hash", [](Golden& g) { g.meta.checkpoint_hash = std::string(64, 'c'); }},
           {"scheme", [](Golden& g) { g.meta.scheme = "fp8-block"; }},
           {"precision_mode", [](Golden& g) { g.meta.precision_mode = "exact"; }},
           {"seed", [](Golden& g) { g.meta.seed = 2; }},
           {"capture points", [](Golden& g) { g.points.pop_back(); }},
           {"quant_stats", [](Golden& g) { g.activation_stats.pop_back(); }}}) {
    SCOPED_TRACE(what);
    auto s = three();
    edit(s[1]);
    EXPECT_THAT(error_of([&] { merge_shards(s, names(3)); }),
                HasSubstr("differs from shard0.h5's"));
  }
  EXPECT_THAT(error_of([&] { merge_shards({whole}, names(1)); }), HasSubstr("is not a shard"));
  EXPECT_THAT(error_of([&] { merge_shards({}, {}); }), HasSubstr("give the shards"));
  for (const char* bad : {"3/3", "-1/2", "1", "a/b", "0/0", "1/2/3", ""})
    EXPECT_THAT(error_of([&] { parse_shard(bad, "--shard"); }), HasSubstr("0 <= I < N")) << bad;
  EXPECT_EQ(shard_sequences({1, 3}, 8), (std::vector<int64_t>{1, 4, 7}));
  // The writer refuses a shard whose sequence count cannot be its share of the run.
  Golden bad = shard_of(whole, 0, 2);
  bad.meta.shard_total = 7;
  EXPECT_THAT(error_of([&] {
                write_golden(test::scratch_dir("qparity_golden_shard") / "bad.h5", bad,
                             OverwritePolicy::kReplace);
              }),
              HasSubstr("cannot hold 3"));
}

}  // namespace
}  // namespace qparity::golden
