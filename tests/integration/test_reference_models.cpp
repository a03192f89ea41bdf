// The fp64 reference models end to end on tiny fixture checkpoints: every architecture under
// every scheme loads and runs with finite capture points; prefill equals token-by-token decode
// over the KV cache; fused and split checkpoints give identical logits; formats rank as their
// resolution says; loader errors name the tensor; runs are bit-for-bit deterministic.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>

#include "../unit/error_of.h"
#include "../unit/quant_test_util.h"
#include "../unit/test_seed.h"
#include "core/json_util.h"
#include "core/safetensors/checkpoint.h"
#include "core/safetensors/safetensors_file.h"
#include "core/safetensors/safetensors_writer.h"
#include "fixtures/checkpoint_quantizer.h"
#include "fixtures/fixture_model.h"
#include "reference_cpu/models/model_loader.h"
#include "schemes/method/parallel.h"

namespace qparity::reference {
namespace {

namespace fs = std::filesystem;
using test::error_of;
using ::testing::HasSubstr;

const char* const kArchs[] = {"llama", "qwen3", "qwen3-moe"};

class ReferenceModels : public testing::Test {
 protected:
  static void SetUpTestSuite() {
    seed_ = test::test_seed();
    root_ = fs::temp_directory_path() / ("qparity_models_" + std::to_string(seed_));
    fs::create_directories(root_);
    for (const char* a : kArchs) {
      fixtures::FixtureSpec spec;
      spec.arch = fixtures::parse_fixture_arch(a);
      spec.seed = seed_;
      fixtures::write_fp_checkpoint(spec, root_ / a, OverwritePolicy::kRefuse);
    }
  }
  static void TearDownTestSuite() { fs::remove_all(root_); }

  static fs::path fp(const std::string& arch) { return root_ / arch; }

  // The fp fixture of `arch` quantized with `scheme` (cached per test suite).
  static fs::path quantized(const std::string& arch, const std::string& scheme) {
    const fs::path out = root_ / (arch + "." + scheme);
    if (fs::exists(out)) return out;
    const ModelConfig cfg = load_model_config(fp(arch) / "config.json");
    fixtures::quantize_checkpoint(
        fp(arch), parse_scheme_id(scheme), Dialect::kIdeal, out,
        fixtures::calibrate_checkpoint(fp(arch), reference::synthetic_tokens(32, cfg.vocab, seed_)),
        OverwritePolicy::kRefuse, nullptr);
    return out;
  }

  static std::vector<int64_t> tokens(int64_t n, int64_t vocab) {
    std::vector<int64_t> t;
    for (int64_t i = 0; i < n; ++i)
      t.push_back((i * 7919 + static_cast<int64_t>(seed_ % 97)) % vocab);
    return t;
  }

