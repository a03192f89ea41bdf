#pragma once
// Comparison metrics of the golden layer: a candidate tensor against its golden (reference)
// tensor, full logits against full logits, and MoE router top-k ids against router top-k ids.
//
// Arithmetic. Inputs are fp64. Every sum (squares, products, exp-sums of the log-sum-exp, KL
// terms, means, variances) is accumulated in long double (x86-64: 80-bit extended, 64-bit
// significand): blocks of 4096 terms are summed plainly and the block sums are combined with
// Neumaier compensation, so accuracy does not degrade with tensor size, and squares of values
// near the double range do not overflow. Results are rounded to double once, at the end.
// Single-threaded; about 10 ns per element for compare_point and 20 ns per logit for
// compare_logits on the development machine.
//
// ---- Per capture point (compare_point) -------------------------------------------------------
// g = golden, c = candidate, d = c - g, all flat over the [rows, cols] row-major tensor. Sums run
// over the "compared" elements: those where BOTH g and c are finite. Non-finite elements are
// counted (nan_*/inf_*, first_nonfinite). One that is non-finite on one side only, or NaN against
// Inf, or +Inf against -Inf, is an unbounded error (nonfinite_mismatches): then max_abs, max_rel,
// rel_l2 and nmse are +inf, sqnr_db -inf, cosine and deepgemm_diff NaN, the rows and columns that
// hold one have row/col rel_l2 +inf, and worst_index is the first such element, so that no norm
// reports a broken tensor as close. Both NaN, or the same infinity on both sides, adds no error
// (it is still counted, and a judge fails any non-finite value).
//   max_abs        max |d|;  worst_index = flat index of the first element attaining it (-1 when
//                  no element differs, i.e. max_abs == 0).
//   max_rel        max |d| / |g| over compared elements with g != 0; compared elements with
//                  g == 0 and c != 0 are counted in rel_undefined instead (g == c == 0 adds 0).
//   rel_l2         ||d||_2 / ||g||_2; 0 when both norms are 0; +inf when ||g|| == 0 < ||d||.
//   nmse           ||d||^2 / ||g||^2 (= rel_l2^2, computed from the sums; same conventions).
//   cosine         <c,g> / (||c|| ||g||), clamped to [-1, 1]; 1 when c and g are both all-zero,
//                  0 when exactly one is.
//   deepgemm_diff  1 - 2 <c,g> / (||c||^2 + ||g||^2); 0 when both all-zero. This is DeepGEMM's
//                  calc_diff (deep_gemm/testing/numeric.py, formerly deep_gemm/utils.py), which
//                  SGLang's FP8 GEMM tests use; 0 = identical, 1 = orthogonal, 2 = c == -g.
//   sqnr_db        10 log10(||g||^2 / ||d||^2); +inf when ||d|| == 0 (identical, including
//                  both all-zero); -inf when ||g|| == 0 < ||d||.
//   row_rel_l2[r]  ||d_r|| / ||g_r|| over row r's compared elements, same zero conventions.
//   median_row_rel_l2  the lower median of row_rel_l2 (the ceil(rows/2)-th smallest; 0 with no
//                  rows): at least half the rows (tokens) are at or below it. An error confined
//                  to a few rows (one flipped intermediate feeding a dominant token) leaves it
//                  small; one spread over every row (a wrong rounding mode, a shifted tensor)
//                  does not.
//   col_rel_l2[j]  the same over column j (a channel across all tokens); max_col_rel_l2 is its
//                  largest value (NaN-free: non-compared elements are skipped), worst_col where.
//   mismatches     integer_codes only: count of elements with !(c == g), over ALL elements (a NaN
//                  in either counts as a mismatch); exact compare is the point for integer codes.
//                  The float metrics are computed for integer codes as well.
//
// ---- End to end, from full logits (compare_logits) -------------------------------------------
// Per row r: log p(i) = (x_i - max x) - log(sum_j exp(x_j - max x)) (max-subtracted, the sum in
// compensated long double). P = golden softmax, Q = candidate softmax.
//   kld[r]         KL(P || Q) = sum_i P_i (log P_i - log Q_i), no truncation of small P_i
//   (llama.cpp
//                  skips terms with log P_i <= -16 because its base file stores 16-bit log-probs;
//                  we have the full logits). Reported as computed: rounding can leave values of
//                  order -1e-16 when P == Q up to rounding.
//   kld_mean       mean of kld[r] with a 95% interval value -+ 1.96 * s, s = sqrt(var/(n-1)),
//                  var = (1/n) sum (k_r - mean)^2. That s is llama.cpp's uncertainty of a mean
//                  (perplexity.cpp, kl_divergence(): lambda mean_and_uncertainty, which prints
//                  1 s and reports 0 for n <= 10; we widen to 1.96 s and compute it for n >= 2;
//                  n == 1: lo = hi = value). The variance is two-pass, not sum2/n - mean^2.
//   kld_median, kld_p90, kld_p99, kld_p999, kld_max: percentile() below over kld[] (its median
//                  equals llama.cpp's explicit median: middle value, mean of the two middle values
//                  for even n); kld_max = largest kld.
//   top1           fraction of rows whose argmax agrees (argmax: lowest index on ties; llama.cpp
//                  "Same top p", which takes the first maximum too), with the Wilson score 95%
//                  interval (z = 1.96) instead of llama.cpp's +-sqrt(p(1-p)/(n-1)), which
//                  collapses at p = 1.
//   Scored rows are those with targets[r] >= 0 (the token that follows row r).
//   nll_g, nll_c   -log P(target), -log Q(target).
//   dp_rms         sqrt(mean over scored (Q(target) - P(target))^2), a fraction (llama.cpp prints
//                  100x as "RMS Δp": p_diff = p - p_base, candidate minus base).
//   dln_ppl        mean over scored of (nll_c - nll_g) = ln(PPL_c / PPL_g), interval -+ 1.96 * s of
//                  the paired differences (same s as kld_mean). llama.cpp's "Mean ln(PPL(Q)/
//                  PPL(base))" uncertainty sqrt(s_q^2 + s_b^2 - 2 cov) is that same s.
//   ppl_ratio      exp(dln_ppl) with exp'd bounds ("Mean PPL(Q)/PPL(base)").
//   ppl_golden, ppl_candidate  exp(mean nll) ("Mean PPL(base)", "Mean PPL(Q)").
//   first_greedy_divergence    first row whose argmax differs, -1 none.
// Non-finite logits: a row with a NaN/Inf logit on either side is counted (nonfinite_golden_rows,
// nonfinite_candidate_rows, first_nonfinite_row) and scored as infinitely wrong, never skipped:
// kld[r] = +inf, no top-1 agreement (and a greedy divergence), and for a scored row
// nll_c - nll_g = +inf and |dp| = 1. kld_mean (and, with a scored row, dln_ppl and ppl_ratio) is
// then {+inf, +inf, +inf}.
// No data: with rows == 0 the KLD and top1 fields are NaN (top1 interval [0, 1]); with no scored
// row dp_rms, dln_ppl, ppl_ratio, ppl_golden and ppl_candidate are NaN. Unlike llama.cpp
// (which prints no statistics below 100 positions) every statistic is returned; judging how many
// positions are enough is the caller's job.
//
// ---- Router (compare_router) ----------------------------------------------------------------
// A token flips when its top-k ids, compared as sorted lists (i.e. as sets; a multiset if a row
// repeats an id, e.g. -1 padding), differ between golden and candidate. flip_rate = flipped /
// tokens (NaN when tokens == 0). changed_ids counts, over all tokens, the golden ids missing from
// the candidate's multiset: a router id point's "mismatches" (slot order is free). An id that is
// not an integer-valued double (NaN, Inf, 3.5) matches nothing: its token is flipped, and it is
// counted in invalid_ids.
//
// Errors (qparity::Error, where = the function name): sizes that do not match rows x cols
// (message names both sizes and the shape), negative shapes, targets outside [0, vocab) other
// than -1, percentile of an empty vector or NaN values, q outside [0, 1]. Non-finite data is
// never an error here: it is measured (above), and the judge (policy.h) fails it.
#include <cstdint>
#include <span>
#include <vector>

