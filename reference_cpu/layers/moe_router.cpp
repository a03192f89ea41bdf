#include "reference_cpu/layers/moe_router.h"

#include <algorithm>
#include <cmath>
#include <numeric>
#include <string>

#include "core/error.h"

namespace qparity::reference {

Matrix router_softmax(const Matrix& router_logits) {
  const int64_t num_experts = router_logits.cols;
  if (num_experts <= 0) throw Error("moe router", "router logits have no experts (0 columns)");
  Matrix p(router_logits.rows, num_experts);
  for (int64_t t = 0; t < router_logits.rows; ++t) {
    const auto row = router_logits.row(t);
    double m = -INFINITY;
    for (int64_t e = 0; e < num_experts; ++e) {
      const double l = row[static_cast<size_t>(e)];
      if (!std::isfinite(l))
        throw Error("moe router", "router logit of token " + std::to_string(t) + ", expert " +
                                      std::to_string(e) + " is not finite");
      m = std::max(m, l);
    }
    const auto out = p.row(t);
    double z = 0.0;
    for (int64_t e = 0; e < num_experts; ++e) {
      const auto ue = static_cast<size_t>(e);
      out[ue] = std::exp(row[ue] - m);
      z += out[ue];
    }
    for (int64_t e = 0; e < num_experts; ++e)
      out[static_cast<size_t>(e)] /= z;
  }
  return p;
}

Routing route_topk(const Matrix& router_logits, int64_t top_k, bool norm_topk_prob) {
  const int64_t num_experts = router_logits.cols;
  if (num_experts <= 0) throw Error("moe router", "router logits have no experts (0 columns)");
  if (top_k < 1 || top_k > num_experts)
    throw Error("moe router", "top_k " + std::to_string(top_k) + " must be in [1, " +
                                  std::to_string(num_experts) + "] (the number of experts)");
  const Matrix probs = router_softmax(router_logits);
  Routing r;
  r.ids.resize(static_cast<size_t>(probs.rows));
  r.weights.resize(static_cast<size_t>(probs.rows));
  std::vector<int64_t> order(static_cast<size_t>(num_experts));
  const auto k = static_cast<size_t>(top_k);
  for (int64_t t = 0; t < probs.rows; ++t) {
    const auto p = probs.row(t);
    std::iota(order.begin(), order.end(), int64_t{0});
    // Probability descending, expert index ascending among equals: a strict weak order that
    // makes the selection and its order unique.
    std::partial_sort(order.begin(), order.begin() + static_cast<std::ptrdiff_t>(k), order.end(),
                      [&p](int64_t a, int64_t b) {
                        const double pa = p[static_cast<size_t>(a)];
                        const double pb = p[static_cast<size_t>(b)];
                        return pa > pb || (pa == pb && a < b);
                      });
    auto& ids = r.ids[static_cast<size_t>(t)];
    auto& w = r.weights[static_cast<size_t>(t)];
    ids.assign(order.begin(), order.begin() + static_cast<std::ptrdiff_t>(k));
    w.resize(k);
    for (size_t i = 0; i < k; ++i)
      w[i] = p[static_cast<size_t>(ids[i])];
    if (norm_topk_prob) {
      double sum = 0.0;
      for (size_t i = 0; i < k; ++i)
        sum += w[i];
      for (size_t i = 0; i < k; ++i)
        w[i] /= sum;
    }
  }
  return r;
}

}  // namespace qparity::reference
