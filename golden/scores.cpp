#include "golden/scores.h"

#include <algorithm>
#include <cmath>

namespace qparity::golden {

std::vector<int64_t> next_token_targets(const std::vector<int64_t>& tokens, int64_t sequences,
                                        int64_t seq_len) {
  std::vector<int64_t> t(tokens.size(), -1);
  for (int64_t s = 0; s < sequences; ++s)
    for (int64_t i = 0; i + 1 < seq_len; ++i)
      t[static_cast<size_t>(s * seq_len + i)] = tokens[static_cast<size_t>(s * seq_len + i + 1)];
  return t;
}

std::vector<double> target_logprobs(const Array2D& logits, const std::vector<int64_t>& targets) {
  std::vector<double> out(static_cast<size_t>(logits.rows), std::nan(""));
  for (int64_t r = 0; r < logits.rows; ++r) {
    const int64_t t = targets[static_cast<size_t>(r)];
    if (t < 0) continue;
    const double* row = logits.data.data() + r * logits.cols;
    double mx = row[0];
    for (int64_t v = 1; v < logits.cols; ++v)
      mx = std::max(mx, row[v]);
    double sum = 0.0;
    for (int64_t v = 0; v < logits.cols; ++v)
      sum += std::exp(row[v] - mx);
    out[static_cast<size_t>(r)] = row[t] - mx - std::log(sum);
  }
  return out;
}

void fill_scores(Golden& g) {
  g.target_logprobs = target_logprobs(g.logits, g.targets);
  g.sequence_nll.clear();
  g.sequence_ppl.clear();
  for (int64_t s = 0; s < g.sequences; ++s) {
    double sum = 0.0;
    int64_t n = 0;
    for (int64_t i = 0; i < g.seq_len; ++i) {
      const size_t r = static_cast<size_t>(s * g.seq_len + i);
      if (g.targets[r] < 0) continue;  // no next token inside the sequence
      sum -= g.target_logprobs[r];     // NaN for a row with non-finite logits: stays NaN
      ++n;
    }
    const double nll = n > 0 ? sum / static_cast<double>(n) : std::nan("");
    g.sequence_nll.push_back(nll);
    g.sequence_ppl.push_back(std::exp(nll));
  }
}

}  // namespace qparity::golden