namespace qparity::golden {

// Per capture point: golden g and candidate c, both row-major [rows, cols] (rows = tokens).
struct PointStats {
  int64_t count = 0;          // elements (rows * cols), compared or not
  double max_abs = 0;         // max |c - g|
  double max_rel = 0;         // max |c - g| / |g| over elements with g != 0
  int64_t rel_undefined = 0;  // elements with g == 0 and c != 0
  double rel_l2 = 0;          // ||c - g||_2 / ||g||_2  (0 if both zero; +inf if g zero, c not)
  double nmse = 0;            // rel_l2^2
  double cosine = 1;          // <c,g> / (||c|| ||g||); 1 when both all-zero, 0 when one is
  double deepgemm_diff = 0;   // 1 - 2*sum(c*g) / sum(c^2 + g^2); 0 when both all-zero
  double sqnr_db = 0;         // 10*log10(sum g^2 / sum (c-g)^2); +inf when identical
  int64_t nan_golden = 0, inf_golden = 0, nan_candidate = 0, inf_candidate = 0;
  int64_t first_nonfinite = -1;      // flat index of the first non-finite element in either
  int64_t nonfinite_mismatches = 0;  // elements non-finite on one side only (or NaN vs Inf)
  int64_t worst_index = -1;          // flat index of max_abs (first on ties; -1 when no diff)
  std::vector<double> row_rel_l2;    // per row: ||c_r - g_r|| / ||g_r|| (same zero conventions)
  double median_row_rel_l2 = 0;      // lower median of row_rel_l2: what most tokens see
  // Per column (channel) over all rows, same conventions: a fault confined to one channel (a
  // wrong per-channel scale) is diluted in rel_l2 by the other channels, not here.
  std::vector<double> col_rel_l2;
  double max_col_rel_l2 = 0;
  int64_t worst_col = -1;  // first column attaining max_col_rel_l2 (-1 when cols == 0)
  bool integer_codes = false;
  int64_t mismatches = 0;  // integer_codes only: count of !(c == g)
};

PointStats compare_point(std::span<const double> golden, std::span<const double> candidate,
                         int64_t rows, int64_t cols, bool integer_codes = false);

struct Interval {
  double value = 0, lo = 0, hi = 0;  // estimate and 95% bounds
};

struct EndToEnd {
  int64_t positions = 0;  // rows compared
  int64_t scored = 0;     // rows with a target token (for NLL / PPL / dp)
  Interval kld_mean;      // mean KL(P_golden || P_candidate), -+ 1.96 * sd / sqrt(n-1)
  double kld_median = 0, kld_p90 = 0, kld_p99 = 0, kld_p999 = 0, kld_max = 0;
  Interval top1;       // fraction of rows whose argmax agrees, Wilson score 95% interval
  double dp_rms = 0;   // RMS over scored of p_cand(target) - p_gold(target), a fraction
  Interval dln_ppl;    // mean over scored of (nll_cand - nll_gold), -+ 1.96 * sd / sqrt(n-1)
  Interval ppl_ratio;  // exp(dln_ppl) with exp'd bounds
  double ppl_golden = 0, ppl_candidate = 0;  // exp(mean nll)
  int64_t first_greedy_divergence = -1;      // first row whose argmax differs
  int64_t nonfinite_golden_rows = 0, nonfinite_candidate_rows = 0;  // rows with a NaN/Inf logit
  int64_t first_nonfinite_row = -1;
  std::vector<double> kld;  // per position (for histograms)
};

// logits row-major [rows, vocab]; targets[r] is the token that follows position r, or -1 when
// none (last token of a sequence).
EndToEnd compare_logits(std::span<const double> golden_logits,
                        std::span<const double> candidate_logits, int64_t rows, int64_t vocab,
                        std::span<const int64_t> targets);

// NLL of the targets alone (golden files store these): nll[r] =
// -log_softmax(logits[r])[targets[r]], NaN where targets[r] == -1 or the row has a NaN/Inf logit.
std::vector<double> target_nll(std::span<const double> logits, int64_t rows, int64_t vocab,
                               std::span<const int64_t> targets);

struct RouterFlips {
  int64_t tokens = 0;
  int64_t flipped = 0;   // tokens whose SET of top-k expert ids differs
  double flip_rate = 0;  // flipped / tokens
  int64_t first_flip = -1;
  int64_t changed_ids = 0;  // golden (token, slot) ids the candidate's set for that token lacks
  int64_t invalid_ids = 0;  // ids on either side that are not integers (NaN, Inf, fractions)
};

// topk ids [tokens, k] as doubles holding integers (that is how capture points store them).
RouterFlips compare_router(std::span<const double> golden_ids,
                           std::span<const double> candidate_ids, int64_t tokens, int64_t k);

// ---- MoE expert outputs (align_expert_outputs) ------------------------------------------------
// `layers.i.moe.expert_out` holds, per token, the k routed experts' outputs before the routing
// weight, [tokens, k * width], slot s in the order of that token's topk_ids. Golden and candidate
// may list the same experts in another slot order, and may route a token to other experts. The
// alignment moves each candidate slot to the golden slot of the same expert; slots whose expert
// the other side did not choose are zeroed on BOTH sides (a routing flip is the router's error,
// reported by compare_router, not the expert's). Per expert: the matched (token, expert) pairs,
// relative L2 over them (NaN when the golden rows are all zero) and max abs.
struct ExpertError {
  int64_t expert = 0;
  int64_t pairs = 0;
  double rel_l2 = 0;
  double max_abs = 0;
};

struct ExpertAlignment {
  std::vector<double> golden, candidate;  // [tokens, k * width], golden slot order
  std::vector<ExpertError> experts;       // ascending id; experts with a matched pair
  int64_t matched = 0, unmatched = 0;     // (token, golden slot) pairs
};

ExpertAlignment align_expert_outputs(std::span<const double> golden_out,
                                     std::span<const double> candidate_out,
                                     std::span<const double> golden_ids,
                                     std::span<const double> candidate_ids, int64_t tokens,
                                     int64_t k, int64_t width);

// The q-quantile (q in [0, 1]) by llama.cpp's rule (perplexity.cpp, kl_divergence(): lambda
// percentile): sort ascending, h = q * (n - 1), linear interpolation between v[floor h] and
// v[floor h + 1] (= Hyndman-Fan type 7, numpy's default "linear"). q = 0 gives the minimum, q = 1
// the maximum, q = 0.5 the median.
double percentile(std::vector<double> v, double q);

// Wilson score interval (z = 1.96) for `successes` of `n` trials; value = successes / n.
// n == 0: value NaN, interval [0, 1].
Interval wilson_interval(int64_t successes, int64_t n);

}  // namespace qparity::golden
