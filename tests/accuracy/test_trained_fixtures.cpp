// The committed trained fixtures (fixtures/trained/README.md) against transformers: the fp64
// reference, fed by qparity's own tokenizer, gives the held-out perplexity that transformers 5
// computed in fp32 from Hugging Face `tokenizers`' ids when the fixtures were trained (recorded
// in train_log.json). An independent forward of each trained checkpoint, end to end, text to
// perplexity; and the check that validate's default models are trained (far below the 1,024 of a
// uniform guess).
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <numeric>
#include <string>

#include "core/json_util.h"
#include "golden/reference_run.h"

namespace qparity::golden {
namespace {

namespace fs = std::filesystem;

TEST(TrainedFixtures, ReferencePerplexityOnHeldOutTextMatchesTransformers) {
  const fs::path root = fs::path(QPARITY_SOURCE_DIR) / "fixtures" / "trained";
  const Json log = read_json_file(root / "train_log.json");
  for (const char* name : {"llama", "qwen3", "qwen3-moe"}) {
    SCOPED_TRACE(name);
    // What train_fixtures.py measured: the first 16 windows of 128 tokens of eval.txt.
    const TokenInputs in = tokenized_text_inputs(root / "eval.txt", root / name, 128, 0, 16);
    ASSERT_EQ(in.sequences, 16);
    ReferenceRunOptions ro;
    ro.capture = "embed";  // the logits are what this test needs
    const Golden g = run_reference(root / name, in, ro, nullptr);
    // Every window scores its 127 next tokens, so the mean NLL is the mean of the windows'.
    const double nll = std::accumulate(g.sequence_nll.begin(), g.sequence_nll.end(), 0.0) /
                       static_cast<double>(g.sequence_nll.size());
    const double hf = log.at(name).at("eval_ppl_seq128_first16").get<double>();
    // fp32 against fp64 over 2,032 positions: agreement to about 1e-7 in ln PPL is expected;
    // a wrong token, weight or op moves it by orders of magnitude more.
    EXPECT_NEAR(nll, std::log(hf), 1e-5)
        << "reference PPL " << std::exp(nll) << ", transformers " << hf;
    EXPECT_LT(std::exp(nll), 20.0);
  }
}

}  // namespace
}  // namespace qparity::golden
