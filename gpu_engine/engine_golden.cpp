#include "gpu_engine/engine_golden.h"

#include <algorithm>
#include <cmath>
#include <iostream>
#include <ostream>
#include "core/capture/capture_points.h"

#include "core/capture/trace.h"
#include "core/error.h"
#include "gpu_engine/device_info.h"

namespace qparity::gpu {

void fill_meta(Engine& e, uint64_t seed, const std::string& input_set, golden::Golden& g);

std::string device_name() {
  std::string why;
  const auto d = query_device(0, &why);
  if (!d) throw Error("engine", "no usable CUDA device: " + why);
  return d->name + " " + d->sm();
}

// Sequences per forward: as many whole sequences as fit in max_tokens.
golden::Golden engine_golden(Engine& e, const golden::TokenInputs& in, const std::string& capture,
                             bool want_points, std::ostream* progress) {
  if (!in.pixels.grids.empty())
    throw Error("engine run",
                "image prompts (M-RoPE image positions, deepstack) are not in the "
                "GPU engine yet: the fp64 reference runs them");
  golden::Golden g;
  g.sequences = in.sequences;
  g.seq_len = in.seq_len;
  g.tokens = in.tokens;
  g.targets = golden::next_token_targets(in);
  const int64_t per = std::clamp<int64_t>(e.options().max_tokens / std::max<int64_t>(in.seq_len, 1),
                                          1, e.options().max_seqs);
  if (in.seq_len > e.options().max_tokens || in.seq_len > e.options().max_context)
    throw Error("engine run", "sequences of " + std::to_string(in.seq_len) +
                                  " tokens exceed --max-tokens / the context");
  Trace trace(want_points ? capture : "");
  const int64_t vocab = e.config().vocab;
  g.logits.cols = vocab;
  for (int64_t s0 = 0; s0 < in.sequences; s0 += per) {
    const int64_t n = std::min(per, in.sequences - s0);
    Batch b;
    for (int64_t s = 0; s < n; ++s)
      for (int64_t i = 0; i < in.seq_len; ++i) {
        b.tokens.push_back(
            static_cast<int32_t>(in.tokens[static_cast<size_t>((s0 + s) * in.seq_len + i)]));
        b.slots.push_back(static_cast<int32_t>(s));
        b.positions.push_back(static_cast<int32_t>(i));
      }
    e.forward(b, want_points ? &trace : nullptr);
    const std::vector<float> l = e.logits_host(b.size());
    g.logits.data.insert(g.logits.data.end(), l.begin(), l.end());
    g.logits.rows += b.size();
    for (int64_t s = 0; s < n; ++s)
      e.release(static_cast<int32_t>(s));
    if (progress)
      *progress << "qparity engine: sequences " << s0 + 1 << ".." << s0 + n << "/" << in.sequences
                << "\n";
  }
  // Non-finite logits are what the engine computed: the dump keeps them (compare fails them by
  // name), and the run says so now.
  int64_t nonfinite = 0;
  size_t first = 0;
  for (size_t i = 0; i < g.logits.data.size(); ++i)
    if (!std::isfinite(g.logits.data[i]) && nonfinite++ == 0) first = i;
  if (nonfinite > 0)
    std::cerr << "qparity engine: warning: " << nonfinite << " non-finite logits (first: row "
              << first / static_cast<size_t>(vocab) << ", vocab index "
              << first % static_cast<size_t>(vocab) << "); the dump keeps them\n";
  for (const auto& [name, m] : trace.points()) {
    g.points.push_back({name, golden::Array2D{m.rows, m.cols, m.data}});
  }
  golden::fill_scores(g);
  fill_meta(e, in.seed, in.description, g);
  return g;
}

void fill_meta(Engine& e, uint64_t seed, const std::string& input_set, golden::Golden& g) {
  const std::string model = e.model().dir.string();
  g.meta.producer = "qparity-gpu-engine";
  g.meta.model = golden::model_name(model);
  g.meta.architecture = std::string(arch_name(e.config().arch));
  g.meta.model_config_hash = golden::config_hash(model);
  g.meta.checkpoint_hash = golden::checkpoint_tensor_hash(model);
  g.meta.scheme = e.model().scheme;
  g.meta.dialect = std::string(qparity::to_string(e.model().dialect));
  g.meta.precision_mode = "bf16-engine";
  g.meta.model_dtype = "BF16";  // activations and unquantized weights run in bf16
  g.meta.seed = seed;
  g.meta.input_set = input_set;
  g.meta.device = device_name();
  if (e.tp() > 1) {
    g.meta.device += ", tp " + std::to_string(e.tp());
    // Points the ranks hold no whole-model tensor of (core/parallel/tp_gather.h): declared
    // absent with the reason, so compare lists them instead of failing them as missing.
    for (const Engine::AbsentPoint& a : e.tp_absent_points())
      g.meta.absent_points.push_back({a.name, "tp " + std::to_string(e.tp()) + ": " + a.reason});
  }
}

golden::Golden engine_golden_local(Engine& e, const golden::GoldenReader& ref,
                                   const std::string& capture, std::ostream* progress) {
  const ModelConfig& c = e.config();
  const int64_t s_count = ref.sequences(), t = ref.seq_len();
  if (ref.has_images())
    throw Error(ref.path().string(),
                "a golden of image prompts: M-RoPE image positions and "
                "deepstack are not in the GPU engine yet");
  if (t > e.options().max_tokens || t > e.options().max_context)
    throw Error(ref.path().string(), "sequences of " + std::to_string(t) +
                                         " tokens exceed the engine's max_tokens / context");
  golden::Golden g;
  g.sequences = s_count;
  g.seq_len = t;
  g.tokens = ref.tokens();
  g.targets = ref.targets();
  g.logits.cols = c.vocab;
  Trace trace(capture);
  const auto batch_of = [&](int64_t s) {
    Batch b;
    for (int64_t i = 0; i < t; ++i) {
      b.tokens.push_back(static_cast<int32_t>(g.tokens[static_cast<size_t>(s * t + i)]));
      b.slots.push_back(0);
      b.positions.push_back(static_cast<int32_t>(i));
    }
    return b;
  };
  const auto input_rows = [&](const golden::Array2D& a, int64_t s) {
    const auto first = a.data.begin() + s * t * a.cols;
    return std::vector<double>(first, first + t * a.cols);
  };
  for (int64_t s = 0; s < s_count; ++s) {
    e.forward_embed(batch_of(s), &trace);
    e.release(0);
  }
  for (int64_t l = 0; l <= c.num_layers; ++l) {
    const std::string input = layer_input_point(l);
    if (!ref.has_point(input))
      throw Error(ref.path().string(), "lacks points/" + input +
                                           ", needed for a layer-local run (golden make "
                                           "--capture must keep it)");
    const golden::Array2D x = ref.point(input);
    for (int64_t s = 0; s < s_count; ++s) {
      if (l < c.num_layers) {
        e.forward_layer(l, input_rows(x, s), batch_of(s), &trace);
      } else {
        e.forward_final(input_rows(x, s), batch_of(s), &trace);
        const std::vector<float> lg = e.logits_host(t);
        g.logits.data.insert(g.logits.data.end(), lg.begin(), lg.end());
        g.logits.rows += t;
      }
      e.release(0);
    }
    if (progress && l < c.num_layers)
      *progress << "qparity engine: layer " << l << " on the golden's inputs\n";
  }
  for (const auto& [name, m] : trace.points()) {
    g.points.push_back({name, golden::Array2D{m.rows, m.cols, m.data}});
  }
  golden::fill_scores(g);
  fill_meta(e, ref.meta().seed, "layer-local:" + ref.meta().input_set, g);
  g.meta.run_mode = golden::RunMode::kLayerLocal;
  return g;
}

std::vector<LayerPointStats> engine_rerun_layer(Engine& e, const golden::GoldenReader& ref,
                                                int64_t layer) {
  const std::string input = layer_input_point(layer);
  if (!ref.has_point(input))
    throw Error(ref.path().string(),
                "lacks points/" + input + ", the input of layer " + std::to_string(layer));
  const golden::Array2D x = ref.point(input);
  const int64_t t = ref.seq_len();
  Trace trace("layers." + std::to_string(layer) + ".*");
  for (int64_t s = 0; s < ref.sequences(); ++s) {
    Batch b;
    for (int64_t i = 0; i < t; ++i) {
      b.tokens.push_back(0);  // the layer starts from x: token ids are not read
      b.slots.push_back(0);
      b.positions.push_back(static_cast<int32_t>(i));
    }
    const auto first = x.data.begin() + s * t * x.cols;
    e.forward_layer(layer, std::vector<double>(first, first + t * x.cols), b, &trace);
    e.release(0);
  }
  std::vector<LayerPointStats> out;
  for (const auto& [name, m] : trace.points()) {
    if (!ref.has_point(name)) continue;
    const Matrix* ids =
        golden::slots_follow_router(name) ? trace.find(golden::slot_ids_point(name)) : nullptr;
    out.push_back({name, golden::compare_rerun_point(ref, name, m.data,
                                                     ids ? ids->data : std::vector<double>{})});
  }
  return out;
}

}  // namespace qparity::gpu
