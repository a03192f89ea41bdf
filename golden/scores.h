#pragma once
// The scores every golden and candidate carries beside its logits: the targets' log-probabilities
// and per-sequence NLL / perplexity, computed once here in fp64 for every producer.
#include <cstdint>
#include <vector>

#include "golden/golden_file.h"

namespace qparity::golden {

// The next token inside each sequence of `tokens` [sequences, seq_len], -1 at a sequence's last
// position.
std::vector<int64_t> next_token_targets(const std::vector<int64_t>& tokens, int64_t sequences,
                                        int64_t seq_len);

// log_softmax(logits[r])[target[r]] in fp64 (max-subtracted log-sum-exp); NaN where target < 0.
std::vector<double> target_logprobs(const Array2D& logits, const std::vector<int64_t>& targets);

// From g.logits and g.targets: target_logprobs, and per sequence the mean NLL over its scored
// positions and the perplexity exp(NLL). Any producer (the reference, an engine) finishes with it.
void fill_scores(Golden& g);

}  // namespace qparity::golden
