// Comparison metrics of the golden layer; definitions and sources are in metrics.h.
#include "golden/metrics.h"

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <iomanip>
#include <iterator>
#include <limits>
#include <map>
#include <optional>
#include <sstream>
#include <string>

#include "core/error.h"

namespace qparity::golden {
namespace {

using LD = long double;

constexpr double kInf = std::numeric_limits<double>::infinity();
constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();
constexpr double kZ95 = 1.96;  // two-sided 95% normal quantile, as the brief and llama.cpp round it

// An accurate sum: terms are added in long double into a block partial, and every kBlock terms
// the partial is folded into a Neumaier-compensated long double total. Within a block the error
// is at most kBlock * 2^-64 relative (far below double rounding); across blocks compensation keeps
// it from growing with the number of blocks, so the result is accurate for any length while the
// per-term cost stays that of a plain long double addition.
class AccurateSum {
 public:
  void add(LD x) {
    part_ += x;
    if (++count_ == kBlock) flush();
  }
  LD value() {
    flush();
    return total_ + comp_;
  }

 private:
  static constexpr int kBlock = 4096;
  void flush() {
    const LD t = total_ + part_;
    if (std::fabs(total_) >= std::fabs(part_)) {
      comp_ += (total_ - t) + part_;
    } else {
      comp_ += (part_ - t) + total_;
    }
    total_ = t;
    part_ = 0;
    count_ = 0;
  }
  LD part_ = 0, total_ = 0, comp_ = 0;
  int count_ = 0;
};

std::string fmt(double x) {
  std::ostringstream os;
  os << std::setprecision(17) << x;
  return os.str();
}

// rows * cols, after checking that neither is negative and the product fits.
int64_t shape_elements(const char* where, int64_t rows, int64_t cols, const char* cols_name) {
  if (rows < 0 || cols < 0) {
    throw Error(where, "negative shape: rows = " + std::to_string(rows) + ", " + cols_name + " = " +
                           std::to_string(cols));
  }
  if (cols != 0 && rows > std::numeric_limits<int64_t>::max() / cols) {
    throw Error(
        where, "shape " + std::to_string(rows) + " x " + std::to_string(cols) + " overflows int64");
  }
  return rows * cols;
}

void check_pair_sizes(const char* where, const char* a_name, size_t a_size, const char* b_name,
                      size_t b_size, int64_t rows, int64_t cols, int64_t expected) {
  if (a_size == static_cast<size_t>(expected) && b_size == static_cast<size_t>(expected)) return;
  throw Error(where, std::string(a_name) + " has " + std::to_string(a_size) + " elements, " +
                         b_name + " has " + std::to_string(b_size) + ", expected " +
                         std::to_string(rows) + " x " + std::to_string(cols) + " = " +
                         std::to_string(expected));
}

// 0/0 -> 0, x/0 -> +inf, else x/y: the zero conventions of rel_l2 and nmse.
LD ratio_or_inf(LD num, LD den) {
  if (den == 0) return num == 0 ? LD{0} : std::numeric_limits<LD>::infinity();
  return num / den;
}

// Mean with value -+ 1.96 * sqrt(var / (n - 1)), var the population variance (two-pass, in
// compensated long double). This is llama.cpp's mean_and_uncertainty widened to 95%.
Interval mean_interval(const std::vector<double>& xs) {
  const size_t n = xs.size();
  if (n == 0) return {kNaN, kNaN, kNaN};
  AccurateSum s;
  for (double x : xs)
    s.add(x);
  const LD mean = s.value() / static_cast<LD>(n);
  const double m = static_cast<double>(mean);
  if (n == 1) return {m, m, m};
  AccurateSum ss;
  for (double x : xs) {
    const LD d = static_cast<LD>(x) - mean;
    ss.add(d * d);
  }
  const LD var = ss.value() / static_cast<LD>(n);
  const double half = kZ95 * static_cast<double>(std::sqrt(var / static_cast<LD>(n - 1)));
  return {m, m - half, m + half};
}

// Type-7 quantile of an already sorted, non-empty, NaN-free vector.
double sorted_percentile(const std::vector<double>& v, double q) {
  const size_t n = v.size();
  if (q <= 0) return v.front();
  if (q >= 1) return v.back();
  const double h = q * static_cast<double>(n - 1);
  const size_t i = static_cast<size_t>(h);
  const double f = h - static_cast<double>(i);
  if (i + 1 >= n || f == 0) return v[i];
  return (1 - f) * v[i] + f * v[i + 1];
}

// One row of logits, reduced: max, log(sum exp(x - max)) and argmax (lowest index on ties).
// Log-probabilities are then (x_i - max) - log_sum, formed in long double by the caller.
struct RowSoftmax {
  double max = 0;
  LD sum = 0;      // sum_j exp(x_j - max), >= 1
  LD log_sum = 0;  // log(sum)
  int64_t argmax = 0;
  LD log_prob(double x) const { return (static_cast<LD>(x) - max) - log_sum; }
};

// Whether every logit of a row is finite (a row that is not is scored as infinitely wrong).
bool row_finite(const double* x, int64_t vocab) {
  for (int64_t j = 0; j < vocab; ++j)
    if (!std::isfinite(x[j])) return false;
  return true;
}

// A row of finite logits; `exps`, when given, receives exp(x_j - max) for every j.
RowSoftmax row_softmax(const double* x, int64_t vocab, double* exps) {
  RowSoftmax out;
  out.max = x[0];
  for (int64_t j = 0; j < vocab; ++j) {
    if (x[j] > out.max) {
      out.max = x[j];
      out.argmax = j;
    }
  }
  AccurateSum s;
  for (int64_t j = 0; j < vocab; ++j) {
    const double e = std::exp(x[j] - out.max);
    if (exps != nullptr) exps[j] = e;
    s.add(e);
  }
  out.sum = s.value();
  out.log_sum = std::log(out.sum);
  return out;
}

void check_logits_shape(const char* where, int64_t rows, int64_t vocab, size_t targets_size) {
  if (rows > 0 && vocab < 1) {
    throw Error(where, "vocab must be >= 1, got " + std::to_string(vocab));
  }
  if (targets_size != static_cast<size_t>(rows)) {
    throw Error(where, "targets has " + std::to_string(targets_size) +
                           " entries, expected rows = " + std::to_string(rows));
  }
}

void check_target(const char* where, int64_t row, int64_t target, int64_t vocab) {
  if (target == -1) return;
  if (target < 0 || target >= vocab) {
    throw Error(where, "targets[" + std::to_string(row) + "] = " + std::to_string(target) +
                           " is outside [0, " + std::to_string(vocab) + ") (use -1 for none)");
  }
}

// An expert id as int64, or nothing when the stored double is not an integer that fits (NaN,
// Inf, 3.5): such an id never matches anything, so its token counts as a routing flip.
std::optional<int64_t> router_id(double x) {
  // 2^63 as a double; anything at or beyond it does not fit int64.
  constexpr double kLimit = 9223372036854775808.0;
  if (!std::isfinite(x) || std::trunc(x) != x || x >= kLimit || x < -kLimit) return std::nullopt;
  return static_cast<int64_t>(x);
}

}  // namespace

PointStats compare_point(std::span<const double> golden, std::span<const double> candidate,
                         int64_t rows, int64_t cols, bool integer_codes) {
  constexpr const char* kWhere = "compare_point";
  const int64_t n = shape_elements(kWhere, rows, cols, "cols");
  check_pair_sizes(kWhere, "golden", golden.size(), "candidate", candidate.size(), rows, cols, n);

  PointStats st;
  st.count = n;
  st.integer_codes = integer_codes;
  st.row_rel_l2.resize(static_cast<size_t>(rows));
  // Per column (channel): plain long-double sums; a column has `rows` terms, few enough.
  std::vector<LD> col_g2(static_cast<size_t>(cols), 0), col_d2(static_cast<size_t>(cols), 0);
  // Columns holding an element that is non-finite on one side only (an infinite error).
  std::vector<bool> col_broken(static_cast<size_t>(cols), false);

  AccurateSum g2, c2, d2, cg;  // over all compared elements
  for (int64_t r = 0; r < rows; ++r) {
    AccurateSum rg2, rc2, rd2, rcg;  // this row; folded into the totals after the row
    bool row_broken = false;
    for (int64_t j = 0; j < cols; ++j) {
      const int64_t i = r * cols + j;
      const double g = golden[static_cast<size_t>(i)];
      const double c = candidate[static_cast<size_t>(i)];
      if (integer_codes && !(c == g)) ++st.mismatches;
      const bool g_finite = std::isfinite(g);
      const bool c_finite = std::isfinite(c);
      if (!g_finite || !c_finite) {
        if (!g_finite) ++(std::isnan(g) ? st.nan_golden : st.inf_golden);
        if (!c_finite) ++(std::isnan(c) ? st.nan_candidate : st.inf_candidate);
        if (st.first_nonfinite < 0) st.first_nonfinite = i;
        // Both NaN, or the same infinity, is no difference; anything else is an infinite one.
        if (!((std::isnan(g) && std::isnan(c)) || g == c)) {
          if (st.nonfinite_mismatches++ == 0) st.worst_index = i;
          row_broken = true;
          col_broken[static_cast<size_t>(j)] = true;
        }
        continue;
      }
      // c - g in long double: exact whenever the exponents are within 11 of each other.
      const LD d = static_cast<LD>(c) - static_cast<LD>(g);
      const double ad = static_cast<double>(std::fabs(d));
      if (ad > st.max_abs && st.nonfinite_mismatches == 0) {
        st.max_abs = ad;
        st.worst_index = i;
      }
      if (g != 0) {
        st.max_rel = std::max(st.max_rel, static_cast<double>(std::fabs(d) / std::fabs(LD{g})));
      } else if (c != 0) {
        ++st.rel_undefined;
      }
      const LD gl = g, cl = c;  // squares in long double cannot overflow
      rg2.add(gl * gl);
      rc2.add(cl * cl);
      rd2.add(d * d);
      rcg.add(cl * gl);
      col_g2[static_cast<size_t>(j)] += gl * gl;
      col_d2[static_cast<size_t>(j)] += d * d;
    }
    const LD row_g2 = rg2.value(), row_d2 = rd2.value();
    st.row_rel_l2[static_cast<size_t>(r)] =
        row_broken ? kInf : static_cast<double>(std::sqrt(ratio_or_inf(row_d2, row_g2)));
    g2.add(row_g2);
    c2.add(rc2.value());
    d2.add(row_d2);
    cg.add(rcg.value());
  }

  if (!st.row_rel_l2.empty()) {
    std::vector<double> rows_sorted = st.row_rel_l2;
    const auto mid =
        rows_sorted.begin() + static_cast<std::ptrdiff_t>((rows_sorted.size() - 1) / 2);
    std::nth_element(rows_sorted.begin(), mid, rows_sorted.end());
    st.median_row_rel_l2 = *mid;
  }

  st.col_rel_l2.resize(static_cast<size_t>(cols));
  for (int64_t j = 0; j < cols; ++j) {
    const double v = col_broken[static_cast<size_t>(j)]
                         ? kInf
                         : static_cast<double>(std::sqrt(ratio_or_inf(
                               col_d2[static_cast<size_t>(j)], col_g2[static_cast<size_t>(j)])));
    st.col_rel_l2[static_cast<size_t>(j)] = v;
    if (st.worst_col < 0 || v > st.max_col_rel_l2) {
      st.max_col_rel_l2 = v;
      st.worst_col = j;
    }
  }

  const LD sg2 = g2.value(), sc2 = c2.value(), sd2 = d2.value(), scg = cg.value();
  const LD nmse = ratio_or_inf(sd2, sg2);  // sqrt(+inf) = +inf keeps the convention
  st.nmse = static_cast<double>(nmse);
  st.rel_l2 = static_cast<double>(std::sqrt(nmse));
  if (sg2 == 0 && sc2 == 0) {
    st.cosine = 1;
  } else if (sg2 == 0 || sc2 == 0) {
    st.cosine = 0;
  } else {
    st.cosine = std::clamp(static_cast<double>(scg / std::sqrt(sc2 * sg2)), -1.0, 1.0);
  }
  const LD energy = sc2 + sg2;
  st.deepgemm_diff = energy == 0 ? 0.0 : static_cast<double>(1 - 2 * scg / energy);
  if (sd2 == 0) {
    st.sqnr_db = kInf;
  } else if (sg2 == 0) {
    st.sqnr_db = -kInf;
  } else {
    st.sqnr_db = static_cast<double>(10 * std::log10(sg2 / sd2));
  }
  if (st.nonfinite_mismatches > 0) {
    // A value that is finite on one side only is an unbounded error: no norm may hide it.
    st.max_abs = st.max_rel = st.rel_l2 = st.nmse = kInf;
    st.sqnr_db = -kInf;
    st.cosine = st.deepgemm_diff = kNaN;
  }
  return st;
}

EndToEnd compare_logits(std::span<const double> golden_logits,
                        std::span<const double> candidate_logits, int64_t rows, int64_t vocab,
                        std::span<const int64_t> targets) {
  constexpr const char* kWhere = "compare_logits";
  const int64_t n = shape_elements(kWhere, rows, vocab, "vocab");
  check_pair_sizes(kWhere, "golden logits", golden_logits.size(), "candidate logits",
                   candidate_logits.size(), rows, vocab, n);
  check_logits_shape(kWhere, rows, vocab, targets.size());
  for (int64_t r = 0; r < rows; ++r) {
    check_target(kWhere, r, targets[static_cast<size_t>(r)], vocab);
  }

  EndToEnd out;
  out.positions = rows;
  out.kld.resize(static_cast<size_t>(rows));
  std::vector<double> exps_g(static_cast<size_t>(vocab));
  std::vector<double> dnll;  // nll_c - nll_g per scored row
  AccurateSum nll_g_sum, nll_c_sum, dp2_sum;
  int64_t agree = 0;

  for (int64_t r = 0; r < rows; ++r) {
    const double* g = golden_logits.data() + r * vocab;
    const double* c = candidate_logits.data() + r * vocab;
    const int64_t t = targets[static_cast<size_t>(r)];
    const bool g_ok = row_finite(g, vocab), c_ok = row_finite(c, vocab);
    if (!g_ok || !c_ok) {
      // A non-finite logit on either side: the row is infinitely wrong (KLD +inf, no top-1
      // agreement, the target's probability off by the most it can be), never left out.
      if (!g_ok) ++out.nonfinite_golden_rows;
      if (!c_ok) ++out.nonfinite_candidate_rows;
      if (out.first_nonfinite_row < 0) out.first_nonfinite_row = r;
      out.kld[static_cast<size_t>(r)] = kInf;
      if (out.first_greedy_divergence < 0) out.first_greedy_divergence = r;
      if (t >= 0) {
        const LD nll_g = g_ok ? -row_softmax(g, vocab, nullptr).log_prob(g[t]) : LD{kNaN};
        const LD nll_c = c_ok ? -row_softmax(c, vocab, nullptr).log_prob(c[t]) : LD{kInf};
        nll_g_sum.add(nll_g);
        nll_c_sum.add(nll_c);
        dnll.push_back(kInf);
        dp2_sum.add(1);
      }
      continue;
    }
    const RowSoftmax sg = row_softmax(g, vocab, exps_g.data());
    const RowSoftmax sc = row_softmax(c, vocab, nullptr);

    // KL(P || Q) = sum_i P_i (log P_i - log Q_i); every term kept (P_i == 0 terms add 0).
    // With P_i = e_i / S_g (e_i = exp(g_i - max g)) and log P_i - log Q_i = ((g_i - max g) -
    // (c_i - max c)) - (log S_g - log S_c), this is (1/S_g) sum_i e_i (...): one division per
    // row, the max-subtracted logits keep a constant offset from costing precision, and
    // identical rows give exactly 0.
    AccurateSum kl;
    const LD dlog_sum = sg.log_sum - sc.log_sum;
    for (int64_t j = 0; j < vocab; ++j) {
      const LD dlogit = (static_cast<LD>(g[j]) - sg.max) - (static_cast<LD>(c[j]) - sc.max);
      kl.add(exps_g[static_cast<size_t>(j)] * (dlogit - dlog_sum));
    }
    out.kld[static_cast<size_t>(r)] = static_cast<double>(kl.value() / sg.sum);

    if (sg.argmax == sc.argmax) {
      ++agree;
    } else if (out.first_greedy_divergence < 0) {
      out.first_greedy_divergence = r;
    }

    if (t < 0) continue;
    const LD nll_g = -sg.log_prob(g[t]);
    const LD nll_c = -sc.log_prob(c[t]);
    nll_g_sum.add(nll_g);
    nll_c_sum.add(nll_c);
    dnll.push_back(static_cast<double>(nll_c - nll_g));
    const LD dp = std::exp(-nll_c) - std::exp(-nll_g);
    dp2_sum.add(dp * dp);
  }

  out.top1 = wilson_interval(agree, rows);
  if (rows > 0) {
    out.kld_mean = mean_interval(out.kld);
    std::vector<double> sorted = out.kld;
    std::sort(sorted.begin(), sorted.end());
    out.kld_median = sorted_percentile(sorted, 0.5);
    out.kld_p90 = sorted_percentile(sorted, 0.90);
    out.kld_p99 = sorted_percentile(sorted, 0.99);
    out.kld_p999 = sorted_percentile(sorted, 0.999);
    out.kld_max = sorted.back();
  } else {
    out.kld_mean = {kNaN, kNaN, kNaN};
    out.kld_median = out.kld_p90 = out.kld_p99 = out.kld_p999 = out.kld_max = kNaN;
  }

  out.scored = static_cast<int64_t>(dnll.size());
  if (out.scored > 0) {
    const LD ns = static_cast<LD>(out.scored);
    out.dp_rms = static_cast<double>(std::sqrt(dp2_sum.value() / ns));
    out.dln_ppl = mean_interval(dnll);
    out.ppl_ratio = {std::exp(out.dln_ppl.value), std::exp(out.dln_ppl.lo),
                     std::exp(out.dln_ppl.hi)};
    out.ppl_golden = static_cast<double>(std::exp(nll_g_sum.value() / ns));
    out.ppl_candidate = static_cast<double>(std::exp(nll_c_sum.value() / ns));
  } else {
    out.dp_rms = out.ppl_golden = out.ppl_candidate = kNaN;
    out.dln_ppl = out.ppl_ratio = {kNaN, kNaN, kNaN};
  }
  if (out.nonfinite_golden_rows + out.nonfinite_candidate_rows > 0) {
    // inf - inf in the variance would make the bounds NaN; an infinite error has infinite bounds.
    out.kld_mean = {kInf, kInf, kInf};
    if (out.scored > 0) out.dln_ppl = out.ppl_ratio = {kInf, kInf, kInf};
  }
  return out;
}

std::vector<double> target_nll(std::span<const double> logits, int64_t rows, int64_t vocab,
                               std::span<const int64_t> targets) {
  constexpr const char* kWhere = "target_nll";
  const int64_t n = shape_elements(kWhere, rows, vocab, "vocab");
  if (logits.size() != static_cast<size_t>(n)) {
    throw Error(kWhere, "logits has " + std::to_string(logits.size()) + " elements, expected " +
                            std::to_string(rows) + " x " + std::to_string(vocab) + " = " +
                            std::to_string(n));
  }
  check_logits_shape(kWhere, rows, vocab, targets.size());
  for (int64_t r = 0; r < rows; ++r) {
    check_target(kWhere, r, targets[static_cast<size_t>(r)], vocab);
  }

  std::vector<double> nll(static_cast<size_t>(rows), kNaN);
  for (int64_t r = 0; r < rows; ++r) {
    const double* x = logits.data() + r * vocab;
    const int64_t t = targets[static_cast<size_t>(r)];
    if (t < 0 || !row_finite(x, vocab)) continue;  // NaN: no target, or no distribution
    nll[static_cast<size_t>(r)] =
        static_cast<double>(-row_softmax(x, vocab, nullptr).log_prob(x[t]));
  }
  return nll;
}

RouterFlips compare_router(std::span<const double> golden_ids,
                           std::span<const double> candidate_ids, int64_t tokens, int64_t k) {
  constexpr const char* kWhere = "compare_router";
  const int64_t n = shape_elements(kWhere, tokens, k, "k");
  check_pair_sizes(kWhere, "golden ids", golden_ids.size(), "candidate ids", candidate_ids.size(),
                   tokens, k, n);

  RouterFlips out;
  out.tokens = tokens;
  std::vector<int64_t> g, c;
  for (int64_t t = 0; t < tokens; ++t) {
    g.clear();
    c.clear();
    int64_t invalid = 0;
    for (int64_t s = 0; s < k; ++s) {
      const size_t i = static_cast<size_t>(t * k + s);
      const auto gid = router_id(golden_ids[i]), cid = router_id(candidate_ids[i]);
      if (gid) g.push_back(*gid);
      if (cid) c.push_back(*cid);
      invalid += !gid + !cid;
    }
    out.invalid_ids += invalid;
    std::sort(g.begin(), g.end());
    std::sort(c.begin(), c.end());
    std::vector<int64_t> missing;
    std::set_difference(g.begin(), g.end(), c.begin(), c.end(), std::back_inserter(missing));
    // A golden slot without a valid id matches nothing in the candidate either.
    out.changed_ids += static_cast<int64_t>(missing.size()) + (k - static_cast<int64_t>(g.size()));
    if (invalid > 0 || g != c) {
      ++out.flipped;
      if (out.first_flip < 0) out.first_flip = t;
    }
  }
  out.flip_rate =
      tokens > 0 ? static_cast<double>(out.flipped) / static_cast<double>(tokens) : kNaN;
  return out;
}

ExpertAlignment align_expert_outputs(std::span<const double> golden_out,
                                     std::span<const double> candidate_out,
                                     std::span<const double> golden_ids,
                                     std::span<const double> candidate_ids, int64_t tokens,
                                     int64_t k, int64_t width) {
  constexpr const char* kWhere = "align_expert_outputs";
  const int64_t n_ids = shape_elements(kWhere, tokens, k, "k");
  check_pair_sizes(kWhere, "golden ids", golden_ids.size(), "candidate ids", candidate_ids.size(),
                   tokens, k, n_ids);
  if (width < 0) throw Error(kWhere, "width " + std::to_string(width) + " < 0");
  const int64_t row = k * width;
  const int64_t n = shape_elements(kWhere, tokens, row, "k * width");
  check_pair_sizes(kWhere, "golden outputs", golden_out.size(), "candidate outputs",
                   candidate_out.size(), tokens, row, n);
  ExpertAlignment a;
  a.golden.assign(static_cast<size_t>(n), 0.0);
  a.candidate.assign(static_cast<size_t>(n), 0.0);
  struct Acc {
    long double err = 0, ref = 0;
    double max_abs = 0;
    int64_t pairs = 0;
  };
  std::map<int64_t, Acc> acc;
  std::vector<std::optional<int64_t>> g(static_cast<size_t>(k)), c(static_cast<size_t>(k));
  std::vector<bool> used(static_cast<size_t>(k));
  for (int64_t t = 0; t < tokens; ++t) {
    for (int64_t s = 0; s < k; ++s) {
      const size_t i = static_cast<size_t>(t * k + s);
      g[static_cast<size_t>(s)] = router_id(golden_ids[i]);
      c[static_cast<size_t>(s)] = router_id(candidate_ids[i]);
    }
    std::fill(used.begin(), used.end(), false);
    for (int64_t s = 0; s < k; ++s) {
      int64_t match = -1;
      const std::optional<int64_t>& want = g[static_cast<size_t>(s)];
      for (int64_t u = 0; u < k && match < 0 && want; ++u)
        if (!used[static_cast<size_t>(u)] && c[static_cast<size_t>(u)] == want) match = u;
      if (match < 0) {
        ++a.unmatched;
        continue;
      }
      used[static_cast<size_t>(match)] = true;
      ++a.matched;
      Acc& e = acc[*want];
      ++e.pairs;
      const size_t dst = static_cast<size_t>(t * row + s * width);
      const size_t src = static_cast<size_t>(t * row + match * width);
      for (int64_t j = 0; j < width; ++j) {
        const double x = golden_out[dst + static_cast<size_t>(j)];
        const double y = candidate_out[src + static_cast<size_t>(j)];
        a.golden[dst + static_cast<size_t>(j)] = x;
        a.candidate[dst + static_cast<size_t>(j)] = y;
        const long double d = static_cast<long double>(y) - x;
        e.err += d * d;
        e.ref += static_cast<long double>(x) * x;
        // A NaN stays NaN in max_abs (compare_point counts non-finite values per point).
        const double ad = std::fabs(y - x);
        e.max_abs = std::isnan(ad) || std::isnan(e.max_abs) ? kNaN : std::max(e.max_abs, ad);
      }
    }
  }
  for (const auto& [id, e] : acc)
    a.experts.push_back(
        {id, e.pairs, e.ref > 0 ? static_cast<double>(std::sqrt(e.err / e.ref)) : kNaN, e.max_abs});
  return a;
}

double percentile(std::vector<double> v, double q) {
  constexpr const char* kWhere = "percentile";
  if (v.empty()) throw Error(kWhere, "no values");
  if (!(q >= 0 && q <= 1)) throw Error(kWhere, "q = " + fmt(q) + " is outside [0, 1]");
  for (size_t i = 0; i < v.size(); ++i) {
    if (std::isnan(v[i])) throw Error(kWhere, "value " + std::to_string(i) + " is NaN");
  }
  std::sort(v.begin(), v.end());
  return sorted_percentile(v, q);
}

Interval wilson_interval(int64_t successes, int64_t n) {
  if (n < 0 || successes < 0 || successes > n) {
    throw Error("wilson_interval", "need 0 <= successes <= n, got " + std::to_string(successes) +
                                       " of " + std::to_string(n));
  }
  if (n == 0) return {kNaN, 0.0, 1.0};
  const double nn = static_cast<double>(n);
  const double p = static_cast<double>(successes) / nn;
  const double z2 = kZ95 * kZ95;
  const double denom = 1 + z2 / nn;
  const double center = (p + z2 / (2 * nn)) / denom;
  const double half = kZ95 * std::sqrt(p * (1 - p) / nn + z2 / (4 * nn * nn)) / denom;
  return {p, std::max(0.0, center - half), std::min(1.0, center + half)};
}

}  // namespace qparity::golden