  static inline uint64_t seed_ = 0;
  static inline fs::path root_;
};

std::vector<std::string> schemes_for(const std::string& arch) {
  std::vector<std::string> s = {"bf16",        "w8a16-ch",      "w8a16-g64", "w8a8-static",
                                "w8a8s",       "w8a8-int8-dyn", "w4a16-g32", "fp8-tensor",
                                "fp8-channel", "fp8-block",     "nvfp4",     "mxfp4",
                                "mxfp8",       "kv-int8",       "kv-fp8",    "smoothquant"};
  if (arch == "qwen3-moe") s.push_back("mxint4");
  return s;
}

TEST_F(ReferenceModels, EveryArchitectureAndSchemeRunsWithFiniteCapturePoints) {
  for (const char* arch : kArchs) {
    for (const std::string& scheme : schemes_for(arch)) {
      const fs::path dir = scheme == "bf16" ? fp(arch) : quantized(arch, scheme);
      auto m = load_model(dir);
      const auto t = tokens(6, m->config().vocab);
      Trace trace;
      ForwardHooks hooks;
      hooks.trace = &trace;
      const Matrix logits = m->forward(t, hooks);
      ASSERT_EQ(logits.rows, 6);
      ASSERT_EQ(logits.cols, m->config().vocab);
      for (const auto& [name, x] : trace.points())
        for (double v : x.data)
          ASSERT_TRUE(std::isfinite(v)) << arch << "/" << scheme << " " << name;
      std::vector<std::string> expect = {"embed",
                                         "layers.0.input_norm",
                                         "layers.0.attn.qkv",
                                         "layers.0.attn.rope_q",
                                         "layers.0.attn.rope_k",
                                         "layers.0.attn.core",
                                         "layers.0.attn.out",
                                         "layers.0.post_attn_norm",
                                         "layers.0.residual",
                                         "final_norm",
                                         "logits"};
      if (std::string(arch) != "llama") expect.push_back("layers.0.attn.q_norm");
      if (std::string(arch) == "qwen3-moe") {
        for (const char* p : {"router_logits", "topk_ids", "topk_weights", "out"})
          expect.push_back(std::string("layers.0.moe.") + p);
        expect.push_back("layers.1.mlp.act");  // mlp_only_layers: the last layer is dense
      } else {
        for (const char* p : {"gate_up", "act", "out"})
          expect.push_back(std::string("layers.0.mlp.") + p);
      }
      for (const auto& n : expect)
        EXPECT_TRUE(trace.find(n)) << arch << "/" << scheme << " lacks " << n;
      EXPECT_EQ(trace.at("layers.0.residual").rows, 6);
    }
  }
}

TEST_F(ReferenceModels, PrefillEqualsTokenByTokenDecode) {
  for (const char* arch : kArchs) {
    for (const std::string scheme : {"bf16", "w8a8-int8-dyn", "fp8-block", "kv-int8"}) {
      const fs::path dir = scheme == "bf16" ? fp(arch) : quantized(arch, scheme);
      auto prefill = load_model(dir);
      auto decode = load_model(dir);
      const auto t = tokens(8, prefill->config().vocab);
      const Matrix a = prefill->forward(t);
      Matrix b(0, a.cols);
      for (size_t i = 0; i < t.size(); ++i) {
        const Matrix step = decode->forward(std::span<const int64_t>(t).subspan(i, 1));
        b.data.insert(b.data.end(), step.data.begin(), step.data.end());
        b.rows += 1;
      }
      EXPECT_LE(test::relative_l2(b, a), 1e-12) << arch << "/" << scheme;
      EXPECT_EQ(decode->cached_tokens(), 8);
    }
  }
}

// Rewrites a single-file checkpoint with `edit` applied to its tensor list.
struct OwnedTensor {
  std::string name;
  DType dtype;
  std::vector<uint64_t> shape;
  std::vector<uint8_t> bytes;
};

std::vector<OwnedTensor> read_all(const fs::path& file) {
  const auto f = SafetensorsFile::open(file);
  std::vector<OwnedTensor> out;
  for (const auto& t : f.tensors()) {
    const auto b = f.bytes(t);
    out.push_back({t.name, t.dtype, t.shape, {b.begin(), b.end()}});
  }
  return out;
}

void write_all(const fs::path& dir, const fs::path& config_from,
               const std::vector<OwnedTensor>& ts) {
  fs::create_directories(dir);
  fs::copy_file(config_from, dir / "config.json", fs::copy_options::overwrite_existing);
  std::vector<TensorToWrite> w;
  for (const auto& t : ts)
    w.push_back({t.name, t.dtype, t.shape, t.bytes});
  write_safetensors(dir / "model.safetensors", std::move(w), std::nullopt,
                    OverwritePolicy::kReplace);
}

TEST_F(ReferenceModels, FusedAndSplitCheckpointsGiveIdenticalLogits) {
  for (const char* arch : {"llama", "qwen3"}) {
    auto tensors = read_all(fp(arch) / "model.safetensors");
    std::map<std::string, OwnedTensor> by_name;
    for (auto& t : tensors)
      by_name[t.name] = t;
    std::vector<OwnedTensor> fused;
    for (const auto& t : tensors) {
      const auto dot = t.name.rfind('.', t.name.size() - 8);
      const std::string mod = t.name.substr(0, dot), leaf = t.name.substr(dot + 1);
      if (leaf == "k_proj.weight" || leaf == "v_proj.weight" || leaf == "up_proj.weight") continue;
      if (leaf == "q_proj.weight" || leaf == "gate_proj.weight") {
        const bool attn = leaf == "q_proj.weight";
        OwnedTensor f = t;
        f.name = mod + (attn ? ".qkv_proj.weight" : ".gate_up_proj.weight");
        for (const char* other : attn ? std::vector<const char*>{"k_proj", "v_proj"}
                                      : std::vector<const char*>{"up_proj"}) {
          const OwnedTensor& o = by_name.at(mod + "." + other + ".weight");
          f.bytes.insert(f.bytes.end(), o.bytes.begin(), o.bytes.end());
          f.shape[0] += o.shape[0];
        }
        fused.push_back(std::move(f));
        continue;
      }
      fused.push_back(t);
    }
    const fs::path dir = root_ / (std::string(arch) + ".fused");
    write_all(dir, fp(arch) / "config.json", fused);
    auto a = load_model(fp(arch));
    auto b = load_model(dir);
    const auto t = tokens(5, a->config().vocab);
    const Matrix la = a->forward(t), lb = b->forward(t);
    EXPECT_EQ(la.data, lb.data) << arch << ": bit-identical logits expected";
  }
}

// A format with finer resolution errs less than a coarser one of the same structure. Judged at
// the first op that carries a format's error alone (layers.0.attn.qkv: the same normalized input
// through each format's quantized linear), where that is a law. The logits of a tiny random
// model are chaotic (relative errors of 0.2-0.7): there the order of such pairs flipped for 5 of
// 251 fixture seeds tried (fp8-channel vs nvfp4 at seed 1005: 0.709 vs 0.688; mxfp8 vs mxfp4 at
// 1084: 0.666 vs 0.350), so the logits are only required to rank 8-bit weights alone below 4-bit
// weights and activations together (no flip in the 825 seeds tried).
TEST_F(ReferenceModels, ErrorRanksFormatsByResolution) {
  auto ref = load_model(fp("llama"));
  const auto t = tokens(12, ref->config().vocab);
  const std::string first_op = "layers.0.attn.qkv";
  const auto run = [&](CausalLm& m, Matrix& op) {
    Trace trace(first_op);
    ForwardHooks hooks;
    hooks.trace = &trace;
    Matrix logits = m.forward(t, hooks);
    op = trace.at(first_op);
    return logits;
  };
  Matrix base_op;
  const Matrix base = run(*ref, base_op);
  std::map<std::string, double> err_op, err_logits;
  for (const std::string s : {"w8a16-ch", "fp8-channel", "w4a16-g32", "nvfp4", "mxfp4", "mxfp8"}) {
    auto m = load_model(quantized("llama", s));
    Matrix op;
    err_logits[s] = test::relative_l2(run(*m, op), base);
    err_op[s] = test::relative_l2(op, base_op);
  }
  // Pairs that differ in resolution only: weight-only 8-bit vs 4-bit; 8-bit vs 4-bit with
  // activations quantized too, with the same 32-input E8M0 groups (mxfp8 vs mxfp4), or with
  // fp8's per-channel and per-token scales against NVFP4's 16-input groups (e4m3 keeps 3
  // mantissa bits over its whole range, e2m1 one). Not w8a8-int8-dyn vs nvfp4: one int8 scale
  // per activation row against 16-input groups is a difference of structure, not resolution
  // only (this test's logit form once failed on it in CI, seed 2977509020372477041: 0.362 vs
  // 0.315).
  const std::pair<const char*, const char*> pairs[] = {{"w8a16-ch", "w4a16-g32"},
                                                       {"w8a16-ch", "mxfp4"},
                                                       {"mxfp8", "mxfp4"},
                                                       {"fp8-channel", "nvfp4"}};
  for (const auto& [fine, coarse] : pairs)
    EXPECT_LT(err_op[fine], err_op[coarse])
        << first_op << ": " << fine << " " << err_op[fine] << " vs " << coarse << " "
        << err_op[coarse] << " " << test::seed_note(seed_);
  EXPECT_LT(err_logits["w8a16-ch"], err_logits["mxfp4"])
      << "logits: w8a16-ch " << err_logits["w8a16-ch"] << " vs mxfp4 " << err_logits["mxfp4"] << " "
      << test::seed_note(seed_);
}

TEST_F(ReferenceModels, LoaderErrorsNameTheTensor) {
  const auto base = read_all(fp("qwen3") / "model.safetensors");
  const fs::path cfg = fp("qwen3") / "config.json";
  auto run = [&](const std::string& tag, const std::function<void(std::vector<OwnedTensor>&)>& f) {
    auto ts = base;
    f(ts);
    const fs::path dir = root_ / ("qwen3.bad." + tag);
    write_all(dir, cfg, ts);
    return error_of([&] { load_model(dir); });
  };
  auto find = [](std::vector<OwnedTensor>& ts, const std::string& n) -> OwnedTensor& {
    for (auto& t : ts)
      if (t.name == n) return t;
    throw std::runtime_error("no " + n);
  };
  EXPECT_THAT(run("missing",
                  [](auto& ts) {
                    std::erase_if(ts, [](const OwnedTensor& t) {
                      return t.name == "model.layers.1.self_attn.k_proj.weight";
                    });
                  }),
              HasSubstr("model.layers.1.self_attn.k_proj.weight: missing"));
  EXPECT_THAT(run("missing-norm",
                  [](auto& ts) {
                    std::erase_if(ts, [](const OwnedTensor& t) {
                      return t.name == "model.layers.0.self_attn.q_norm.weight";
                    });
                  }),
              HasSubstr("model.layers.0.self_attn.q_norm.weight: missing"));
  EXPECT_THAT(run("extra",
                  [&](auto& ts) {
                    OwnedTensor t = find(ts, "model.norm.weight");
                    t.name = "model.layers.0.mlp.extra_proj.weight";
                    ts.push_back(t);
                  }),
              HasSubstr("'model.layers.0.mlp.extra_proj.weight': is not used"));
  EXPECT_THAT(run("shape",
                  [&](auto& ts) {
                    OwnedTensor& t = find(ts, "model.layers.0.mlp.down_proj.weight");
                    t.shape = {t.shape[1], t.shape[0]};
                  }),
              HasSubstr("model.layers.0.mlp.down_proj.weight: shape"));
  EXPECT_THAT(run("dtype",
                  [&](auto& ts) {
                    OwnedTensor& t = find(ts, "model.layers.0.self_attn.o_proj.weight");
                    t.dtype = DType::kI16;
                  }),
              HasSubstr("model.layers.0.self_attn.o_proj.weight: dtype I16"));
}

// The measured rel_l2 of emulate against exact logits for the seed-7 Qwen3 fixture (below).
constexpr double kSeed7EmulateShift = 4.888e-3;

TEST_F(ReferenceModels, DeterministicAndEmulateRoundsActivations) {
  auto a = load_model(fp("qwen3-moe"));
  auto b = load_model(fp("qwen3-moe"));
  const auto t = tokens(7, a->config().vocab);
  EXPECT_EQ(a->forward(t).data, b->forward(t).data);
  LoadOptions o;
  o.mode = PrecisionMode::kEmulate;
  auto e = load_model(fp("qwen3-moe"), o);
  Trace trace;
  ForwardHooks hooks;
  hooks.trace = &trace;
  a->reset_cache();
  const Matrix exact = a->forward(t);
  const Matrix emul = e->forward(t, hooks);
  EXPECT_GT(test::relative_l2(emul, exact), 0.0);
  // How far bf16 storage moves the logits, on a dense model (in a MoE model a rounding can flip
  // a router decision, which changes a token's output discontinuously). No bound holds for every
  // random model (how much it amplifies the roundings is its own: stress runs measured up to
  // 0.13 on some seeds against a 5e-2 guess), so a fixed fixture (seed 7) and fixed tokens, whose
  // number is known, carry the check: emulate must move it, by the measured amount to 10%.
  {
    const fs::path dir = root_ / "qwen3-seed7";
    if (!fs::exists(dir)) {
      fixtures::FixtureSpec spec;
      spec.arch = fixtures::parse_fixture_arch("qwen3");
      spec.seed = 7;
      fixtures::write_fp_checkpoint(spec, dir, OverwritePolicy::kRefuse);
    }
    auto dense = load_model(dir);
    auto dense_emul = load_model(dir, o);
    std::vector<int64_t> fixed;
    for (int64_t i = 0; i < 7; ++i)
      fixed.push_back((i * 7919 + 3) % dense->config().vocab);
    const double d = test::relative_l2(dense_emul->forward(fixed), dense->forward(fixed));
    EXPECT_NEAR(d, kSeed7EmulateShift, 0.1 * kSeed7EmulateShift);
  }
  for (const char* p : {"layers.0.residual", "layers.0.attn.core", "final_norm"})
    for (double v : trace.at(p).data)
      ASSERT_EQ(v, static_cast<double>(static_cast<float>(v))) << p << " not bf16";  // bf16 ⊂ fp32
  // Stricter: bf16 values have 16 zero low bits as fp32.
  for (double v : trace.at("layers.0.residual").data) {
    const float f = static_cast<float>(v);
    uint32_t u;
    std::memcpy(&u, &f, 4);
    ASSERT_EQ(u & 0xFFFFu, 0u);
  }
}

// An fp32 checkpoint run in bf16 (run_dtype: what a bf16 engine does with it) is its bf16 copy,
// every weight rounded once to bf16 and the config saying bfloat16: bit for bit at every capture
// point in emulate mode. Without run_dtype the fp32 weights run as they are.
TEST_F(ReferenceModels, RunDtypeEqualsTheCheckpointConvertedToIt) {
  for (const char* arch : kArchs) {
    SCOPED_TRACE(arch);
    const fs::path f32 = root_ / (std::string(arch) + ".f32");
    if (!fs::exists(f32)) {
      fixtures::FixtureSpec spec;
      spec.arch = fixtures::parse_fixture_arch(arch);
      spec.seed = seed_;
      spec.dtype = DType::kF32;
      fixtures::write_fp_checkpoint(spec, f32, OverwritePolicy::kRefuse);
    }
    const fs::path b16 = root_ / (std::string(arch) + ".f32-as-bf16");
    if (!fs::exists(b16)) {
      fs::create_directories(b16);
      Json cfg = Json::parse(std::ifstream(f32 / "config.json"));
      for (const char* key : {"torch_dtype", "dtype"})
        if (cfg.contains(key)) cfg[key] = "bfloat16";
      std::ofstream(b16 / "config.json") << cfg.dump(2);
      const Checkpoint ck = Checkpoint::open(f32);
      std::vector<HostTensor> held;
      held.reserve(ck.tensors().size());
      std::vector<TensorToWrite> out;
      for (const auto& [name, ref] : ck.tensors()) {
        std::vector<int64_t> shape(ref.info->shape.begin(), ref.info->shape.end());
        const auto values = decode(TensorView{ref.info->dtype, shape, ref.bytes()}, name);
        held.push_back(encode(DType::kBF16, shape, values, Encoding::kNearest, name));
        out.push_back({name, DType::kBF16, ref.info->shape, held.back().bytes});
      }
      write_safetensors(b16 / "model.safetensors", out, std::nullopt);
    }
    LoadOptions run_bf16;
    run_bf16.mode = PrecisionMode::kEmulate;
    run_bf16.run_dtype = DType::kBF16;
    LoadOptions plain;
    plain.mode = PrecisionMode::kEmulate;
    auto a = load_model(f32, run_bf16);
    auto b = load_model(b16, plain);
    auto c = load_model(f32, plain);
    EXPECT_EQ(a->model_dtype(), DType::kF32);
    EXPECT_EQ(a->run_dtype(), DType::kBF16);
    EXPECT_EQ(c->run_dtype(), DType::kF32);
    const auto t = tokens(6, a->config().vocab);
    Trace ta, tb, tc;
    ForwardHooks ha, hb, hc;
    ha.trace = &ta, hb.trace = &tb, hc.trace = &tc;
    a->forward(t, ha);
    b->forward(t, hb);
    c->forward(t, hc);
    ASSERT_EQ(ta.points().size(), tb.points().size());
    for (size_t i = 0; i < ta.points().size(); ++i)
      ASSERT_EQ(ta.points()[i].second.data, tb.points()[i].second.data) << ta.points()[i].first;
    EXPECT_NE(ta.at("logits").data, tc.at("logits").data) << "fp32 weights must run as fp32";
    // A config saying bfloat16 over fp32 tensors, without run_dtype: the tensors are used as
    // stored (only an asked-for run dtype rounds weights), so it is not the bf16 copy.
    const fs::path mixed = root_ / (std::string(arch) + ".f32-config-bf16");
    if (!fs::exists(mixed)) {
      fs::create_directories(mixed);
      fs::copy_file(b16 / "config.json", mixed / "config.json");
      for (const auto& f : fs::directory_iterator(f32))
        if (f.path().extension() != ".json" || f.path().filename() != "config.json")
          fs::copy(f.path(), mixed / f.path().filename());
    }
    auto d = load_model(mixed, plain);
    EXPECT_EQ(d->run_dtype(), DType::kBF16);
    EXPECT_FALSE(d->weight_rounding().has_value());
    Trace td;
    ForwardHooks hd;
    hd.trace = &td;
    d->forward(t, hd);
    EXPECT_NE(td.at("logits").data, tb.at("logits").data) << "weights were rounded unasked";
  }
}

// The engine-neutral integer form every GPU weight-only / int8 kernel is built from: for the
// integer-weight schemes, w = (stored - zero) * scale per group is the method's own dequantized
// weight, bit for bit, in every linear of every layer.
TEST_F(ReferenceModels, ProcessedIntWeightIsTheDequantizedWeight) {
  for (const std::string scheme : {"w8a16-ch", "w8a16-g64", "w4a16-g32", "w8a8-int8-dyn"}) {
    SCOPED_TRACE(scheme);
    auto m = load_model(quantized("llama", scheme));
    int checked = 0;
    for (const DecoderLayer& l : m->layers())
      for (const LinearMethod* lm :
           {l.attn.qkv.get(), l.attn.o_proj.get(), l.mlp->gate_up.get(), l.mlp->down.get()}) {
        const std::optional<ProcessedIntWeight> w = lm->processed_int_weight(0);
        if (!w) continue;  // a linear the scheme leaves unquantized
        const Matrix want = lm->dequantized_weight(0);
        ASSERT_EQ(w->rows, want.rows);
        ASSERT_EQ(w->cols, want.cols);
        ASSERT_EQ(w->cols % w->group, 0);
        ASSERT_EQ(w->scale.size(), static_cast<size_t>(w->rows * w->cols / w->group));
        ASSERT_EQ(w->zero.size(), w->scale.size());
        const int64_t lo = -(int64_t{1} << (w->bits - 1)), hi = (int64_t{1} << (w->bits - 1)) - 1;
        for (int64_t r = 0; r < w->rows; ++r)
          for (int64_t c = 0; c < w->cols; ++c) {
            const size_t i = static_cast<size_t>(r * w->cols + c);
            const size_t g = static_cast<size_t>((r * w->cols + c) / w->group);
            ASSERT_GE(w->stored[i], lo);
            ASSERT_LE(w->stored[i], hi);
            ASSERT_EQ((static_cast<double>(w->stored[i]) - w->zero[g]) * w->scale[g], want(r, c))
                << lm->shape().prefix << " [" << r << ", " << c << "]";
          }
        ++checked;
      }
    EXPECT_GT(checked, 0);
  }
}

// The GEMMs split weight rows across threads; every output keeps its own fixed-order sum, so the
// thread count must not change a bit of any capture point.
TEST_F(ReferenceModels, ThreadCountDoesNotChangeABit) {
  const int saved = reference_threads();
  for (const char* arch : kArchs) {
    for (const std::string scheme : {"bf16", "w4a16-g32", "fp8-block", "w8a8-static", "nvfp4"}) {
      const fs::path dir = scheme == "bf16" ? fp(arch) : quantized(arch, scheme);
      std::vector<std::vector<std::pair<std::string, Matrix>>> runs;
      for (int threads : {1, 2, 3}) {
        set_reference_threads(threads);
        auto m = load_model(dir);
        Trace trace;
        ForwardHooks hooks;
        hooks.trace = &trace;
        m->forward(tokens(9, m->config().vocab), hooks);
        runs.push_back(trace.points());
      }
      for (size_t i = 1; i < runs.size(); ++i) {
        ASSERT_EQ(runs[i].size(), runs[0].size());
        for (size_t j = 0; j < runs[0].size(); ++j)
          EXPECT_EQ(runs[i][j].second.data, runs[0][j].second.data)
              << arch << "/" << scheme << " " << runs[0][j].first << " threads " << i + 1;
      }
    }
  }
  set_reference_threads(saved);
}

}  // namespace
}  // namespace qparity::reference
