#include "reference_cpu/models/calibration.h"

#include <algorithm>
#include <cmath>
#include <ostream>
#include <random>

#include "core/error.h"

namespace qparity::reference {

namespace {

void observe_linear(ActivationStats& s, bool first, const Matrix& x) {
  if (first) {
    s.min = s.max = x.data.empty() ? 0.0 : x.data[0];
    s.channel_absmax.assign(static_cast<size_t>(x.cols), 0.0);
  }
  for (int64_t r = 0; r < x.rows; ++r)
    for (int64_t c = 0; c < x.cols; ++c) {
      const double v = x(r, c);
      s.min = std::min(s.min, v);
      s.max = std::max(s.max, v);
      double& a = s.channel_absmax[static_cast<size_t>(c)];
      a = std::max(a, std::fabs(v));
    }
}

void observe_channels(std::vector<double>& lo, std::vector<double>& hi, const Matrix& x) {
  if (lo.empty()) {
    lo.assign(static_cast<size_t>(x.cols), INFINITY);
    hi.assign(static_cast<size_t>(x.cols), -INFINITY);
  }
  for (int64_t r = 0; r < x.rows; ++r)
    for (int64_t c = 0; c < x.cols; ++c) {
      lo[static_cast<size_t>(c)] = std::min(lo[static_cast<size_t>(c)], x(r, c));
      hi[static_cast<size_t>(c)] = std::max(hi[static_cast<size_t>(c)], x(r, c));
    }
}

}  // namespace

CalibrationStats calibrate(CausalLm& model, std::span<const int64_t> tokens, int64_t chunk,
                           std::ostream* progress) {
  if (tokens.empty()) throw Error("calibration", "no calibration tokens");
  if (chunk <= 0) throw Error("calibration", "chunk must be > 0");
  CalibrationStats out;
  ForwardHooks hooks;
  hooks.on_linear_input = [&](const std::string& prefix, const Matrix& x) {
    auto [it, inserted] = out.linear_inputs.try_emplace(prefix);
    observe_linear(it->second, inserted, x);
  };
  hooks.on_kv = [&](const std::string& prefix, const Matrix& k, const Matrix& v) {
    KvChannelStats& s = out.kv[prefix];
    observe_channels(s.k_min, s.k_max, k);
    observe_channels(s.v_min, s.v_max, v);
  };
  // Layer-major: every chunk passes layer l (appending to l's KV cache in chunk order) before
  // layer l + 1 runs, so that a streaming model loads each layer once. Each linear and attention
  // belongs to one layer and sees the chunks in the same order as chunk by chunk through
  // forward(), with the same operations, so the statistics are those bits (signed zeros and
  // first-seen values included). The head (final norm, lm_head) feeds no statistic: not run.
  model.reset_cache();
  std::vector<Matrix> x;
  std::vector<std::vector<int64_t>> pos;
  for (size_t i = 0; i < tokens.size(); i += static_cast<size_t>(chunk)) {
    const size_t n = std::min(static_cast<size_t>(chunk), tokens.size() - i);
    x.push_back(model.embed_tokens(tokens.subspan(i, n)));
    pos.emplace_back(n);
    for (size_t j = 0; j < n; ++j)
      pos.back()[j] = static_cast<int64_t>(i + j);
  }
  for (int64_t l = 0; l < model.config().num_layers; ++l) {
    model.acquire_layer(l);
    model.reset_layer_cache(l);
    for (size_t c = 0; c < x.size(); ++c)
      x[c] = model.forward_layer(l, std::move(x[c]), pos[c], hooks);
    model.reset_layer_cache(l);
    model.release_layer(l);
    if (progress)
      *progress << "calibration: layer " << (l + 1) << "/" << model.config().num_layers << " ("
                << tokens.size() << " tokens" << (model.streams_layers() ? ", streamed" : "")
                << ")\n"
                << std::flush;
  }
  model.reset_cache();
  out.tokens = static_cast<int64_t>(tokens.size());
  return out;
}

std::vector<int64_t> synthetic_tokens(int64_t count, int64_t vocab, uint64_t seed) {
  if (vocab <= 0) throw Error("calibration", "vocabulary size must be > 0");
  std::mt19937_64 rng(seed);  // raw 64-bit draws are specified by the standard: portable
  std::vector<int64_t> t(static_cast<size_t>(count));
  for (auto& x : t)
    x = static_cast<int64_t>(rng() % static_cast<uint64_t>(vocab));
  return t;
}

}  // namespace qparity::reference
