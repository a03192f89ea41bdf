#include "reference_cpu/layers/moe_router.h"

#include <algorithm>
#include <cmath>
#include <numeric>
#include <span>
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

namespace {

void check_top_k(int64_t num_experts, int64_t top_k) {
  if (num_experts <= 0) throw Error("moe router", "router logits have no experts (0 columns)");
  if (top_k < 1 || top_k > num_experts)
    throw Error("moe router", "top_k " + std::to_string(top_k) + " must be in [1, " +
                                  std::to_string(num_experts) + "] (the number of experts)");
}

// The top_k entries of `row`, descending, equal values by index ascending: a strict weak order
// that makes the selection and its order unique.
std::vector<int64_t> top_k_of(std::span<const double> row, int64_t top_k) {
  std::vector<int64_t> order(row.size());
  std::iota(order.begin(), order.end(), int64_t{0});
  std::partial_sort(order.begin(), order.begin() + static_cast<std::ptrdiff_t>(top_k), order.end(),
                    [&row](int64_t a, int64_t b) {
                      const double va = row[static_cast<size_t>(a)];
                      const double vb = row[static_cast<size_t>(b)];
                      return va > vb || (va == vb && a < b);
                    });
  order.resize(static_cast<size_t>(top_k));
  return order;
}

}  // namespace

Routing route_topk(const Matrix& router_logits, int64_t top_k, bool norm_topk_prob) {
  check_top_k(router_logits.cols, top_k);
  const Matrix probs = router_softmax(router_logits);
  Routing r;
  const auto k = static_cast<size_t>(top_k);
  for (int64_t t = 0; t < probs.rows; ++t) {
    const auto p = probs.row(t);
    std::vector<int64_t> ids = top_k_of(p, top_k);
    std::vector<double> w(k);
    for (size_t i = 0; i < k; ++i)
      w[i] = p[static_cast<size_t>(ids[i])];
    if (norm_topk_prob) {
      double sum = 0.0;
      for (size_t i = 0; i < k; ++i)
        sum += w[i];
      for (size_t i = 0; i < k; ++i)
        w[i] /= sum;
    }
    r.ids.push_back(std::move(ids));
    r.weights.push_back(std::move(w));
  }
  return r;
}

Routing route_topk_softmax(const Matrix& router_logits, int64_t top_k) {
  check_top_k(router_logits.cols, top_k);
  Routing r;
  const auto k = static_cast<size_t>(top_k);
  for (int64_t t = 0; t < router_logits.rows; ++t) {
    const auto l = router_logits.row(t);
    for (int64_t e = 0; e < router_logits.cols; ++e)
      if (!std::isfinite(l[static_cast<size_t>(e)]))
        throw Error("moe router", "router logit of row " + std::to_string(t) + ", expert " +
                                      std::to_string(e) + " is not finite");
    std::vector<int64_t> ids = top_k_of(l, top_k);
    std::vector<double> w(k);
    const double m = l[static_cast<size_t>(ids[0])];
    double z = 0.0;
    for (size_t i = 0; i < k; ++i) {
      w[i] = std::exp(l[static_cast<size_t>(ids[i])] - m);
      z += w[i];
    }
    for (size_t i = 0; i < k; ++i)
      w[i] /= z;
    r.ids.push_back(std::move(ids));
    r.weights.push_back(std::move(w));
  }
  return r;
}

}  // namespace qparity::reference
