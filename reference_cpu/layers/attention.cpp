#include "reference_cpu/layers/attention.h"

#include <cmath>
#include <string>
#include <vector>

#include "core/error.h"

namespace qparity::reference {

namespace {

std::string str(int64_t v) {
  return std::to_string(v);
}

}  // namespace

Matrix causal_attention(const Matrix& q, const Matrix& k, const Matrix& v,
                        std::span<const int64_t> q_positions, std::span<const int64_t> kv_positions,
                        int64_t num_heads, int64_t num_kv_heads, int64_t head_dim, double scaling,
                        int64_t sliding_window, std::span<const double> sinks) {
  const char* where = "causal_attention";
  if (!sinks.empty() && static_cast<int64_t>(sinks.size()) != num_heads)
    throw Error(where, "sinks has " + std::to_string(sinks.size()) + " logits, num_heads is " +
                           str(num_heads));
  for (size_t h = 0; h < sinks.size(); ++h)
    if (!std::isfinite(sinks[h]))
      throw Error(where, "sink logit of head " + std::to_string(h) + " is not finite");
  if (num_heads <= 0 || num_kv_heads <= 0 || head_dim <= 0)
    throw Error(where, "num_heads " + str(num_heads) + ", num_kv_heads " + str(num_kv_heads) +
                           " and head_dim " + str(head_dim) + " must all be > 0");
  if (num_heads % num_kv_heads != 0)
    throw Error(where, "num_heads " + str(num_heads) + " is not a multiple of num_kv_heads " +
                           str(num_kv_heads));
  if (q.cols != num_heads * head_dim)
    throw Error(where, "q width " + str(q.cols) + " != num_heads " + str(num_heads) +
                           " * head_dim " + str(head_dim));
  if (k.cols != num_kv_heads * head_dim)
    throw Error(where, "k width " + str(k.cols) + " != num_kv_heads " + str(num_kv_heads) +
                           " * head_dim " + str(head_dim));
  if (v.cols != num_kv_heads * head_dim)
    throw Error(where, "v width " + str(v.cols) + " != num_kv_heads " + str(num_kv_heads) +
                           " * head_dim " + str(head_dim));
  if (k.rows != v.rows) throw Error(where, "k has " + str(k.rows) + " rows, v has " + str(v.rows));
  if (static_cast<int64_t>(q_positions.size()) != q.rows)
    throw Error(where, "q_positions has " + std::to_string(q_positions.size()) +
                           " entries, q has " + str(q.rows) + " rows");
  if (static_cast<int64_t>(kv_positions.size()) != k.rows)
    throw Error(where, "kv_positions has " + std::to_string(kv_positions.size()) +
                           " entries, k has " + str(k.rows) + " rows");
  if (sliding_window < 0)
    throw Error(where, "sliding window " + str(sliding_window) + " must be >= 0 (0: none)");
  if (!std::isfinite(scaling))
    throw Error(where, "scaling " + std::to_string(scaling) + " is not finite");

  const int64_t group = num_heads / num_kv_heads;
  const int64_t s_len = k.rows;
  Matrix out(q.rows, q.cols);
  std::vector<double> score(static_cast<size_t>(s_len));
  std::vector<int64_t> visible;
  visible.reserve(static_cast<size_t>(s_len));
  for (int64_t t = 0; t < q.rows; ++t) {
    const int64_t qpos = q_positions[static_cast<size_t>(t)];
    visible.clear();
    for (int64_t s = 0; s < s_len; ++s)
      if (const int64_t kp = kv_positions[static_cast<size_t>(s)];
          kp <= qpos && (sliding_window == 0 || qpos - kp < sliding_window))
        visible.push_back(s);
    if (visible.empty())
      throw Error(where, "query row " + str(t) + " at position " + str(qpos) +
                             " sees no key (softmax over an empty set)");
    for (int64_t h = 0; h < num_heads; ++h) {
      const int64_t kvh = h / group;
      const double* qh = q.row(t).data() + h * head_dim;
      double m = -INFINITY;
      // Four keys at a time: four independent sums, each still q.k over ascending d with a
      // rounding per product and per addition (the bits of one key at a time, without one long
      // chain of dependent additions).
      size_t i = 0;
      for (; i + 4 <= visible.size(); i += 4) {
        const double* k0 = k.row(visible[i]).data() + kvh * head_dim;
        const double* k1 = k.row(visible[i + 1]).data() + kvh * head_dim;
        const double* k2 = k.row(visible[i + 2]).data() + kvh * head_dim;
        const double* k3 = k.row(visible[i + 3]).data() + kvh * head_dim;
        double dot[4] = {0.0, 0.0, 0.0, 0.0};
        for (int64_t d = 0; d < head_dim; ++d) {
          dot[0] += qh[d] * k0[d];
          dot[1] += qh[d] * k1[d];
          dot[2] += qh[d] * k2[d];
          dot[3] += qh[d] * k3[d];
        }
        for (size_t j = 0; j < 4; ++j) {
          const double sc = dot[j] * scaling;
          score[static_cast<size_t>(visible[i + j])] = sc;
          if (sc > m) m = sc;
        }
      }
      for (; i < visible.size(); ++i) {
        const int64_t s = visible[i];
        const double* ks = k.row(s).data() + kvh * head_dim;
        double dot = 0.0;
        for (int64_t d = 0; d < head_dim; ++d)
          dot += qh[d] * ks[d];
        const double sc = dot * scaling;
        score[static_cast<size_t>(s)] = sc;
        if (sc > m) m = sc;
      }
      // A sink joins the max and, last, the denominator (HF: cat([scores, sink]), softmax, the
      // sink column dropped).
      const bool sink = !sinks.empty();
      const double sink_logit = sink ? sinks[static_cast<size_t>(h)] : 0.0;
      if (sink && sink_logit > m) m = sink_logit;
      double z = 0.0;
      for (const int64_t s : visible) {
        const double e = std::exp(score[static_cast<size_t>(s)] - m);
        score[static_cast<size_t>(s)] = e;
        z += e;
      }
      if (sink) z += std::exp(sink_logit - m);
      for (const int64_t s : visible)
        score[static_cast<size_t>(s)] /= z;
      // Each output channel sums p * v over the visible keys in ascending order; walking the
      // keys outside and the channels inside keeps every channel's order (and bits) and reads v
      // by rows.
      double* oh = out.row(t).data() + h * head_dim;
      for (int64_t d = 0; d < head_dim; ++d)
        oh[d] = 0.0;
      for (const int64_t s : visible) {
        const double p = score[static_cast<size_t>(s)];
        const double* vs = v.row(s).data() + kvh * head_dim;
        for (int64_t d = 0; d < head_dim; ++d)
          oh[d] = oh[d] + p * vs[d];
      }
    }
  }
  return out;
}

}  // namespace qparity::reference
