// Layer streaming (reference::LayerStreaming): a model loaded one decoder layer at a time gives
// the golden of the whole model bit for bit, and both equal one forward() per sequence (the
// golden run goes layer by layer over all sequences); loader errors still name the tensor,
// unexpected tensors before any compute; a streaming model refuses to continue a cached
// sequence; once loaded, the heap holds the pieces outside the layers only.
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <malloc.h>

#include <bit>
#include <cmath>
#include <filesystem>
#include <sstream>

#include "../unit/error_of.h"
#include "../unit/test_seed.h"
#include "core/capture/capture_points.h"
#include "core/memory_budget.h"
#include "core/safetensors/safetensors_file.h"
#include "core/safetensors/safetensors_writer.h"
#include "fixtures/checkpoint_quantizer.h"
#include "fixtures/fixture_model.h"
#include "golden/reference_run.h"
#include "reference_cpu/models/calibration.h"
#include "reference_cpu/models/model_loader.h"
#include "schemes/description/module_names.h"

namespace qparity::reference {
namespace {

namespace fs = std::filesystem;
using test::error_of;
using ::testing::HasSubstr;
using ::testing::Not;

class LayerStreaming : public testing::Test {
 protected:
  static void SetUpTestSuite() {
    seed_ = test::test_seed();
    root_ = fs::temp_directory_path() / ("qparity_streaming_" + std::to_string(seed_));
    fs::create_directories(root_);
    for (const char* a : {"llama", "qwen3", "qwen3-moe"}) {
      fixtures::FixtureSpec spec;
      spec.arch = fixtures::parse_fixture_arch(a);
      spec.seed = seed_;
      fixtures::write_fp_checkpoint(spec, root_ / a, OverwritePolicy::kRefuse);
    }
  }
  static void TearDownTestSuite() { fs::remove_all(root_); }

  static fs::path dir_of(const std::string& arch, const std::string& scheme) {
    if (scheme == "bf16") return root_ / arch;
    const fs::path out = root_ / (arch + "." + scheme);
    if (fs::exists(out)) return out;
    const ModelConfig cfg = load_model_config(root_ / arch / "config.json");
    fixtures::quantize_checkpoint(
        root_ / arch, parse_scheme_id(scheme), Dialect::kIdeal, out,
        fixtures::calibrate_checkpoint(root_ / arch, synthetic_tokens(32, cfg.vocab, seed_)),
        OverwritePolicy::kRefuse, nullptr);
    return out;
  }

