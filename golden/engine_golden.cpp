#include "golden/engine_golden.h"

#include <algorithm>
#include <cmath>
#include <iostream>
#include <ostream>
#include "core/capture/capture_points.h"

#include "core/capture/trace.h"
#include "core/error.h"
#include "golden/reference_run.h"
#include "gpu_engine/device_info.h"
#include "reference_cpu/models/image_input.h"

namespace qparity::gpu {

void fill_meta(Engine& e, uint64_t seed, const std::string& input_set, golden::Golden& g);

namespace {

// Each sequence's image prompt (the reference's checks, M-RoPE rows, placeholder rows and
// features) from a golden's images; empty for a text golden. The engine has no vision tower:
// these features are the reference's, computed once.
std::vector<reference::ImagePrompt> image_prompts(const Engine& e, const golden::GoldenImages& im,
                                                  const std::vector<int64_t>& tokens,
                                                  int64_t sequences, int64_t seq_len) {
  std::vector<reference::ImagePrompt> out;
  if (im.empty()) return out;
  const ModelConfig& c = e.config();
  for (int64_t s = 0; s < sequences; ++s) {
    const std::span<const int64_t> seq(tokens.data() + s * seq_len, static_cast<size_t>(seq_len));
    out.push_back(reference::prepare_image_prompt(c, c.num_layers, seq,
                                                  golden::sequence_image_features(im, s)));
  }
  return out;
}

// Appends sequence p's image prompt to batch b, whose rows [first, first + n) hold it; rows3
// gathers the batch's rotary rows (finish_image_batch moves them in).
void append_image_prompt(Batch& b, std::vector<int32_t> (&rows3)[3],
                         const reference::ImagePrompt& p, int64_t first, int64_t n) {
  const std::vector<int64_t>* rows[3] = {&p.positions.t, &p.positions.h, &p.positions.w};
  for (int r = 0; r < 3; ++r)
    for (int64_t i = 0; i < n; ++i)
      rows3[r].push_back(static_cast<int32_t>((*rows[r])[static_cast<size_t>(i)]));
  for (int64_t row : p.rows)
    b.image_rows.push_back(static_cast<int32_t>(first + row));
  b.image_embeds.insert(b.image_embeds.end(), p.embeds.data.begin(), p.embeds.data.end());
  if (b.deepstack.size() < p.deepstack.size()) b.deepstack.resize(p.deepstack.size());
  for (size_t k = 0; k < p.deepstack.size(); ++k)
    b.deepstack[k].insert(b.deepstack[k].end(), p.deepstack[k].data.begin(),
                          p.deepstack[k].data.end());
}

void finish_image_batch(Batch& b, std::vector<int32_t> (&rows3)[3]) {
  for (auto& r : rows3) {
    b.rope_rows.insert(b.rope_rows.end(), r.begin(), r.end());
    r.clear();
  }
}

}  // namespace

std::string device_name() {
  std::string why;
  const auto d = query_device(0, &why);
  if (!d) throw Error("engine", "no usable CUDA device: " + why);
  return d->name + " " + d->sm();
}

// Sequences per forward: as many whole sequences as fit in max_tokens.
golden::Golden engine_golden(Engine& e, const golden::TokenInputs& in, const std::string& capture,
                             bool want_points, std::ostream* progress) {
  golden::Golden g;
  g.sequences = in.sequences;
  g.seq_len = in.seq_len;
  g.tokens = in.tokens;
  if (!in.pixels.grids.empty()) {
    // The images' features from the reference's vision tower (fp64), recorded as a golden's.
    const ModelConfig& c = e.config();
    if (!c.image_text)
      throw Error("engine run", c.arch_name + " takes no images (an image-text checkpoint does)");
    g.images =
        golden::image_golden_inputs(reference::load_vision_tower(e.model().dir.string(), c), c, in);
  }
  const std::vector<reference::ImagePrompt> prompts =
      image_prompts(e, g.images, in.tokens, in.sequences, in.seq_len);
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
    std::vector<int32_t> rows3[3];
    for (int64_t s = 0; s < n; ++s) {
      if (!prompts.empty())
        append_image_prompt(b, rows3, prompts[static_cast<size_t>(s0 + s)], b.size(), in.seq_len);
      for (int64_t i = 0; i < in.seq_len; ++i) {
        b.tokens.push_back(
            static_cast<int32_t>(in.tokens[static_cast<size_t>((s0 + s) * in.seq_len + i)]));
        b.slots.push_back(static_cast<int32_t>(s));
        b.positions.push_back(static_cast<int32_t>(i));
      }
    }
    if (!prompts.empty()) finish_image_batch(b, rows3);
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
  if (t > e.options().max_tokens || t > e.options().max_context)
    throw Error(ref.path().string(), "sequences of " + std::to_string(t) +
                                         " tokens exceed the engine's max_tokens / context");
  golden::Golden g;
  g.sequences = s_count;
  g.seq_len = t;
  g.tokens = ref.tokens();
  g.targets = ref.targets();
  g.logits.cols = c.vocab;
  if (ref.has_images()) g.images = ref.images();
  const std::vector<reference::ImagePrompt> prompts =
      image_prompts(e, g.images, g.tokens, s_count, t);
  Trace trace(capture);
  const auto batch_of = [&](int64_t s) {
    Batch b;
    std::vector<int32_t> rows3[3];
    if (!prompts.empty()) append_image_prompt(b, rows3, prompts[static_cast<size_t>(s)], 0, t);
    for (int64_t i = 0; i < t; ++i) {
      b.tokens.push_back(static_cast<int32_t>(g.tokens[static_cast<size_t>(s * t + i)]));
      b.slots.push_back(0);
      b.positions.push_back(static_cast<int32_t>(i));
    }
    if (!prompts.empty()) finish_image_batch(b, rows3);
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
  // An image golden's layers rotate by its M-RoPE rows and add its deepstack features.
  const std::vector<reference::ImagePrompt> prompts =
      ref.has_images() ? image_prompts(e, ref.images(), ref.tokens(), ref.sequences(), t)
                       : std::vector<reference::ImagePrompt>{};
  Trace trace("layers." + std::to_string(layer) + ".*");
  for (int64_t s = 0; s < ref.sequences(); ++s) {
    Batch b;
    std::vector<int32_t> rows3[3];
    if (!prompts.empty()) append_image_prompt(b, rows3, prompts[static_cast<size_t>(s)], 0, t);
    for (int64_t i = 0; i < t; ++i) {
      b.tokens.push_back(0);  // the layer starts from x: token ids are not read
      b.slots.push_back(0);
      b.positions.push_back(static_cast<int32_t>(i));
    }
    if (!prompts.empty()) finish_image_batch(b, rows3);
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
