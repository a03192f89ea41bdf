#include "golden/reference_run.h"

#include <algorithm>
#include <cmath>
#include <fstream>
#include <iostream>
#include <ostream>
#include <random>
#include <sstream>

#include "core/capture/capture_points.h"
#include "core/capture/trace.h"
#include "core/error.h"
#include "core/input_file.h"
#include "core/memory_budget.h"
#include "core/safetensors/checkpoint.h"
#include "core/sha256.h"
#include "core/text/tokenizer.h"
#include "reference_cpu/models/model_loader.h"
#include "reference_cpu/models/tensor_parallel_emulation.h"

namespace qparity::golden {

namespace fs = std::filesystem;

TokenInputs synthetic_inputs(int64_t sequences, int64_t seq_len, int64_t vocab, uint64_t seed) {
  if (sequences <= 0 || seq_len <= 0 || vocab <= 0)
    throw Error("synthetic inputs", "sequences, seq_len and vocab must be > 0");
  TokenInputs in;
  in.sequences = sequences;
  in.seq_len = seq_len;
  in.seed = seed;
  std::mt19937_64 rng(seed);
  for (int64_t i = 0; i < sequences * seq_len; ++i)
    in.tokens.push_back(static_cast<int64_t>(rng() % static_cast<uint64_t>(vocab)));
  in.description = "synthetic:" + std::to_string(sequences) + "x" + std::to_string(seq_len) +
                   ":seed=" + std::to_string(seed);
  return in;
}

TokenInputs text_inputs(std::string text, int64_t seq_len, const std::string& where,
                        std::string description) {
  for (char& c : text)
    if (c == ',') c = ' ';
  std::istringstream items(text);
  TokenInputs in;
  std::string item;
  while (items >> item) {
    size_t used = 0;
    int64_t v = -1;
    try {
      v = std::stoll(item, &used);
    } catch (const std::exception&) {
      used = 0;
    }
    if (used != item.size() || v < 0)
      throw Error(where, "'" + item + "' is not a token id (non-negative integer)");
    in.tokens.push_back(v);
  }
  const auto n = static_cast<int64_t>(in.tokens.size());
  if (n == 0) throw Error(where, "no tokens");
  in.seq_len = seq_len > 0 ? seq_len : n;
  if (n % in.seq_len != 0)
    throw Error(where, std::to_string(n) + " tokens do not split into sequences of " +
                           std::to_string(in.seq_len));
  in.sequences = n / in.seq_len;
  in.description = std::move(description);
  return in;
}

TokenInputs file_inputs(const fs::path& file, int64_t seq_len) {
  std::stringstream ss;
  ss << read_input_file(file, "token file");
  const std::string name = file == "-" ? "stdin" : file.filename().string();
  return text_inputs(ss.str(), seq_len, file == "-" ? "stdin" : file.string(), "file:" + name);
}

TokenInputs tokenized_text_inputs(const fs::path& text_file, const fs::path& model_dir,
                                  int64_t seq_len, int64_t stride, int64_t max_sequences) {
  const std::string where = text_file == "-" ? "stdin" : text_file.string();
  std::stringstream ss;
  ss << read_input_file(text_file, "text file");
  const Tokenizer tok = Tokenizer::load(model_dir);
  std::vector<int64_t> ids;
  try {
    ids = tok.encode(ss.str());
  } catch (const Error& e) {
    throw Error(where, e.what());
  }
  const auto n = static_cast<int64_t>(ids.size());
  if (seq_len < 0 || stride < 0 || max_sequences < 0)
    throw Error(where, "--seq-len, --stride and the sequence count must not be negative");
  TokenInputs in;
  in.seq_len = seq_len > 0 ? seq_len : n;
  if (stride == 0) stride = in.seq_len;
  if (n < in.seq_len || in.seq_len < 1)
    throw Error(where, "the text is " + std::to_string(n) + " tokens, fewer than one sequence of " +
                           std::to_string(in.seq_len));
  int64_t used_end = 0;
  for (int64_t start = 0; start + in.seq_len <= n; start += stride) {
    if (max_sequences > 0 && in.sequences == max_sequences) break;
    in.tokens.insert(in.tokens.end(), ids.begin() + start, ids.begin() + start + in.seq_len);
    ++in.sequences;
    used_end = start + in.seq_len;
  }
  const std::string name = text_file == "-" ? "stdin" : text_file.filename().string();
  in.description = "text:" + name + " (" + std::to_string(n) + " tokens by the checkpoint's " +
                   tok.description() + "; " + std::to_string(in.sequences) + " x " +
                   std::to_string(in.seq_len) + " from the start, stride " +
                   std::to_string(stride) + "; " + std::to_string(n - used_end) +
                   " tokens after the last window unused)";
  return in;
}

std::vector<int64_t> next_token_targets(const TokenInputs& in) {
  return next_token_targets(in.tokens, in.sequences, in.seq_len);
}

bool saturated_code(int64_t stored, double lattice) {
  if (lattice == 1.0) return stored <= -128 || stored >= 127;           // int8
  if (lattice == 0x1p-9) return stored == 229376 || stored == -229376;  // e4m3 448
  if (lattice == 0.5) return stored == 12 || stored == -12;             // e2m1 6
  return false;
}

void record_activation_codes(Trace& trace, const std::string& name,
                             const reference::QuantizedMatrix& q) {
  const std::string values = point_of(name, point::kXValues),
                    scales = point_of(name, point::kXScales);
  if (is_activation_code_point(values) && trace.wants(values)) {
    Matrix v(q.rows, q.cols);
    for (int64_t r = 0; r < q.rows; ++r)
      for (int64_t c = 0; c < q.cols; ++c)
        v(r, c) = static_cast<double>(q.code(r, c)) * q.lattice;
    trace.record(values, v);
  }
  if (is_activation_code_point(scales) && trace.wants(scales)) {
    // One row per token (a per-tensor or per-block scale repeated over its rows), as every
    // point has.
    Matrix sc(q.rows, q.scales.cols);
    for (int64_t r = 0; r < q.rows; ++r)
      for (int64_t c = 0; c < q.scales.cols; ++c)
        sc(r, c) = q.scales(std::min(r / q.block_rows, q.scales.rows - 1), c);
    trace.record(scales, sc);
  }
}

namespace {

// Counts one linear's activation codes into the golden's statistics and records the dense
// linears' codes as points (what an engine's quantization kernel must match bit for bit);
// expert stacks (a routed subset of tokens each) and KV caches are counted, not recorded.
void observe_codes(Golden& g, Trace& trace, const std::string& name,
                   const reference::QuantizedMatrix& q) {
  auto it = std::find_if(g.activation_stats.begin(), g.activation_stats.end(),
                         [&](const ActivationCodeStats& a) { return a.name == name; });
  if (it == g.activation_stats.end())
    it = g.activation_stats.insert(g.activation_stats.end(), ActivationCodeStats{name});
  std::vector<int64_t> row(static_cast<size_t>(q.cols));
  for (int64_t r = 0; r < q.rows; ++r) {
    q.stored_row(r, row);
    for (int64_t c : row)
      it->saturated += saturated_code(c, q.lattice);
  }
  record_activation_codes(trace, name, q);
  it->codes += q.rows * q.cols;
  it->scales += static_cast<int64_t>(q.scales.data.size());
  for (double sc : q.scales.data)
    it->zero_scales += sc == 0.0;
}

uint64_t trace_bytes(const Trace& t) {
  uint64_t n = 0;
  for (const auto& [name, m] : t.points())
    n += m.data.size() * sizeof(double);
  return n;
}

}  // namespace

GoldenImages image_golden_inputs(const reference::Qwen3VlVisionTower& tower, const ModelConfig& cfg,
                                 const TokenInputs& in) {
  GoldenImages im;
  const reference::PixelInput& px = in.pixels;
  const auto t = static_cast<size_t>(in.seq_len);
  size_t next = 0;
  for (int64_t s = 0; s < in.sequences; ++s) {
    int64_t runs = 0;
    for (size_t i = 0; i < t; ++i) {
      const bool img = in.tokens[static_cast<size_t>(s) * t + i] == cfg.image_token_id;
      const bool prev =
          i > 0 && in.tokens[static_cast<size_t>(s) * t + i - 1] == cfg.image_token_id;
      runs += img && !prev;
    }
    for (int64_t r = 0; r < runs; ++r, ++next) {
      if (next >= px.grids.size())
        throw Error("inputs", "sequence " + std::to_string(s) + "'s image placeholder run " +
                                  std::to_string(r) + " has no image left (" +
                                  std::to_string(px.grids.size()) + " given)");
      im.sequence.push_back(s);
    }
  }
  if (next != px.grids.size())
    throw Error("inputs", std::to_string(px.grids.size()) + " images for " + std::to_string(next) +
                              " placeholder runs in the sequences");
  for (const reference::GridThw& g : px.grids)
    im.grid_thw.insert(im.grid_thw.end(), {g.t, g.h, g.w});
  im.pixels = {px.pixels.rows, px.pixels.cols, px.pixels.data};
  const reference::ImageFeatures f = reference::image_features(tower, px);
  im.merge = f.merge;
  im.embeds = {f.embeds.rows, f.embeds.cols, f.embeds.data};
  for (const Matrix& d : f.deepstack)
    im.deepstack.push_back({d.rows, d.cols, d.data});
  return im;
}

reference::ImageFeatures sequence_image_features(const GoldenImages& im, int64_t sequence) {
  reference::ImageFeatures f;
  f.merge = im.merge;
  int64_t first = 0, count = 0;
  for (int64_t i = 0; i < im.images(); ++i) {
    const int64_t rows = im.tokens_of(i);
    if (im.sequence[static_cast<size_t>(i)] < sequence) first += rows;
    if (im.sequence[static_cast<size_t>(i)] != sequence) continue;
    count += rows;
    const auto k = static_cast<size_t>(3 * i);
    f.grids.push_back({im.grid_thw[k], im.grid_thw[k + 1], im.grid_thw[k + 2]});
  }
  auto rows_of = [&](const Array2D& a) {
    Matrix m(count, a.cols);
    std::copy(a.data.begin() + first * a.cols, a.data.begin() + (first + count) * a.cols,
              m.data.begin());
    return m;
  };
  f.embeds = rows_of(im.embeds);
  for (const Array2D& d : im.deepstack)
    f.deepstack.push_back(rows_of(d));
  return f;
}

Golden run_reference(reference::CausalLm& model, const TokenInputs& in, const std::string& capture,
                     std::ostream* progress, uint64_t memory_budget, const GoldenImages* images) {
  Golden g;
  g.sequences = in.sequences;
  g.seq_len = in.seq_len;
  g.tokens = in.tokens;
  g.targets = next_token_targets(in);
  const ModelConfig& cfg = model.config();
  const int64_t vocab = cfg.vocab;
  for (int64_t t : in.tokens)
    if (t >= vocab)
      throw Error("inputs", "token " + std::to_string(t) + " outside the vocabulary (" +
                                std::to_string(vocab) + ")");
  g.logits.cols = vocab;
  // Layer-major: every sequence passes a layer before the next layer runs (each sequence from an
  // empty cache, so the bits are those of one forward() per sequence), so that a streaming model
  // loads each layer once. Each sequence keeps its own trace and hidden state meanwhile.
  const auto S = static_cast<size_t>(in.sequences);
  std::vector<Trace> traces(S, Trace(capture));
  std::vector<reference::ForwardHooks> hooks(S);
  for (size_t s = 0; s < S; ++s) {
    hooks[s].trace = &traces[s];
    hooks[s].on_activation_codes = [&g, &traces, s](const std::string& name,
                                                    const reference::QuantizedMatrix& q) {
      observe_codes(g, traces[s], name, q);
    };
  }
  std::vector<int64_t> pos(static_cast<size_t>(in.seq_len));
  for (size_t i = 0; i < pos.size(); ++i)
    pos[i] = static_cast<int64_t>(i);
  model.reset_cache();
  std::vector<Matrix> x(S);
  // Image prompts: every sequence with its images, the same operations as forward_image_prompt.
  std::vector<reference::ImagePrompt> prompts;
  if (images && !images->empty()) {
    for (size_t s = 0; s < S; ++s) {
      try {
        prompts.push_back(model.prepare_image_prompt(
            std::span<const int64_t>(in.tokens.data() + s * pos.size(), pos.size()),
            sequence_image_features(*images, static_cast<int64_t>(s))));
      } catch (const Error& e) {
        throw Error("sequence " + std::to_string(s), e.what());
      }
    }
    g.images = *images;
  }
  for (size_t s = 0; s < S; ++s) {
    const std::span<const int64_t> tokens(in.tokens.data() + s * pos.size(), pos.size());
    x[s] = prompts.empty() ? model.embed_tokens(tokens, hooks[s])
                           : model.embed_image_prompt(tokens, prompts[s], hooks[s]);
  }
  uint64_t before_layers = 0;
  for (const Trace& t : traces)
    before_layers += trace_bytes(t);
  const auto tokens = static_cast<uint64_t>(in.sequences * in.seq_len);
  for (int64_t l = 0; l < cfg.num_layers; ++l) {
    model.acquire_layer(l);
    for (size_t s = 0; s < S; ++s) {
      model.reset_layer_cache(l);
      x[s] = prompts.empty() ? model.forward_layer(l, std::move(x[s]), pos, hooks[s])
                             : model.forward_layer(l, std::move(x[s]), prompts[s], hooks[s]);
    }
    model.reset_layer_cache(l);
    model.release_layer(l);
    if (l == 0 && memory_budget > 0) {
      // Every layer captures what layer 0 did; the final norm and fp64 logits come on top.
      uint64_t after = 0;
      for (const Trace& t : traces)
        after += trace_bytes(t);
      const uint64_t estimate = before_layers +
                                (after - before_layers) * static_cast<uint64_t>(cfg.num_layers) +
                                tokens * static_cast<uint64_t>(cfg.hidden + vocab) * sizeof(double);
      if (estimate > memory_budget)
        throw Error("reference run",
                    "the capture points of " + std::to_string(in.sequences) + " x " +
                        std::to_string(in.seq_len) + " tokens would hold about " +
                        format_bytes(estimate) + " in memory (fp64), more than the budget of " +
                        format_bytes(memory_budget) +
                        ": capture fewer points (--capture 'layers.*.residual,logits') or run "
                        "fewer tokens");
    }
    if (progress)
      *progress << "qparity golden: layer " << (l + 1) << "/" << cfg.num_layers << " ("
                << in.sequences << " x " << in.seq_len << " tokens"
                << (model.streams_layers() ? ", streamed" : "") << ")\n"
                << std::flush;
  }
  for (size_t s = 0; s < S; ++s) {
    const Matrix logits = model.head(x[s], hooks[s]);
    x[s] = Matrix();
    g.logits.data.insert(g.logits.data.end(), logits.data.begin(), logits.data.end());
    g.logits.rows += logits.rows;
    const auto& pts = traces[s].points();
    if (s == 0)
      for (const auto& [name, m] : pts) {
        g.points.push_back({name, Array2D{0, m.cols, {}}});
        g.points.back().values.data.reserve(m.data.size() * S);
      }
    if (pts.size() != g.points.size())
      throw Error("reference run", "sequence " + std::to_string(s) + " captured a different set " +
                                       "of points than sequence 0");
    for (size_t i = 0; i < pts.size(); ++i) {
      Array2D& a = g.points[i].values;
      const auto& m = pts[i].second;
      if (pts[i].first != g.points[i].name || m.cols != a.cols)
        throw Error("reference run", "capture point " + pts[i].first + " changed shape");
      for (size_t j = 0; j < m.data.size(); ++j)
        if (!std::isfinite(m.data[j]))
          throw Error("reference run",
                      pts[i].first + " is not finite at sequence " + std::to_string(s) + " row " +
                          std::to_string(static_cast<int64_t>(j) / std::max<int64_t>(m.cols, 1)));
      a.data.insert(a.data.end(), m.data.begin(), m.data.end());
      a.rows += m.rows;
    }
    traces[s].clear();
  }
  model.reset_cache();
  for (double v : g.logits.data)
    if (!std::isfinite(v)) throw Error("reference run", "logits are not finite");
  fill_scores(g);
  g.meta.architecture = std::string(arch_name(model.config().arch));
  g.meta.dialect = std::string(qparity::to_string(model.dialect()));
  g.meta.precision_mode = std::string(reference::to_string(model.mode()));
  g.meta.model_dtype = std::string(dtype_name(model.run_dtype()));  // what the weights ran in
  g.meta.seed = in.seed;
  g.meta.input_set = in.description;
  g.meta.device = "cpu-reference";
  return g;
}

Golden run_reference(const fs::path& model_dir, const TokenInputs& in, const ReferenceRunOptions& o,
                     std::ostream* progress) {
  reference::LoadOptions lo;
  lo.override_scheme = o.scheme;
  lo.dialect = o.dialect;
  lo.mode = o.mode;
  lo.run_dtype = o.run_dtype;
  lo.streaming = o.tp > 1 ? reference::LayerStreaming::kNever : o.streaming;
  const uint64_t budget = o.memory_budget > 0 ? o.memory_budget : available_memory_bytes();
  lo.memory_budget = budget;
  auto model = reference::load_model(model_dir, lo);
  reference::emulate_tensor_parallel(*model, model_dir, o.scheme, o.tp);
  std::optional<GoldenImages> images;
  if (!in.pixels.grids.empty()) {
    if (o.tp > 1)
      throw Error("--tp", "image prompts under tensor-parallel arithmetic are not implemented");
    images = image_golden_inputs(reference::load_vision_tower(model_dir.string(), model->config()),
                                 model->config(), in);
  }
  if (progress && model->streams_layers())
    *progress << "qparity golden: streaming the model one decoder layer at a time ("
              << format_bytes(reference::checkpoint_bytes(Checkpoint::open(model_dir)))
              << " of tensors, memory budget " << format_bytes(budget) << ")\n";
  Golden g = run_reference(*model, in, o.capture, progress, budget, images ? &*images : nullptr);
  g.meta.model = model_name(model_dir);
  g.meta.model_config_hash = config_hash(model_dir);
  g.meta.checkpoint_hash = checkpoint_tensor_hash(model_dir);
  g.meta.scheme = o.scheme ? *o.scheme : plan_scheme(model->plan());
  g.meta.point_precision = o.point_precision;
  if (o.tp > 1) g.meta.device += ", tp " + std::to_string(o.tp) + " arithmetic";
  return g;
}


}  // namespace qparity::golden