  static inline uint64_t seed_ = 0;
  static inline fs::path root_;
};

golden::Golden golden_of(const fs::path& dir, const golden::TokenInputs& in,
                         reference::LayerStreaming streaming) {
  golden::ReferenceRunOptions o;
  o.streaming = streaming;
  return golden::run_reference(dir, in, o, nullptr);
}

TEST_F(LayerStreaming, GivesTheWholeModelsGoldenAndOneForwardPerSequenceBitForBit) {
  struct Case {
    const char* arch;
    const char* scheme;
  };
  for (const Case c :
       {Case{"llama", "bf16"}, Case{"llama", "w8a8-static"}, Case{"llama", "kv-int8"},
        Case{"qwen3", "fp8-block"}, Case{"qwen3-moe", "bf16"}, Case{"qwen3-moe", "w4a16-g32"}}) {
    const fs::path dir = dir_of(c.arch, c.scheme);
    const ModelConfig cfg = load_model_config(dir / "config.json");
    const golden::TokenInputs in = golden::synthetic_inputs(3, 7, cfg.vocab, seed_);
    const golden::Golden whole = golden_of(dir, in, reference::LayerStreaming::kNever);
    const golden::Golden streamed = golden_of(dir, in, reference::LayerStreaming::kAlways);
    const std::string what = std::string(c.arch) + "/" + c.scheme + " " + test::seed_note(seed_);
    ASSERT_EQ(whole.points.size(), streamed.points.size()) << what;
    for (size_t i = 0; i < whole.points.size(); ++i) {
      EXPECT_EQ(whole.points[i].name, streamed.points[i].name) << what;
      EXPECT_EQ(whole.points[i].values.data, streamed.points[i].values.data)
          << what << " " << whole.points[i].name;
    }
    EXPECT_EQ(whole.logits.data, streamed.logits.data) << what;
    // The catalog's widths (what --capture auto sizes a golden by) are what the run records.
    for (const auto& p : whole.points) {
      const int64_t w = capture_point_width(cfg, p.name);
      if (!p.name.ends_with(".x_scales")) {
        EXPECT_EQ(w, p.values.cols) << what << " " << p.name;
      }
    }
    ASSERT_EQ(whole.activation_stats.size(), streamed.activation_stats.size()) << what;
    for (size_t i = 0; i < whole.activation_stats.size(); ++i) {
      EXPECT_EQ(whole.activation_stats[i].name, streamed.activation_stats[i].name);
      EXPECT_EQ(whole.activation_stats[i].codes, streamed.activation_stats[i].codes);
      EXPECT_EQ(whole.activation_stats[i].saturated, streamed.activation_stats[i].saturated);
    }
    // The documented semantics, written the plain way: one forward() per sequence from an empty
    // cache, sequence after sequence.
    auto model = load_model(dir);
    for (int64_t s = 0; s < in.sequences; ++s) {
      model->reset_cache();
      Trace trace;
      ForwardHooks hooks;
      hooks.trace = &trace;
      const Matrix logits = model->forward(
          std::span<const int64_t>(in.tokens.data() + s * in.seq_len, in.seq_len), hooks);
      EXPECT_TRUE(std::equal(logits.data.begin(), logits.data.end(),
                             streamed.logits.data.begin() + s * in.seq_len * cfg.vocab))
          << what << " sequence " << s;
      // The golden adds the activation codes (x_values / x_scales) the plain forward has no hook
      // for; every other point is in both, in the same order.
      size_t found = 0;
      for (const auto& gp : streamed.points) {
        const Matrix* m = trace.find(gp.name);
        if (!m) {
          EXPECT_TRUE(gp.name.ends_with(".x_values") || gp.name.ends_with(".x_scales"))
              << what << " " << gp.name;
          continue;
        }
        EXPECT_EQ(trace.points()[found++].first, gp.name) << what;
        EXPECT_TRUE(std::equal(m->data.begin(), m->data.end(),
                               gp.values.data.begin() + s * static_cast<int64_t>(m->data.size())))
            << what << " " << gp.name << " sequence " << s;
      }
      EXPECT_EQ(found, trace.points().size()) << what;
    }
  }
}

TEST_F(LayerStreaming, ForwardLoadsEachLayerAndRefusesToContinueACachedSequence) {
  const fs::path dir = dir_of("qwen3-moe", "fp8-block");
  LoadOptions lo;
  lo.streaming = reference::LayerStreaming::kAlways;
  auto streamed = load_model(dir, lo);
  auto whole = load_model(dir);
  ASSERT_TRUE(streamed->streams_layers());
  EXPECT_FALSE(whole->streams_layers());
  const std::vector<int64_t> t = {5, 17, 3, 99, 42};
  EXPECT_EQ(streamed->forward(t).data, whole->forward(t).data);
  for (const DecoderLayer& l : streamed->layers())
    EXPECT_FALSE(l.attn.qkv) << "layer " << l.index << " still holds its weights after forward";
  EXPECT_THAT(error_of([&] { streamed->forward(t); }), HasSubstr("cannot continue a cached"));
  streamed->reset_cache();
  EXPECT_EQ(streamed->forward(t).data, (whole->reset_cache(), whole->forward(t)).data);
  // A caller may keep one layer loaded across calls.
  streamed->acquire_layer(1);
  EXPECT_TRUE(streamed->layers()[1].attn.qkv);
  streamed->release_layer(1);
  EXPECT_FALSE(streamed->layers()[1].attn.qkv);
}

TEST_F(LayerStreaming, AutoStreamsOnlyPastTheBudget) {
  const fs::path dir = dir_of("llama", "bf16");
  const uint64_t bytes = checkpoint_bytes(Checkpoint::open(dir));
  LoadOptions lo;
  lo.streaming = reference::LayerStreaming::kAuto;
  lo.memory_budget = bytes;  // fits exactly
  EXPECT_FALSE(streams_under(lo, bytes));
  EXPECT_FALSE(load_model(dir, lo)->streams_layers());
  lo.memory_budget = bytes - 1;
  EXPECT_TRUE(streams_under(lo, bytes));
  EXPECT_TRUE(load_model(dir, lo)->streams_layers());
  lo.streaming = reference::LayerStreaming::kNever;
  EXPECT_FALSE(streams_under(lo, bytes));
}

TEST_F(LayerStreaming, CapturedPointsPastTheBudgetFailAfterTheFirstLayerNamingTheSize) {
  const fs::path dir = dir_of("llama", "bf16");
  const ModelConfig cfg = load_model_config(dir / "config.json");
  golden::ReferenceRunOptions o;
  o.memory_budget = 64 << 10;  // 64 KiB: the weights stream, the points cannot fit
  std::ostringstream progress;
  const std::string e = error_of([&] {
    golden::run_reference(dir, golden::synthetic_inputs(2, 16, cfg.vocab, seed_), o, &progress);
  });
  EXPECT_THAT(e, HasSubstr("more than the budget of 64.0 KiB"));
  EXPECT_THAT(e, HasSubstr("--capture"));
  EXPECT_THAT(progress.str(), HasSubstr("streaming the model one decoder layer at a time"));
  EXPECT_THAT(progress.str(), Not(HasSubstr("layer 2/")));  // failed after layer 1 of 2
}

// Today's calibration written the plain way: the chunks one after the other through forward()
// over the KV cache, each linear's input min / max (first value seen first) and per-channel
// max |x|, each attention's per-channel K/V min / max.
CalibrationStats chunk_by_chunk_calibration(CausalLm& m, std::span<const int64_t> tokens,
                                            size_t chunk) {
  CalibrationStats out;
  ForwardHooks h;
  h.on_linear_input = [&](const std::string& prefix, const Matrix& x) {
    auto [it, first] = out.linear_inputs.try_emplace(prefix);
    ActivationStats& s = it->second;
    if (first) {
      s.min = s.max = x.data.empty() ? 0.0 : x.data[0];
      s.channel_absmax.assign(static_cast<size_t>(x.cols), 0.0);
    }
    for (int64_t r = 0; r < x.rows; ++r)
      for (int64_t c = 0; c < x.cols; ++c) {
        s.min = std::min(s.min, x(r, c));
        s.max = std::max(s.max, x(r, c));
        double& a = s.channel_absmax[static_cast<size_t>(c)];
        a = std::max(a, std::fabs(x(r, c)));
      }
  };
  auto channels = [](std::vector<double>& lo, std::vector<double>& hi, const Matrix& x) {
    if (lo.empty()) {
      lo.assign(static_cast<size_t>(x.cols), INFINITY);
      hi.assign(static_cast<size_t>(x.cols), -INFINITY);
    }
    for (int64_t r = 0; r < x.rows; ++r)
      for (int64_t c = 0; c < x.cols; ++c) {
        lo[static_cast<size_t>(c)] = std::min(lo[static_cast<size_t>(c)], x(r, c));
        hi[static_cast<size_t>(c)] = std::max(hi[static_cast<size_t>(c)], x(r, c));
      }
  };
  h.on_kv = [&](const std::string& prefix, const Matrix& k, const Matrix& v) {
    KvChannelStats& s = out.kv[prefix];
    channels(s.k_min, s.k_max, k);
    channels(s.v_min, s.v_max, v);
  };
  m.reset_cache();
  for (size_t i = 0; i < tokens.size(); i += chunk)
    m.forward(tokens.subspan(i, std::min(chunk, tokens.size() - i)), h);
  m.reset_cache();
  out.tokens = static_cast<int64_t>(tokens.size());
  return out;
}

// The bits of doubles (so that -0.0 and 0.0 differ).
std::vector<uint64_t> bits_of(const std::vector<double>& v) {
  std::vector<uint64_t> out;
  for (double d : v)
    out.push_back(std::bit_cast<uint64_t>(d));
  return out;
}
uint64_t bits_of(double d) {
  return std::bit_cast<uint64_t>(d);
}

void expect_same_stats(const CalibrationStats& want, const CalibrationStats& got,
                       const std::string& what) {
  EXPECT_EQ(want.tokens, got.tokens) << what;
  ASSERT_EQ(want.linear_inputs.size(), got.linear_inputs.size()) << what;
  for (const auto& [prefix, w] : want.linear_inputs) {
    ASSERT_TRUE(got.linear_inputs.count(prefix)) << what << " " << prefix;
    const ActivationStats& g = got.linear_inputs.at(prefix);
    EXPECT_EQ(bits_of(w.min), bits_of(g.min)) << what << " " << prefix;
    EXPECT_EQ(bits_of(w.max), bits_of(g.max)) << what << " " << prefix;
    EXPECT_EQ(bits_of(w.channel_absmax), bits_of(g.channel_absmax)) << what << " " << prefix;
  }
  ASSERT_EQ(want.kv.size(), got.kv.size()) << what;
  for (const auto& [prefix, w] : want.kv) {
    ASSERT_TRUE(got.kv.count(prefix)) << what << " " << prefix;
    const KvChannelStats& g = got.kv.at(prefix);
    EXPECT_EQ(bits_of(w.k_min), bits_of(g.k_min)) << what << " " << prefix;
    EXPECT_EQ(bits_of(w.k_max), bits_of(g.k_max)) << what << " " << prefix;
    EXPECT_EQ(bits_of(w.v_min), bits_of(g.v_min)) << what << " " << prefix;
    EXPECT_EQ(bits_of(w.v_max), bits_of(g.v_max)) << what << " " << prefix;
  }
}

// Calibration runs layer-major (every chunk through a layer, then the next), whole or streamed:
// the statistics are those of the chunks one after the other through forward(), bit for bit,
// on every architecture (MoE experts see only their routed rows) with 3 chunks over the KV cache
// (the last one short); a streamed model holds no layer afterwards; and calibrate_checkpoint
// gives the same statistics streamed (forced, or past a small budget) as whole.
TEST_F(LayerStreaming, CalibrationStreamedEqualsWholeAndChunkByChunkBitForBit) {
  for (const char* arch : {"llama", "qwen3", "qwen3-moe"}) {
    const fs::path dir = dir_of(arch, "bf16");
    const ModelConfig cfg = load_model_config(dir / "config.json");
    const std::vector<int64_t> tokens = synthetic_tokens(45, cfg.vocab, seed_ + 3);
    const std::string what = std::string(arch) + " " + test::seed_note(seed_);
    auto whole = load_model(dir);
    const CalibrationStats want = chunk_by_chunk_calibration(*whole, tokens, 16);
    ASSERT_FALSE(want.linear_inputs.empty());
    ASSERT_FALSE(want.kv.empty());
    expect_same_stats(want, calibrate(*whole, tokens, 16), what + " whole");
    LoadOptions lo;
    lo.streaming = reference::LayerStreaming::kAlways;
    auto streamed = load_model(dir, lo);
    std::ostringstream progress;
    expect_same_stats(want, calibrate(*streamed, tokens, 16, &progress), what + " streamed");
    EXPECT_THAT(progress.str(), HasSubstr("calibration: layer 2/2 (45 tokens, streamed)"));
    for (const DecoderLayer& l : streamed->layers())
      EXPECT_FALSE(l.attn.qkv) << what << " layer " << l.index << " still loaded";
    // The model is left as it was found: an empty cache, whole forward() still works.
    EXPECT_EQ(whole->cached_tokens(), 0);
    EXPECT_EQ(streamed->forward(std::span<const int64_t>(tokens).first(5)).data,
              whole->forward(std::span<const int64_t>(tokens).first(5)).data)
        << what;

    // Through the quantizer's entry point (its default chunk, 64: 2 chunks of 100 tokens).
    const std::vector<int64_t> more = synthetic_tokens(100, cfg.vocab, seed_ + 4);
    fixtures::CalibrationOptions co;
    co.streaming = reference::LayerStreaming::kNever;
    const fixtures::StatsProviders w = fixtures::calibrate_checkpoint(dir, more, co);
    co.streaming = reference::LayerStreaming::kAuto;
    co.memory_budget = 64 << 10;  // 64 KiB: streams
    std::ostringstream said;
    co.progress = &said;
    const fixtures::StatsProviders s = fixtures::calibrate_checkpoint(dir, more, co);
    EXPECT_THAT(said.str(), HasSubstr("calibration: streaming the model"));
    const ModuleNames mods(cfg);
    for (const LinearModule& l : mods.linears()) {
      const auto a = w.linear(l.prefix), b = s.linear(l.prefix);
      ASSERT_EQ(a.has_value(), b.has_value()) << what << " " << l.prefix;
      if (!a) continue;
      EXPECT_EQ(bits_of(a->min), bits_of(b->min)) << what << " " << l.prefix;
      EXPECT_EQ(bits_of(a->max), bits_of(b->max)) << what << " " << l.prefix;
      EXPECT_EQ(bits_of(a->channel_absmax), bits_of(b->channel_absmax)) << what << " " << l.prefix;
    }
    for (const AttentionModule& at : mods.attentions()) {
      const auto a = w.kv(at.prefix), b = s.kv(at.prefix);
      ASSERT_TRUE(a && b) << what << " " << at.prefix;
      EXPECT_EQ(bits_of(a->k_min), bits_of(b->k_min)) << what << " " << at.prefix;
      EXPECT_EQ(bits_of(a->v_max), bits_of(b->v_max)) << what << " " << at.prefix;
    }
  }
}

std::vector<TensorToWrite> tensors_of(const SafetensorsFile& f) {
  std::vector<TensorToWrite> out;
  for (const auto& t : f.tensors()) {
    const auto b = f.bytes(t);
    out.push_back({t.name, t.dtype, t.shape, {b.begin(), b.end()}});
  }
  return out;
}

TEST_F(LayerStreaming, LoaderErrorsNameTheTensorUnexpectedOnesBeforeAnyCompute) {
  const fs::path src = dir_of("qwen3", "bf16");
  const auto file = SafetensorsFile::open(src / "model.safetensors");
  auto write = [&](const std::string& tag, std::vector<TensorToWrite> ts) {
    const fs::path dir = root_ / ("qwen3.stream-bad." + tag);
    fs::create_directories(dir);
    fs::copy_file(src / "config.json", dir / "config.json", fs::copy_options::overwrite_existing);
    write_safetensors(dir / "model.safetensors", std::move(ts), std::nullopt,
                      OverwritePolicy::kReplace);
    return dir;
  };
  LoadOptions lo;
  lo.streaming = reference::LayerStreaming::kAlways;
  auto extra = tensors_of(file);
  TensorToWrite bogus = extra.front();
  bogus.name = "model.layers.1.mlp.extra_proj.weight";
  extra.push_back(bogus);
  EXPECT_THAT(error_of([&] { load_model(write("extra", extra), lo); }),
              HasSubstr("'model.layers.1.mlp.extra_proj.weight': is not used"));
  auto beyond = tensors_of(file);
  bogus.name = "model.layers.7.mlp.down_proj.weight";  // the fixture has 2 layers
  beyond.push_back(bogus);
  EXPECT_THAT(error_of([&] { load_model(write("beyond", beyond), lo); }),
              HasSubstr("'model.layers.7.mlp.down_proj.weight': is not used"));
  auto missing = tensors_of(file);
  std::erase_if(missing, [](const TensorToWrite& t) {
    return t.name == "model.layers.1.self_attn.k_proj.weight";
  });
  auto m = load_model(write("missing", missing), lo);  // found when layer 1 loads
  EXPECT_THAT(error_of([&] {
                m->forward(std::vector<int64_t>{1, 2});
              }),
              HasSubstr("model.layers.1.self_attn.k_proj.weight: missing"));
}

#if !defined(__SANITIZE_ADDRESS__)
size_t heap_in_use() {
  const struct mallinfo2 mi = mallinfo2();
  return mi.uordblks + mi.hblkhd;
}

TEST_F(LayerStreaming, LoadedStreamingModelHoldsNoLayerWeights) {
  const fs::path dir = dir_of("llama", "bf16");  // untied: lm_head is its own tensor
  const Checkpoint ckpt = Checkpoint::open(dir);
  uint64_t outside = 0, layers = 0;
  for (const auto& [name, ref] : ckpt.tensors())
    (name.rfind("model.layers.", 0) == 0 ? layers : outside) += ref.info->nbytes();
  LoadOptions lo;
  lo.streaming = reference::LayerStreaming::kAlways;
  const size_t before = heap_in_use();
  auto m = load_model(dir, lo);
  const size_t held = heap_in_use() - before;
  // lm_head and the norms (the embedding stays in the map): nowhere near the layers' bytes.
  EXPECT_LT(held, outside + (256u << 10)) << "layers hold " << layers << " bytes";
  EXPECT_LT(held, layers / 2);
}
#endif

}  // namespace
}  // namespace qparity::reference
