#include "reference_cpu/models/causal_lm.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include "core/capture/capture_points.h"

#include "core/codecs/float_format.h"
#include "core/error.h"
#include "reference_cpu/layers/activation.h"
#include "reference_cpu/layers/attention.h"
#include "reference_cpu/layers/moe_router.h"
#include "reference_cpu/layers/rms_norm.h"
#include "reference_cpu/models/deviant_arithmetic.h"
#include "schemes/math/numeric.h"
#include "schemes/method/tensor_decode.h"

namespace qparity::reference {

namespace {

Matrix columns(const Matrix& x, int64_t first, int64_t count) {
  Matrix out(x.rows, count);
  for (int64_t t = 0; t < x.rows; ++t)
    std::copy_n(x.data.begin() + t * x.cols + first, count, out.data.begin() + t * count);
  return out;
}

Matrix rows_of(const Matrix& x, const std::vector<int64_t>& rows) {
  Matrix out(static_cast<int64_t>(rows.size()), x.cols);
  for (size_t i = 0; i < rows.size(); ++i)
    std::copy_n(x.data.begin() + rows[i] * x.cols, x.cols,
                out.data.begin() + static_cast<int64_t>(i) * x.cols);
  return out;
}

void append_rows(Matrix& cache, const Matrix& x) {
  if (cache.rows == 0) cache.cols = x.cols;
  cache.data.insert(cache.data.end(), x.data.begin(), x.data.end());
  cache.rows += x.rows;
}

bool is_finite(double v) {
  return std::isfinite(v);
}

bool finite_row(const Matrix& x, int64_t t) {
  return std::all_of(x.row(t).begin(), x.row(t).end(), is_finite);
}

// f over x's finite rows; every row with a NaN / Inf comes out as a NaN row of out_cols.
template <class F>
Matrix through_finite_rows(const Matrix& x, int64_t out_cols, F f) {
  std::vector<int64_t> finite;
  for (int64_t t = 0; t < x.rows; ++t)
    if (finite_row(x, t)) finite.push_back(t);
  if (static_cast<int64_t>(finite.size()) == x.rows) return f(x);
  Matrix y(x.rows, out_cols);
  std::fill(y.data.begin(), y.data.end(), std::numeric_limits<double>::quiet_NaN());
  if (finite.empty()) return y;
  const Matrix part = f(rows_of(x, finite));
  for (size_t i = 0; i < finite.size(); ++i)
    std::copy_n(part.data.begin() + static_cast<int64_t>(i) * out_cols, out_cols,
                y.data.begin() + finite[i] * out_cols);
  return y;
}

void add_in_place(Matrix& a, const Matrix& b) {
  for (size_t i = 0; i < a.data.size(); ++i)
    a.data[i] += b.data[i];
}

}  // namespace

std::string_view to_string(PrecisionMode m) {
  switch (m) {
    case PrecisionMode::kExact:
      return "exact";
    case PrecisionMode::kEmulate:
      return "emulate";
  }
  return "?";
}

PrecisionMode parse_precision_mode(std::string_view s) {
  if (s == "exact") return PrecisionMode::kExact;
  if (s == "emulate") return PrecisionMode::kEmulate;
  throw Error("--mode", "unknown precision mode '" + std::string(s) + "' (exact, emulate)");
}

CausalLm::CausalLm(ModelConfig cfg, QuantPlan plan, Dialect dialect, PrecisionMode mode,
                   std::optional<DType> run_dtype)
    : cfg_(std::move(cfg)),
      plan_(std::move(plan)),
      dialect_(dialect),
      mode_(mode),
      model_dtype_(model_dtype_of(cfg_)),
      run_dtype_(run_dtype.value_or(model_dtype_)),
      weight_rounding_(run_dtype),
      rope_(cfg_) {
  arith_of(run_dtype_, "run dtype");  // BF16, F16, F32 or F64; anything else throws
  if (cfg_.mrope_section.size() == 3)
    mrope_rows_ =
        mrope_frequency_rows(static_cast<int64_t>(rope_.inv_freq().size()), cfg_.mrope_section);
}

void CausalLm::reset_cache() {
  for (auto& l : layers_) {
    l.k_cache = l.v_cache = Matrix();
    l.gdn_state = GatedDeltaNetState();
  }
  cached_ = 0;
  mrope_delta_ = 0;
}

void CausalLm::store(const std::string& name, Matrix& x, const ForwardHooks& h, bool fp32) const {
  round_stored(x, fp32);
  if (h.trace) h.trace->record(name, x);
}

void CausalLm::round_stored(Matrix& x, bool fp32) const {
  if (mode_ == PrecisionMode::kEmulate) {
    const Arith a = fp32 ? Arith::kFp32 : arith_of(run_dtype_, "run dtype");
    for (double& v : x.data)
      v = a == Arith::kFp32   ? static_cast<double>(static_cast<float>(v))
          : a == Arith::kFp64 ? v
                              : codec::round_to(a == Arith::kBf16 ? codec::kBF16 : codec::kFP16, v,
                                                codec::Overflow::kNonSaturating);
  }
}

Matrix CausalLm::embed(std::span<const int64_t> tokens) const {
  const int64_t h = cfg_.hidden;
  Matrix x(static_cast<int64_t>(tokens.size()), h);
  std::vector<double> row(static_cast<size_t>(h));
  for (size_t t = 0; t < tokens.size(); ++t) {
    if (tokens[t] < 0 || tokens[t] >= cfg_.vocab)
      throw Error("tokens", "token " + std::to_string(tokens[t]) + " at position " +
                                std::to_string(t) + " is outside the vocabulary [0, " +
                                std::to_string(cfg_.vocab) + ")");
    decode_to_double(embed_.dtype, embed_.bytes, static_cast<uint64_t>(tokens[t] * h), row,
                     "model.embed_tokens.weight");
    if (weight_rounding_ && embed_.dtype != *weight_rounding_)  // as the engine holds the table
      for (double& v : row)
        v = in(arith_of(*weight_rounding_), v);
    std::copy(row.begin(), row.end(), x.data.begin() + static_cast<int64_t>(t) * h);
  }
  return x;
}

void CausalLm::set_deviation(Deviation d) {
  using K = DeviationKind;
  const std::string name = to_string(d);
  if (d.any() && deviation_info(d.kind).layer_scoped && d.layer == Deviation::kChosenLayer)
    throw Error("deviation " + name, "changes one decoder layer: give it (" + name + "@L)");
  if (d.any() && deviation_info(d.kind).layer_scoped && (d.layer < 0 || d.layer >= cfg_.num_layers))
    throw Error("deviation " + name,
                "the model has " + std::to_string(cfg_.num_layers) + " decoder layers");
  const bool legit = d.any() && deviation_info(d.kind).expect == DeviationExpectation::kPass;
  if (d.kind == K::kExactArithmetic && mode_ != PrecisionMode::kExact)
    throw Error("deviation " + name, "needs a model loaded in exact mode");
  if (d.kind == K::kFp32Activations &&
      (mode_ != PrecisionMode::kEmulate || run_dtype_ != DType::kF32))
    throw Error("deviation " + name, "needs a model loaded in emulate mode with run dtype F32");
  if (legit && d.kind != K::kExactArithmetic && d.kind != K::kFp32Activations &&
      mode_ != PrecisionMode::kEmulate)
    throw Error("deviation " + name, "is a choice of rounding points: emulate mode only");
  deviation_ = d;
  *deviation_hits_ = 0;
  deviant_rope_.reset();
  if (d.kind == K::kRotaryBaseOff) {
    ModelConfig off = cfg_;
    off.rope_theta *= 1.01;
    deviant_rope_.emplace(off);
  }
  // Whole-model choices apply by construction.
  if (d.kind == K::kExactArithmetic || d.kind == K::kFp32Activations) hit();
}

bool CausalLm::deviates(DeviationKind k, int64_t layer) const {
  if (deviation_.kind != k) return false;
  return !deviation_info(k).layer_scoped || layer == deviation_.layer;
}

Arith CausalLm::stored_arith() const {
  return mode_ == PrecisionMode::kEmulate ? arith_of(run_dtype_, "run dtype") : Arith::kFp64;
}

Matrix CausalLm::norm(const Matrix& x, const NormWeights& w, int64_t input_norm_of) const {
  double eps = cfg_.rms_norm_eps;
  if (deviates(DeviationKind::kNormEpsTenfold)) {
    eps *= 10.0;
    hit();
  }
  if (input_norm_of >= 0 && deviates(DeviationKind::kNormInStorageDtype, input_norm_of)) {
    hit();
    return rms_norm_in(
        x, w.weight, eps, w.bias,
        run_dtype_ == DType::kF64 ? Arith::kBf16 : arith_of(run_dtype_, "run dtype"));
  }
  if (deviates(DeviationKind::kNormTwoRoundings)) {
    hit();
    return rms_norm_two_roundings(x, w.weight, eps, w.bias, stored_arith());
  }
  return rms_norm(x, w.weight, eps, w.bias);
}

Matrix CausalLm::dense_linear(const LinearMethod& m, const Matrix& x, int64_t layer,
                              bool o_proj) const {
  const bool bf16 = o_proj && deviates(DeviationKind::kBf16Accumulation, layer);
  if (bf16 || deviates(DeviationKind::kFp32Accumulation))
    if (auto y = accumulate_linear(m, x, bf16 ? Arith::kBf16 : Arith::kFp32)) {
      hit();
      return std::move(*y);
    }
  return apply_linear(m, x);
}

Matrix CausalLm::apply_linear(const LinearMethod& m, const Matrix& x, int64_t expert) const {
  if (!deviation_.any()) return m.apply(x, expert);
  return through_finite_rows(x, m.shape().out_features(),
                             [&](const Matrix& rows) { return m.apply(rows, expert); });
}

void CausalLm::rotate(Matrix& x, int64_t heads, const Positions& pos, int64_t layer) const {
  if (pos.mrope) {
    rope_.apply_mrope(x, heads, *pos.mrope, mrope_rows_);
    return;
  }
  const Rope* rope = &rope_;
  if (deviant_rope_) {
    rope = &*deviant_rope_;
    hit();
  }
  std::vector<int64_t> rotary = pos.rotary;
  if (deviates(DeviationKind::kPositionOffByOne))
    for (int64_t& p : rotary)
      if (p >= 1) {
        ++p;
        hit();
      }
  if (deviates(DeviationKind::kRotaryPairsInterleaved, layer) && !rope->interleaved()) {
    hit();
    rotate_pairs_interleaved(*rope, x, heads, rotary);
  } else if (deviates(DeviationKind::kRotaryRunDtype) && !rope->interleaved()) {
    hit();
    rotate_half_in(*rope, x, heads, rotary, stored_arith());
  } else {
    rope->apply(x, heads, rotary);
  }
}

Matrix CausalLm::mlp_activation(const Matrix& gu, int64_t layer) const {
  const bool swapped = deviates(DeviationKind::kGateUpSwapped, layer);
  const bool rounded = deviates(DeviationKind::kSiluRounded);
  if (!swapped && !rounded) return silu_and_mul(gu);
  hit();
  if (gu.cols % 2 != 0) throw Error("mlp_activation", "gate_up width must be even");
  const int64_t inter = gu.cols / 2;
  const Arith a = stored_arith();
  Matrix y(gu.rows, inter);
  for (int64_t t = 0; t < gu.rows; ++t)
    for (int64_t i = 0; i < inter; ++i) {
      const double g = gu(t, swapped ? inter + i : i), u = gu(t, swapped ? i : inter + i);
      y(t, i) = rounded ? in(a, in(a, silu(g)) * u) : silu(g) * u;
    }
  return y;
}

void CausalLm::round_residual(Matrix& x) const {
  if (deviates(DeviationKind::kResidualFp32)) {
    hit();
    round_stored(x, true);
    return;
  }
  round_stored(x);
}

void CausalLm::observe_codes(const LinearMethod& m, const std::string& name, const Matrix& x,
                             const ForwardHooks& hooks, int64_t expert) const {
  if (!hooks.on_activation_codes) return;
  // A candidate's NaN rows (output-tile-unwritten) have no codes: the method refuses them.
  if (deviation_.any() && !std::all_of(x.data.begin(), x.data.end(), is_finite)) return;
  if (const auto q = m.quantize_input(x, expert)) hooks.on_activation_codes(name, *q);
}

Matrix CausalLm::attention(DecoderLayer& l, const Matrix& h, const Positions& pos,
                           const ForwardHooks& hooks) {
  AttentionBlock& a = l.attn;
  const std::string lp = layer_prefix(l.index);
  if (hooks.on_linear_input)
    for (const char* p : {".q_proj", ".k_proj", ".v_proj"})
      hooks.on_linear_input(a.prefix + p, h);
  observe_codes(*a.qkv, point_of(lp, point::kQkvProj), h, hooks);
  Matrix qkv = dense_linear(*a.qkv, h, l.index, false);
  if (deviates(DeviationKind::kChannelScaleOff, l.index) && qkv.cols > 3) {
    hit();
    for (int64_t t = 0; t < qkv.rows; ++t)
      qkv(t, 3) *= 1.03;
  }
  if (deviates(DeviationKind::kOutputTileUnwritten, l.index) ||
      deviates(DeviationKind::kOutputTileZero, l.index)) {
    hit();
    const double fill = deviation_.kind == DeviationKind::kOutputTileZero
                            ? 0.0
                            : std::numeric_limits<double>::quiet_NaN();
    for (int64_t t = 0; t < std::min<int64_t>(16, qkv.rows); ++t)
      for (int64_t c = 0; c < std::min<int64_t>(16, qkv.cols); ++c)
        qkv(t, c) = fill;
  }
  store(point_of(lp, point::kAttnQkv), qkv, hooks);
  const int64_t qs = cfg_.q_size(), kvs = cfg_.kv_size(), d = cfg_.head_dim;
  const int64_t qp = cfg_.q_proj_size();
  Matrix q = columns(qkv, 0, qs), k = columns(qkv, qp, kvs), v = columns(qkv, qp + kvs, kvs);
  Matrix gate;
  if (cfg_.attn_output_gate) {  // q_proj's rows per head: [q (d) | gate (d)]
    gate = Matrix(qkv.rows, qs);
    for (int64_t t = 0; t < qkv.rows; ++t)
      for (int64_t hh = 0; hh < cfg_.num_heads; ++hh)
        for (int64_t j = 0; j < d; ++j) {
          q(t, hh * d + j) = qkv(t, 2 * hh * d + j);
          gate(t, hh * d + j) = qkv(t, 2 * hh * d + d + j);
        }
  }
  if (a.q_norm && deviates(DeviationKind::kQkNormSkipped, l.index)) {
    hit();
    store(point_of(lp, point::kAttnQNorm), q, hooks);
    store(point_of(lp, point::kAttnKNorm), k, hooks);
  } else if (a.q_norm) {
    q = rms_norm_heads(q, d, a.q_norm->weight, cfg_.rms_norm_eps);
    store(point_of(lp, point::kAttnQNorm), q, hooks);
    k = rms_norm_heads(k, d, a.k_norm->weight, cfg_.rms_norm_eps);
    store(point_of(lp, point::kAttnKNorm), k, hooks);
  }
  rotate(q, cfg_.num_heads, pos, l.index);
  store(point_of(lp, point::kAttnRopeQ), q, hooks);
  rotate(k, cfg_.num_kv_heads, pos, l.index);
  store(point_of(lp, point::kAttnRopeK), k, hooks);
  if (hooks.on_kv) hooks.on_kv(a.prefix, k, v);
  // Quantize on write, dequantize on read. An unquantized cache holds fp64 in exact mode.
  const bool plain = a.kv->config().scheme.kind == SchemeKind::kKvBf16;
  if (plain && mode_ == PrecisionMode::kExact) {
    append_rows(l.k_cache, k);
    append_rows(l.v_cache, v);
  } else if (deviation_.any() && (!std::all_of(k.data.begin(), k.data.end(), is_finite) ||
                                  !std::all_of(v.data.begin(), v.data.end(), is_finite))) {
    // A candidate's NaN rows (output-tile-unwritten) pass the cache as NaN; the rest round-trip.
    const auto trip = [&](KvWhich w, const Matrix& x) {
      return through_finite_rows(x, x.cols,
                                 [&](const Matrix& r) { return a.kv->round_trip(w, r); });
    };
    const Matrix kc = trip(KvWhich::kKey, k), vc = trip(KvWhich::kValue, v);
    if (!plain && hooks.trace) {
      hooks.trace->record(point_of(lp, point::kAttnKCache), kc);
      hooks.trace->record(point_of(lp, point::kAttnVCache), vc);
    }
    append_rows(l.k_cache, kc);
    append_rows(l.v_cache, vc);
  } else {
    const QuantizedMatrix ks = a.kv->store(KvWhich::kKey, k), vs = a.kv->store(KvWhich::kValue, v);
    // A quantized cache's codes are counted like activation codes: a static (calibrated) scale
    // saturates where the evaluation data leaves the calibrated range.
    if (!plain && hooks.on_activation_codes) {
      hooks.on_activation_codes(point_of(lp, point::kAttnKCache), ks);
      hooks.on_activation_codes(point_of(lp, point::kAttnVCache), vs);
    }
    const Matrix kc = a.kv->read(KvWhich::kKey, ks), vc = a.kv->read(KvWhich::kValue, vs);
    // What a quantized cache holds, dequantized, as attention reads it (rope_k and v are what
    // went in): the cache's own error, where a KV-cache format shows.
    if (!plain && hooks.trace) {
      hooks.trace->record(point_of(lp, point::kAttnKCache), kc);
      hooks.trace->record(point_of(lp, point::kAttnVCache), vc);
    }
    append_rows(l.k_cache, kc);
    append_rows(l.v_cache, vc);
  }
  if (l.k_cache.rows >= 2 && l.k_cache.rows - k.rows <= 1 &&
      deviates(DeviationKind::kKvSlotOffByOne, l.index)) {
    hit();
    std::copy_n(l.k_cache.data.begin(), l.k_cache.cols, l.k_cache.data.begin() + l.k_cache.cols);
    std::copy_n(l.v_cache.data.begin(), l.v_cache.cols, l.v_cache.data.begin() + l.v_cache.cols);
  }
  std::vector<int64_t> kv_pos(static_cast<size_t>(l.k_cache.rows));
  for (size_t i = 0; i < kv_pos.size(); ++i)
    kv_pos[i] = static_cast<int64_t>(i);
  std::vector<int64_t> q_pos = pos.seq;
  if (deviates(DeviationKind::kCausalMaskLeak, l.index)) {
    hit();
    for (int64_t& p : q_pos)
      ++p;
  }
  double scaling = 1.0 / std::sqrt(static_cast<double>(d));
  if (cfg_.hidden % cfg_.num_heads == 0 && cfg_.hidden / cfg_.num_heads != d &&
      deviates(DeviationKind::kAttentionScaleOff, l.index)) {
    hit();
    scaling = 1.0 / std::sqrt(static_cast<double>(cfg_.hidden / cfg_.num_heads));
  }
  const bool plain_attention = cfg_.window_of(l.index) == 0 && a.sinks.empty();
  const bool without_max = deviates(DeviationKind::kSoftmaxWithoutMax, l.index);
  const bool round_probs = deviates(DeviationKind::kProbabilitiesBf16);
  Matrix core;
  if (plain_attention && (without_max || round_probs)) {
    hit();
    core =
        attention_variant(q, l.k_cache, l.v_cache, q_pos, kv_pos, cfg_.num_heads, cfg_.num_kv_heads,
                          d, scaling, without_max, round_probs, stored_arith());
  } else {
    core = causal_attention(q, l.k_cache, l.v_cache, q_pos, kv_pos, cfg_.num_heads,
                            cfg_.num_kv_heads, d, scaling, cfg_.window_of(l.index), a.sinks);
  }
  store(point_of(lp, point::kAttnCore), core, hooks);
  if (cfg_.attn_output_gate) {  // core * sigmoid(gate), sigmoid(x) = 1 / (1 + exp(-x))
    for (size_t i = 0; i < core.data.size(); ++i)
      core.data[i] *= 1.0 / (1.0 + std::exp(-gate.data[i]));
    store(point_of(lp, point::kAttnGated), core, hooks);
  }
  if (hooks.on_linear_input) hooks.on_linear_input(a.prefix + ".o_proj", core);
  observe_codes(*a.o_proj, point_of(lp, point::kOProj), core, hooks);
  Matrix out = dense_linear(*a.o_proj, core, l.index, true);
  store(point_of(lp, point::kAttnOut), out, hooks);
  return out;
}

Matrix CausalLm::moe(const MoeBlock& m, int64_t layer, const Matrix& h, const ForwardHooks& hooks) {
  const std::string lp = layer_prefix(layer);
  if (hooks.on_linear_input) hooks.on_linear_input(m.router->shape().prefix, h);
  Matrix logits = apply_linear(*m.router, h);
  store(point_of(lp, point::kMoeRouterLogits), logits, hooks, true);
  // A candidate's NaN rows (output-tile-unwritten) route as zero logits would, with NaN weights.
  std::vector<int64_t> nan_rows;
  Matrix route_logits = logits;
  for (int64_t t = 0; t < logits.rows; ++t)
    if (!finite_row(logits, t)) {
      nan_rows.push_back(t);
      std::fill_n(route_logits.data.begin() + t * logits.cols, logits.cols, 0.0);
    }
  bool renormalize = cfg_.norm_topk_prob;
  if (renormalize && !cfg_.topk_then_softmax &&
      deviates(DeviationKind::kRouterNotRenormalized, layer)) {
    hit();
    renormalize = false;
  }
  const Routing r = cfg_.topk_then_softmax
                        ? route_topk_softmax(route_logits, cfg_.num_experts_per_tok)
                        : route_topk(route_logits, cfg_.num_experts_per_tok, renormalize);
  const int64_t t_count = h.rows, k = cfg_.num_experts_per_tok;
  Matrix ids(t_count, k), weights(t_count, k);
  for (int64_t t = 0; t < t_count; ++t)
    for (int64_t j = 0; j < k; ++j) {
      ids(t, j) = static_cast<double>(r.ids[static_cast<size_t>(t)][static_cast<size_t>(j)]);
      weights(t, j) = r.weights[static_cast<size_t>(t)][static_cast<size_t>(j)];
    }
  for (int64_t t : nan_rows)
    for (int64_t j = 0; j < k; ++j)
      weights(t, j) = std::numeric_limits<double>::quiet_NaN();
  if (hooks.trace) hooks.trace->record(point_of(lp, point::kMoeTopkIds), ids);
  store(point_of(lp, point::kMoeTopkWeights), weights, hooks, true);
  // Hugging Face's loop: for each expert in ascending id, its tokens' outputs times their routing
  // weight are added into the result (index_add_), so a token's sum runs in expert-id order.
  Matrix out(t_count, cfg_.hidden);
  // Each expert's own output per (token, slot), before the routing weight: what compare aligns
  // by expert id to give a per-expert error.
  const std::string eo_name = point_of(lp, point::kMoeExpertOut);
  const bool want_eo = hooks.trace && hooks.trace->wants(eo_name);
  Matrix expert_out(want_eo ? t_count : 0, want_eo ? k * cfg_.hidden : 0);
  for (int64_t e = 0; e < cfg_.num_experts; ++e) {
    std::vector<int64_t> rows, slots;
    std::vector<double> w;
    for (int64_t t = 0; t < t_count; ++t)
      for (int64_t j = 0; j < k; ++j)
        if (static_cast<int64_t>(ids(t, j)) == e) {
          rows.push_back(t);
          slots.push_back(j);
          w.push_back(weights(t, j));
        }
    if (rows.empty()) continue;
    const Matrix xe = rows_of(h, rows);
    const std::string ep = m.prefix + ".experts." + std::to_string(e);
    if (hooks.on_linear_input) {
      hooks.on_linear_input(ep + ".gate_proj", xe);
      hooks.on_linear_input(ep + ".up_proj", xe);
    }
    observe_codes(*m.w13, point_of(lp, point::kExpertsW13), xe, hooks, e);
    int64_t weights_of = e;  // the expert whose weights run
    if (e == 0 && cfg_.num_experts > 1 && deviates(DeviationKind::kNeighbourExpert, layer)) {
      hit();
      weights_of = 1;
    }
    Matrix gu = apply_linear(*m.w13, xe, weights_of);
    round_stored(gu);
    Matrix act = cfg_.swiglu_limit > 0.0 ? clamped_swiglu(gu, cfg_.swiglu_alpha, cfg_.swiglu_limit)
                                         : silu_and_mul(gu);
    round_stored(act);
    if (hooks.on_linear_input) hooks.on_linear_input(ep + ".down_proj", act);
    observe_codes(*m.w2, point_of(lp, point::kExpertsW2), act, hooks, e);
    Matrix y = apply_linear(*m.w2, act, weights_of);
    round_stored(y);  // the expert's down_proj output is a stored (model-dtype) tensor
    for (size_t i = 0; i < rows.size(); ++i)
      for (int64_t c = 0; c < cfg_.hidden; ++c) {
        out(rows[i], c) += y(static_cast<int64_t>(i), c) * w[i];
        if (want_eo)
          expert_out(rows[i], slots[i] * cfg_.hidden + c) = y(static_cast<int64_t>(i), c);
      }
  }
  if (want_eo) hooks.trace->record(eo_name, expert_out);
  store(point_of(lp, point::kMoeOut), out, hooks);
  return out;
}

Matrix CausalLm::linear_attention(DecoderLayer& l, const Matrix& h, const ForwardHooks& hooks) {
  LinearAttentionBlock& b = *l.linear_attn;
  const GatedDeltaNetParams& p = b.params;
  const std::string lp = layer_prefix(l.index);
  if (hooks.on_linear_input)
    for (const char* name : {".in_proj_qkv", ".in_proj_z", ".in_proj_b", ".in_proj_a"})
      hooks.on_linear_input(b.prefix + name, h);
  Matrix qkvz = b.qkvz->apply(h);
  store(point_of(lp, point::kLinearAttnQkvz), qkvz, hooks);
  Matrix ba = b.ba->apply(h);
  store(point_of(lp, point::kLinearAttnBa), ba, hooks);
  const int64_t c = p.dims.conv_dim(), vd = p.dims.value_dim(), hv = p.dims.num_value_heads;
  Matrix conv = causal_conv_silu(columns(qkvz, 0, c), p, l.gdn_state);
  store(point_of(lp, point::kLinearAttnConv), conv, hooks);
  Matrix beta, g;
  delta_rule_gates(columns(ba, 0, hv), columns(ba, hv, hv), p, beta, g);
  // Engines compute the gates in fp32 (transformers' g, vLLM's fused gating kernel).
  store(point_of(lp, point::kLinearAttnBeta), beta, hooks, true);
  store(point_of(lp, point::kLinearAttnDecay), g, hooks, true);
  const std::string state_name = point_of(lp, point::kLinearAttnState);
  const bool want_states = hooks.trace && hooks.trace->wants(state_name);
  Matrix states;
  Matrix core = gated_delta_rule(conv, beta, g, p, l.gdn_state, mode_ == PrecisionMode::kEmulate,
                                 want_states ? &states : nullptr);
  if (want_states) hooks.trace->record(state_name, states);
  store(point_of(lp, point::kLinearAttnCore), core, hooks);
  Matrix y = gated_rms_norm(core, columns(qkvz, c, vd), p);
  store(point_of(lp, point::kLinearAttnNorm), y, hooks);
  if (hooks.on_linear_input) hooks.on_linear_input(b.prefix + ".out_proj", y);
  Matrix out = b.out_proj->apply(y);
  store(point_of(lp, point::kAttnOut), out, hooks);
  return out;
}

Matrix CausalLm::run_layer(DecoderLayer& l, Matrix x, const Positions& pos,
                           const ForwardHooks& hooks, const Injection* inject) {
  const std::string lp = layer_prefix(l.index);
  Matrix h = norm(x, l.input_norm, l.index);
  store(point_of(lp, point::kInputNorm), h, hooks);
  add_in_place(x, l.linear_attn ? linear_attention(l, h, hooks) : attention(l, h, pos, hooks));
  round_residual(x);
  Matrix h2 = norm(x, l.post_attention_norm);
  store(point_of(lp, point::kPostAttnNorm), h2, hooks);
  Matrix mlp_out;
  if (l.mlp) {
    if (hooks.on_linear_input) {
      hooks.on_linear_input(l.mlp->prefix + ".gate_proj", h2);
      hooks.on_linear_input(l.mlp->prefix + ".up_proj", h2);
    }
    observe_codes(*l.mlp->gate_up, point_of(lp, point::kGateUpProj), h2, hooks);
    Matrix gu = dense_linear(*l.mlp->gate_up, h2, l.index, false);
    store(point_of(lp, point::kMlpGateUp), gu, hooks);
    Matrix act = mlp_activation(gu, l.index);
    store(point_of(lp, point::kMlpAct), act, hooks);
    if (hooks.on_linear_input) hooks.on_linear_input(l.mlp->prefix + ".down_proj", act);
    observe_codes(*l.mlp->down, point_of(lp, point::kDownProj), act, hooks);
    mlp_out = dense_linear(*l.mlp->down, act, l.index, false);
    store(point_of(lp, point::kMlpOut), mlp_out, hooks);
  } else {
    mlp_out = moe(*l.moe, l.index, h2, hooks);
  }
  add_in_place(x, mlp_out);
  if (inject) {  // deepstack: the layer's output is stored, then its image rows take the features
    round_residual(x);
    for (size_t i = 0; i < inject->rows->size(); ++i)
      for (int64_t c = 0; c < x.cols; ++c)
        x((*inject->rows)[i], c) += (*inject->values)(static_cast<int64_t>(i), c);
  }
  store(point_of(lp, point::kResidual), x, hooks, deviates(DeviationKind::kResidualFp32));

  return x;
}

DecoderLayer& CausalLm::layer_at(int64_t layer, const char* where) {
  if (layer < 0 || layer >= static_cast<int64_t>(layers_.size()))
    throw Error(where, "layer " + std::to_string(layer) + " of a model with " +
                           std::to_string(layers_.size()));
  return layers_[static_cast<size_t>(layer)];
}

void CausalLm::stream_layers_from(std::unique_ptr<LayerWeightSource> source) {
  source_ = std::move(source);
  loaded_.assign(layers_.size(), false);
  for (size_t i = 0; i < layers_.size(); ++i)
    release_layer(static_cast<int64_t>(i));
}

void CausalLm::acquire_layer(int64_t layer) {
  DecoderLayer& l = layer_at(layer, "acquire_layer");
  if (!source_ || loaded_[static_cast<size_t>(layer)]) return;
  // Built afresh, with an empty cache: a streaming model runs each sequence through a layer
  // before the next layer (the golden run), so nothing cached survives a release.
  DecoderLayer fresh;
  fresh.index = layer;
  source_->load(fresh);
  l = std::move(fresh);
  loaded_[static_cast<size_t>(layer)] = true;
}

void CausalLm::release_layer(int64_t layer) {
  DecoderLayer& l = layer_at(layer, "release_layer");
  if (!source_) return;
  DecoderLayer empty;
  empty.index = layer;
  l = std::move(empty);
  loaded_[static_cast<size_t>(layer)] = false;
}

void CausalLm::reset_layer_cache(int64_t layer) {
  DecoderLayer& l = layer_at(layer, "reset_layer_cache");
  l.k_cache = l.v_cache = Matrix();
  l.gdn_state = GatedDeltaNetState();
}

Matrix CausalLm::forward_layer(int64_t layer, Matrix x, std::span<const int64_t> positions,
                               const ForwardHooks& hooks) {
  DecoderLayer& l = layer_at(layer, "forward_layer");
  if (x.cols != cfg_.hidden || static_cast<size_t>(x.rows) != positions.size())
    throw Error("forward_layer", "hidden states [" + std::to_string(x.rows) + ", " +
                                     std::to_string(x.cols) + "] for " +
                                     std::to_string(positions.size()) + " positions and hidden " +
                                     std::to_string(cfg_.hidden));
  acquire_layer(layer);
  Positions pos;
  pos.seq.assign(positions.begin(), positions.end());
  pos.rotary = pos.seq;
  return run_layer(l, std::move(x), pos, hooks);
}

Matrix CausalLm::embed_tokens(std::span<const int64_t> tokens, const ForwardHooks& hooks) const {
  if (tokens.empty()) throw Error("tokens", "no tokens to run");
  if (!lm_head_) throw Error("model", "forward before the weights were loaded");
  Matrix x = embed(tokens);
  store(std::string(point::kEmbed), x, hooks);
  return x;
}

Matrix CausalLm::head(const Matrix& x, const ForwardHooks& hooks) const {
  Matrix f = norm(x, final_norm_);
  store(std::string(point::kFinalNorm), f, hooks);
  Matrix logits = apply_linear(*lm_head_, f);
  store(std::string(point::kLogits), logits, hooks, true);
  return logits;
}

Matrix CausalLm::run_layers(Matrix x, const Positions& pos, const ForwardHooks& hooks,
                            std::span<const Injection> injections) {
  if (source_ && cached_ > 0)
    throw Error("forward",
                "a streaming model frees each layer (and its KV cache) after use, so it "
                "cannot continue a cached sequence; load it whole (a larger "
                "--memory-budget) to decode step by step");
  for (DecoderLayer& l : layers_) {
    const bool was_loaded = !source_ || loaded_[static_cast<size_t>(l.index)];
    acquire_layer(l.index);
    const auto k = static_cast<size_t>(l.index);
    x = run_layer(l, std::move(x), pos, hooks, k < injections.size() ? &injections[k] : nullptr);
    if (!was_loaded) release_layer(l.index);
  }
  Matrix logits = head(x, hooks);
  cached_ += static_cast<int64_t>(pos.seq.size());
  return logits;
}

Matrix CausalLm::forward(std::span<const int64_t> tokens, const ForwardHooks& hooks) {
  Matrix x = embed_tokens(tokens, hooks);
  Positions pos;
  for (size_t i = 0; i < tokens.size(); ++i) {
    pos.seq.push_back(cached_ + static_cast<int64_t>(i));
    pos.rotary.push_back(pos.seq.back() + mrope_delta_);  // equal rows: M-RoPE is the 1-D RoPE
  }
  return run_layers(std::move(x), pos, hooks);
}

ImagePrompt CausalLm::prepare_image_prompt(std::span<const int64_t> tokens,
                                           ImageFeatures images) const {
  return reference::prepare_image_prompt(cfg_, static_cast<int64_t>(layers_.size()), tokens,
                                         std::move(images));
}

ImagePrompt prepare_image_prompt(const ModelConfig& cfg, int64_t num_layers,
                                 std::span<const int64_t> tokens, ImageFeatures images) {
  const std::string where = "image prompt";
  if (!cfg.image_text)
    throw Error(where, cfg.arch_name + " takes no images (an image-text checkpoint does)");
  if (cfg.image_token_id < 0 || cfg.vision_start_token_id < 0)
    throw Error(where, "config.json names no image_token_id / vision_start_token_id");
  if (cfg.mrope_section.size() != 3)
    throw Error(where, "config.json's rope_parameters has no mrope_section (t, h, w)");
  if (images.merge <= 0) throw Error(where, "the vision tower's merge size must be positive");
  for (size_t g = 0; g < images.grids.size(); ++g)
    if (images.grids[g].t != 1)
      throw Error(where, "image " + std::to_string(g) +
                             "'s grid has t = " + std::to_string(images.grids[g].t) +
                             " frames: videos (timestamped frames) are not implemented, images "
                             "have t = 1");
  ImagePrompt p;
  p.positions = mrope_positions(tokens, cfg.image_token_id, images.grids, images.merge,
                                cfg.vision_start_token_id);
  for (size_t i = 0; i < tokens.size(); ++i)
    if (tokens[i] == cfg.image_token_id) p.rows.push_back(static_cast<int64_t>(i));
  auto check_features = [&](const Matrix& m, const std::string& name) {
    if (m.rows != static_cast<int64_t>(p.rows.size()) || m.cols != cfg.hidden)
      throw Error(where, name + ": [" + std::to_string(m.rows) + ", " + std::to_string(m.cols) +
                             "] for a prompt of " + std::to_string(p.rows.size()) +
                             " image placeholders and hidden " + std::to_string(cfg.hidden));
    for (double v : m.data)
      if (!std::isfinite(v)) throw Error(where, name + ": NaN or Inf");
  };
  check_features(images.embeds, "image embeddings");
  if (static_cast<int64_t>(images.deepstack.size()) > num_layers)
    throw Error(where, std::to_string(images.deepstack.size()) +
                           " deepstack features for a decoder of " + std::to_string(num_layers) +
                           " layers");
  for (size_t j = 0; j < images.deepstack.size(); ++j)
    check_features(images.deepstack[j], "deepstack feature " + std::to_string(j));
  p.embeds = std::move(images.embeds);
  p.deepstack = std::move(images.deepstack);
  return p;
}

Matrix CausalLm::embed_image_prompt(std::span<const int64_t> tokens, const ImagePrompt& prompt,
                                    const ForwardHooks& hooks) const {
  if (tokens.empty()) throw Error("tokens", "no tokens to run");
  if (!lm_head_) throw Error("model", "forward before the weights were loaded");
  if (prompt.positions.t.size() != tokens.size())
    throw Error("image prompt", "prepared for " + std::to_string(prompt.positions.t.size()) +
                                    " tokens, given " + std::to_string(tokens.size()));
  Matrix x = embed(tokens);
  for (size_t i = 0; i < prompt.rows.size(); ++i)
    std::copy_n(prompt.embeds.data.begin() + static_cast<int64_t>(i) * cfg_.hidden, cfg_.hidden,
                x.data.begin() + prompt.rows[i] * cfg_.hidden);
  store(std::string(point::kEmbed), x, hooks);
  return x;
}

CausalLm::Positions CausalLm::image_prompt_positions(const ImagePrompt& prompt) {
  Positions pos;
  pos.mrope = prompt.positions;
  for (size_t i = 0; i < prompt.positions.t.size(); ++i)
    pos.seq.push_back(static_cast<int64_t>(i));
  return pos;
}

Matrix CausalLm::forward_layer(int64_t layer, Matrix x, const ImagePrompt& prompt,
                               const ForwardHooks& hooks) {
  DecoderLayer& l = layer_at(layer, "forward_layer");
  if (x.cols != cfg_.hidden || static_cast<size_t>(x.rows) != prompt.positions.t.size())
    throw Error("forward_layer", "hidden states [" + std::to_string(x.rows) + ", " +
                                     std::to_string(x.cols) + "] for an image prompt of " +
                                     std::to_string(prompt.positions.t.size()) + " tokens");
  acquire_layer(layer);
  const auto k = static_cast<size_t>(layer);
  const Injection inject{&prompt.rows,
                         k < prompt.deepstack.size() ? &prompt.deepstack[k] : nullptr};
  return run_layer(l, std::move(x), image_prompt_positions(prompt), hooks,
                   inject.values ? &inject : nullptr);
}

Matrix CausalLm::forward_image_prompt(std::span<const int64_t> tokens, const ImageFeatures& images,
                                      const ForwardHooks& hooks) {
  if (cached_ > 0)
    throw Error("image prompt", "images are placed by a prompt's first prefill; " +
                                    std::to_string(cached_) +
                                    " tokens are cached (reset the cache)");
  const ImagePrompt prompt = prepare_image_prompt(tokens, images);
  Matrix x = embed_image_prompt(tokens, prompt, hooks);
  std::vector<Injection> injections;
  for (const Matrix& d : prompt.deepstack)
    injections.push_back({&prompt.rows, &d});
  Matrix logits = run_layers(std::move(x), image_prompt_positions(prompt), hooks, injections);
  mrope_delta_ = prompt.positions.delta;
  return logits;
}

}  // namespace qparity::reference
