#include "gpu_engine/sampler.h"

#include <algorithm>
#include <cmath>
#include <numeric>
#include <vector>

#include "core/error.h"

namespace qparity::gpu {

Sampler::Sampler(const SamplingParams& p) : p_(p), rng_(p.seed) {
  if (!(p.temperature >= 0) || !std::isfinite(p.temperature))
    throw Error("sampler", "temperature must be finite and >= 0");
  if (!(p.top_p > 0 && p.top_p <= 1)) throw Error("sampler", "top_p must be in (0, 1]");
}

int32_t Sampler::next(std::span<const float> logits) {
  if (logits.empty()) throw Error("sampler", "empty logits row");
  for (size_t i = 0; i < logits.size(); ++i)
    if (std::isnan(logits[i])) throw Error("sampler", "logit " + std::to_string(i) + " is NaN");
  if (p_.temperature == 0) {
    size_t best = 0;
    for (size_t i = 1; i < logits.size(); ++i)
      if (logits[i] > logits[best]) best = i;
    return static_cast<int32_t>(best);
  }
  const double mx = *std::max_element(logits.begin(), logits.end());
  std::vector<double> prob(logits.size());
  double sum = 0;
  for (size_t i = 0; i < prob.size(); ++i)
    sum += prob[i] = std::exp((logits[i] - mx) / p_.temperature);
  std::vector<int32_t> order(prob.size());
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(), [&](int32_t a, int32_t b) {
    return prob[static_cast<size_t>(a)] > prob[static_cast<size_t>(b)];
  });
  double kept = 0;
  size_t n = 0;
  while (n < order.size() && (n == 0 || kept < p_.top_p * sum))
    kept += prob[static_cast<size_t>(order[n++])];
  std::uniform_real_distribution<double> u(0.0, kept);
  const double r = u(rng_);
  double acc = 0;
  for (size_t i = 0; i < n; ++i) {
    acc += prob[static_cast<size_t>(order[i])];
    if (r < acc) return order[i];
  }
  return order[n - 1];
}

}  // namespace qparity::gpu
