// The C++ dump API (golden/candidate_writer.h): what it writes reads back as the schema says,
// named for its checkpoint, in execution order, with the scores computed from the logits; and
// every rule of the Python writer (plus the model's own widths and layers) refused by name.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <vector>

#include "core/config/model_config.h"
#include "error_of.h"
#include "golden/candidate_writer.h"
#include "golden/checkpoint_identity.h"
#include "golden/scores.h"
#include "scratch_dir.h"

namespace qparity::golden {
namespace {

namespace fs = std::filesystem;
using test::error_of;
using ::testing::HasSubstr;

const fs::path kModel = fs::path(QPARITY_SOURCE_DIR) / "fixtures" / "trained" / "llama";

struct Fixture {
  ModelConfig cfg = load_model_config(kModel / "config.json");
  int64_t s = 2, t = 3;
  std::vector<int64_t> tokens = {5, 9, 2, 7, 7, 1};
  CandidateInfo info() const {
    CandidateInfo i;
    i.producer = "my-engine";
    i.producer_version = "1.2";
    i.device = "NVIDIA H100 80GB HBM3 sm90";
    return i;
  }
  std::vector<float> values(int64_t width, float base) const {
    std::vector<float> v(static_cast<size_t>(s * t * width));
    for (size_t i = 0; i < v.size(); ++i)
      v[i] = base + static_cast<float>(i) * 0.25f;
    return v;
  }
};

TEST(CandidateWriter, WritesWhatTheReaderReadsNamedForItsCheckpoint) {
  const Fixture f;
  const fs::path out = test::scratch_dir("qparity_candidate_writer") / "cand.h5";
  CandidateWriter w(kModel, f.tokens, f.s, f.t, f.info());
  const int64_t h = f.cfg.hidden;
  // Given out of order: the file holds them in execution order.
  w.add_point("final_norm", f.values(h, 3.f), h);
  w.add_point("layers.1.residual", f.values(h, 2.f), h);
  w.add_point("embed", f.values(h, 1.f), h);
  std::vector<double> ninf = std::vector<double>(static_cast<size_t>(f.s * f.t * h), 0.5);
  ninf[3] = std::nan("");  // written as it is: compare fails an engine's NaN, the writer does not
  w.add_point("layers.0.attn.out", ninf, h);
  w.declare_absent("layers.*.attn.core", "fused attention kernel: core output not exposed");
  std::vector<float> logits(static_cast<size_t>(f.s * f.t * f.cfg.vocab));
  for (size_t i = 0; i < logits.size(); ++i)
    logits[i] = static_cast<float>((i * 7919) % 101) / 17.f;
  w.set_logits(logits);
  w.write(out);

  const auto r = GoldenReader::open(out);
  EXPECT_EQ(r.meta().producer, "my-engine");
  EXPECT_EQ(r.meta().producer_version, "1.2");
  EXPECT_EQ(r.meta().model, "llama");
  EXPECT_EQ(r.meta().scheme, "bf16") << "the checkpoint's own scheme when none is given";
  EXPECT_EQ(r.meta().model_config_hash, config_hash(kModel));
  EXPECT_EQ(r.meta().checkpoint_hash, checkpoint_tensor_hash(kModel));
  EXPECT_EQ(r.meta().input_set, "file:2x3");
  EXPECT_EQ(r.meta().precision_mode, "my-engine");
  ASSERT_EQ(r.meta().absent_points.size(), 1u);
  EXPECT_EQ(r.meta().absent_points[0].glob, "layers.*.attn.core");
  EXPECT_EQ(r.tokens(), f.tokens);
  EXPECT_EQ(r.targets(), (std::vector<int64_t>{9, 2, -1, 7, 1, -1}));
  EXPECT_EQ(r.point_names(),
            (std::vector<std::string>{"embed", "layers.0.attn.out", "layers.1.residual",
                                      "final_norm", "logits"}));
  EXPECT_EQ(r.point("logits").data, r.logits().data) << "the logits point is the outputs'";
  const Array2D e = r.point("embed");
  const std::vector<float> ev = f.values(h, 1.f);
  ASSERT_EQ(e.data.size(), ev.size());
  for (size_t i = 0; i < ev.size(); ++i)
    ASSERT_EQ(e.data[i], static_cast<double>(ev[i])) << i;
  EXPECT_TRUE(std::isnan(r.point("layers.0.attn.out").data[3]));
  const Array2D l = r.logits();
  EXPECT_EQ(l.cols, f.cfg.vocab);
  const std::vector<double> lp = target_logprobs(l, r.targets());
  const std::vector<double> got = r.target_logprobs();
  for (size_t i = 0; i < lp.size(); ++i)
    if (std::isnan(lp[i]))
      EXPECT_TRUE(std::isnan(got[i]));
    else
      EXPECT_EQ(got[i], lp[i]);
  EXPECT_NEAR(r.sequence_nll()[0], -(lp[0] + lp[1]) / 2, 1e-15);
  // Never over an existing file unless asked; the file stays as it was.
  const auto size = fs::file_size(out);
  EXPECT_THAT(error_of([&] { w.write(out); }), HasSubstr("exists"));
  EXPECT_EQ(fs::file_size(out), size);
  w.write(out, OverwritePolicy::kReplace);
}

TEST(CandidateWriter, RefusesWhatTheSchemaOrTheModelRules) {
  const Fixture f;
  const int64_t h = f.cfg.hidden;
  CandidateWriter w(kModel, f.tokens, f.s, f.t, f.info());
  const auto add = [&](const std::string& name, int64_t width, int64_t rows_scale = 1) {
    return error_of([&] {
      std::vector<float> v(static_cast<size_t>(f.s * f.t * width * rows_scale));
      w.add_point(name, v, width);
    });
  };
  const std::string past = "layers." + std::to_string(f.cfg.num_layers) + ".attn.out";
  EXPECT_THAT(add(past, h), HasSubstr("is not a capture point of this LlamaForCausalLM model"));
  EXPECT_THAT(add("layers.0.attn.qvk", h), HasSubstr("is not a capture point"));
  EXPECT_THAT(add("layers.0.moe.out", h), HasSubstr("is not a capture point")) << "dense model";
  EXPECT_THAT(add("embed", h + 1),
              HasSubstr("width " + std::to_string(h + 1) + ", the model's is"));
  EXPECT_THAT(add("embed", h, 2), HasSubstr("expected [S*T = 6, width]"));
  EXPECT_NO_THROW(w.add_point("embed", f.values(h, 0.f), h));
  EXPECT_THAT(add("embed", h), HasSubstr("given twice"));
  w.declare_absent("layers.*.attn.rope_q", "fused rotary");
  EXPECT_THAT(add("layers.0.attn.rope_q", f.cfg.num_heads * f.cfg.head_dim),
              HasSubstr("declared absent by 'layers.*.attn.rope_q'"));
  EXPECT_THAT(error_of([&] { w.declare_absent("emb*", "x"); }), HasSubstr("which is in the dump"));
  EXPECT_THAT(error_of([&] { w.declare_absent("layer.*.attn.out", "typo"); }),
              HasSubstr("names no capture point"));
  EXPECT_THAT(error_of([&] { w.declare_absent("a b", ""); }), HasSubstr("no spaces"));
  EXPECT_THAT(error_of([&] { w.set_logits(std::vector<float>(5)); }),
              HasSubstr("vocab = " + std::to_string(f.cfg.vocab)));
  EXPECT_THAT(error_of([&] { w.write(test::scratch_dir("qparity_candidate_writer") / "x.h5"); }),
              HasSubstr("outputs/logits not set"));
  // The inputs: a producer, whole sequences, ids inside the vocabulary.
  CandidateInfo anonymous = f.info();
  anonymous.producer.clear();
  EXPECT_THAT(error_of([&] { CandidateWriter(kModel, f.tokens, f.s, f.t, anonymous); }),
              HasSubstr("name the engine"));
  EXPECT_THAT(error_of([&] { CandidateWriter(kModel, f.tokens, 4, 2, f.info()); }),
              HasSubstr("6 ids for 4 x 2"));
  std::vector<int64_t> outside = f.tokens;
  outside[4] = f.cfg.vocab;
  EXPECT_THAT(error_of([&] { CandidateWriter(kModel, outside, f.s, f.t, f.info()); }),
              HasSubstr("outside the vocabulary"));
  EXPECT_THAT(error_of([&] {
                CandidateWriter(test::scratch_dir("qparity_candidate_writer"), f.tokens, f.s, f.t,
                                f.info());
              }),
              HasSubstr("config.json"));
}

}  // namespace
}  // namespace qparity::golden
