#include "golden/reference_candidate.h"

#include <numeric>

#include "core/capture/capture_points.h"
#include "core/error.h"
#include "golden/scores.h"

namespace qparity::golden {

namespace {

// Appends each sequence's trace to g.points (same names, same widths, in the first trace's
// order) and fills the metadata and scores.
void finish(reference::CausalLm& model, std::vector<Trace>& traces, Golden& g) {
  for (size_t s = 0; s < traces.size(); ++s) {
    const auto& pts = traces[s].points();
    if (s == 0)
      for (const auto& [name, m] : pts)
        g.points.push_back({name, Array2D{0, m.cols, {}}});
    if (pts.size() != g.points.size())
      throw Error("reference candidate", "sequence " + std::to_string(s) +
                                             " captured another set of points than sequence 0");
    for (size_t i = 0; i < pts.size(); ++i) {
      Array2D& a = g.points[i].values;
      if (pts[i].first != g.points[i].name || pts[i].second.cols != a.cols)
        throw Error("reference candidate", "capture point " + pts[i].first + " changed shape");
      a.data.insert(a.data.end(), pts[i].second.data.begin(), pts[i].second.data.end());
      a.rows += pts[i].second.rows;
    }
  }
  fill_scores(g);
  g.meta.architecture = std::string(arch_name(model.config().arch));
  g.meta.dialect = std::string(qparity::to_string(model.dialect()));
  g.meta.precision_mode = std::string(reference::to_string(model.mode()));
  g.meta.model_dtype = std::string(dtype_name(model.run_dtype()));
  g.meta.device = kReferenceCandidateDevice;
  g.meta.producer = model.deviation().any()
                        ? "qparity-reference+" + reference::to_string(model.deviation())
                        : "qparity-reference";
}

// Every point into `trace`, the activation codes (x_values / x_scales) included, as an engine
// dumps them and the golden records them.
reference::ForwardHooks hooks_into(Trace& trace) {
  reference::ForwardHooks h;
  h.trace = &trace;
  h.on_activation_codes = [&trace](const std::string& name, const reference::QuantizedMatrix& q) {
    record_activation_codes(trace, name, q);
  };
  return h;
}

std::vector<int64_t> positions(int64_t t) {
  std::vector<int64_t> p(static_cast<size_t>(t));
  std::iota(p.begin(), p.end(), int64_t{0});
  return p;
}

}  // namespace

Golden reference_candidate_free(reference::CausalLm& model, const TokenInputs& in) {
  Golden g;
  g.sequences = in.sequences;
  g.seq_len = in.seq_len;
  g.tokens = in.tokens;
  g.targets = next_token_targets(in);
  g.logits.cols = model.config().vocab;
  std::vector<Trace> traces;
  for (int64_t s = 0; s < in.sequences; ++s) {
    traces.emplace_back("*");
    reference::ForwardHooks hooks = hooks_into(traces.back());
    model.reset_cache();
    const std::span<const int64_t> tokens(in.tokens.data() + s * in.seq_len,
                                          static_cast<size_t>(in.seq_len));
    const Matrix logits = model.forward(tokens, hooks);
    g.logits.data.insert(g.logits.data.end(), logits.data.begin(), logits.data.end());
    g.logits.rows += logits.rows;
  }
  model.reset_cache();
  g.meta.seed = in.seed;
  g.meta.input_set = in.description;
  g.meta.run_mode = RunMode::kFree;
  finish(model, traces, g);
  return g;
}

Golden reference_candidate_local(reference::CausalLm& model, const GoldenReader& ref) {
  const ModelConfig& cfg = model.config();
  const int64_t s_count = ref.sequences(), t = ref.seq_len();
  Golden g;
  g.sequences = s_count;
  g.seq_len = t;
  g.tokens = ref.tokens();
  g.targets = ref.targets();
  g.logits.cols = cfg.vocab;
  std::vector<Trace> traces;
  std::vector<reference::ForwardHooks> hooks(static_cast<size_t>(s_count));
  for (int64_t s = 0; s < s_count; ++s)
    traces.emplace_back("*");
  for (int64_t s = 0; s < s_count; ++s) {
    hooks[static_cast<size_t>(s)] = hooks_into(traces[static_cast<size_t>(s)]);
    model.embed_tokens(std::span<const int64_t>(g.tokens.data() + s * t, static_cast<size_t>(t)),
                       hooks[static_cast<size_t>(s)]);
  }
  const std::vector<int64_t> pos = positions(t);
  for (int64_t l = 0; l <= cfg.num_layers; ++l) {
    const std::string input = layer_input_point(l);
    if (!ref.has_point(input))
      throw Error(ref.path().string(), "lacks points/" + input + ", needed for a layer-local run");
    const Array2D x = ref.point(input);
    if (l < cfg.num_layers) model.acquire_layer(l);
    for (int64_t s = 0; s < s_count; ++s) {
      Matrix rows(t, x.cols);
      std::copy_n(x.data.begin() + s * t * x.cols, t * x.cols, rows.data.begin());
      if (l < cfg.num_layers) {
        model.reset_layer_cache(l);
        model.forward_layer(l, std::move(rows), pos, hooks[static_cast<size_t>(s)]);
      } else {
        const Matrix logits = model.head(rows, hooks[static_cast<size_t>(s)]);
        g.logits.data.insert(g.logits.data.end(), logits.data.begin(), logits.data.end());
        g.logits.rows += logits.rows;
      }
    }
    if (l < cfg.num_layers) {
      model.reset_layer_cache(l);
      model.release_layer(l);
    }
  }
  g.meta.seed = ref.meta().seed;
  g.meta.input_set = "layer-local:" + ref.meta().input_set;
  g.meta.run_mode = RunMode::kLayerLocal;
  finish(model, traces, g);
  return g;
}

}  // namespace qparity::golden
