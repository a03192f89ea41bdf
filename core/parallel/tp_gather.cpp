#include "core/parallel/tp_gather.h"

#include <cstring>
#include <optional>

#include "core/capture/capture_points.h"
#include "core/error.h"
#include "core/parallel/tp_sharding.h"

namespace qparity {

namespace {

// Columns [col, col + len) of rank `rank`'s row.
struct Segment {
  int rank;
  int64_t col, len;
};

bool ends_with(const std::string& s, std::string_view suffix) {
  return s.size() >= suffix.size() &&
         s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}

bool row_parallel_linear(const std::string& suffix) {
  for (const std::string_view l : {point::kOProj, point::kDownProj, point::kExpertsW2})
    if (suffix.rfind(std::string(l) + ".", 0) == 0) return true;
  return false;
}

enum class Rule { kReplicated, kQ, kKv, kQkv, kGateUp, kRowInput, kRowScales, kAbsent };

Rule rule_of(const std::string& name) {
  const std::string s = point_suffix(name);
  if (s == point::kAttnQNorm || s == point::kAttnRopeQ || s == point::kAttnCore ||
      s == point::kMlpAct)
    return Rule::kQ;
  if (s == point::kAttnKNorm || s == point::kAttnRopeK || s == point::kAttnKCache ||
      s == point::kAttnVCache)
    return Rule::kKv;
  if (s == point::kAttnQkv) return Rule::kQkv;
  if (s == point::kMlpGateUp) return Rule::kGateUp;
  if (s == point::kMoeExpertOut) return Rule::kAbsent;
  if (row_parallel_linear(s)) {
    if (ends_with(s, point::kXValues)) return Rule::kRowInput;
    if (ends_with(s, point::kXScales)) return Rule::kRowScales;
  }
  return Rule::kReplicated;
}

// The KV head rank r holds, and whether r is the first rank holding it.
int64_t kv_head_of(const ModelConfig& cfg, int rank, int tp) {
  return cfg.num_kv_heads >= tp ? rank : rank / (tp / cfg.num_kv_heads);
}
bool first_of_kv_head(const ModelConfig& cfg, int rank, int tp) {
  return cfg.num_kv_heads >= tp || rank % (tp / cfg.num_kv_heads) == 0;
}

// The whole row as segments of the ranks' rows (nullopt: not a column-sharded point).
std::vector<Segment> segments(Rule rule, const ModelConfig& cfg, int tp, int64_t rank_cols) {
  const ModelConfig local = tp_rank_config(cfg, tp);
  const int64_t q = local.q_size(), kv = local.kv_size(), in = local.intermediate;
  std::vector<Segment> out;
  const auto each = [&](int64_t col, int64_t len, bool kv_heads) {
    for (int r = 0; r < tp; ++r)
      if (!kv_heads || first_of_kv_head(cfg, r, tp)) out.push_back({r, col, len});
  };
  switch (rule) {
    case Rule::kQ:
    case Rule::kRowInput:
      each(0, rank_cols, false);
      break;
    case Rule::kKv:
      each(0, rank_cols, true);
      break;
    case Rule::kQkv:
      each(0, q, false);
      each(q, kv, true);
      each(q + kv, kv, true);
      break;
    case Rule::kGateUp:
      each(0, in, false);
      each(in, in, false);
      break;
    default:
      break;
  }
  return out;
}

Matrix assemble(const std::vector<Segment>& segs, const std::vector<const Matrix*>& m) {
  int64_t cols = 0;
  for (const Segment& s : segs)
    cols += s.len;
  const int64_t rows = m[0]->rows;
  Matrix out(rows, cols);
  for (int64_t r = 0; r < rows; ++r) {
    int64_t at = 0;
    for (const Segment& s : segs) {
      const Matrix& src = *m[static_cast<size_t>(s.rank)];
      std::memcpy(&out(r, at), src.row(r).data() + s.col,
                  static_cast<size_t>(s.len) * sizeof(double));
      at += s.len;
    }
  }
  return out;
}

bool same_bits(const Matrix& a, const Matrix& b) {
  return a.rows == b.rows && a.cols == b.cols &&
         std::memcmp(a.data.data(), b.data.data(), a.data.size() * sizeof(double)) == 0;
}

}  // namespace

GatheredTrace gather_tp_trace(const std::vector<const Trace*>& ranks, const ModelConfig& cfg) {
  if (ranks.empty()) throw Error("tp gather", "no ranks");
  const int tp = static_cast<int>(ranks.size());
  GatheredTrace g;
  // Row-parallel linears whose per-row input scales differ across ranks: absent, values too.
  std::vector<std::string> per_rank_scales;
  for (const auto& [name, m0] : ranks[0]->points()) {
    std::vector<const Matrix*> m;
    for (int r = 0; r < tp; ++r) {
      const Matrix* p = ranks[static_cast<size_t>(r)]->find(name);
      if (!p)
        throw Error(name, "rank " + std::to_string(r) + " of tp " + std::to_string(tp) +
                              " did not capture this point");
      if (p->rows != m0.rows)
        throw Error(name, "rank " + std::to_string(r) + " captured " + std::to_string(p->rows) +
                              " rows, rank 0 " + std::to_string(m0.rows));
      m.push_back(p);
    }
    const Rule rule = tp == 1 ? Rule::kReplicated : rule_of(name);
    if (rule == Rule::kAbsent) {
      g.absent.push_back({name,
                          "per-rank partial sums over the rank's slice of the experts' "
                          "intermediate size; complete only after the all-reduce of "
                          "their combine (moe.out)"});
      continue;
    }
    if (rule == Rule::kRowScales) {
      bool shared = true;
      for (int r = 1; r < tp; ++r)
        shared = shared && same_bits(*m[static_cast<size_t>(r)], m0);
      if (m0.cols == 1 && !shared) {
        const std::string linear = name.substr(0, name.size() - point::kXScales.size() - 1);
        per_rank_scales.push_back(linear);
        g.absent.push_back({name,
                            "one activation scale per row and rank: each rank quantizes "
                            "its own slice of this row-parallel layer's input (tp " +
                                std::to_string(tp) +
                                "), which a TP = 1 run has no "
                                "counterpart of"});
        continue;
      }
      if (m0.cols == 1) {
        g.trace.record(name, m0);
        continue;
      }
      g.trace.record(name, assemble(segments(Rule::kRowInput, cfg, tp, m0.cols), m));
      continue;
    }
    if (rule == Rule::kReplicated) {
      for (int r = 1; r < tp; ++r)
        if (!same_bits(*m[static_cast<size_t>(r)], m0))
          throw Error(name, "rank " + std::to_string(r) + " of tp " + std::to_string(tp) +
                                " holds other values than rank 0 at a replicated point: the "
                                "ranks diverged");
      g.trace.record(name, m0);
      continue;
    }
    for (int r = 1; r < tp; ++r)
      if (m[static_cast<size_t>(r)]->cols != m0.cols)
        throw Error(name, "rank " + std::to_string(r) + " captured " +
                              std::to_string(m[static_cast<size_t>(r)]->cols) +
                              " columns, rank 0 " + std::to_string(m0.cols));
    g.trace.record(name, assemble(segments(rule, cfg, tp, m0.cols), m));
  }
  // A row-parallel layer's codes without their scales cannot be judged: absent with them.
  if (!per_rank_scales.empty()) {
    GatheredTrace kept;
    kept.absent = std::move(g.absent);
    for (const auto& [name, m] : g.trace.points()) {
      bool drop = false;
      for (const std::string& l : per_rank_scales)
        drop = drop || name == l + "." + std::string(point::kXValues);
      if (drop)
        kept.absent.push_back({name, "codes of per-rank activation scales (" +
                                         name.substr(0, name.size() - point::kXValues.size() - 1) +
                                         ".x_scales)"});
      else
        kept.trace.record(name, m);
    }
    return kept;
  }
  return g;
}

Matrix split_tp_point(const std::string& name, const Matrix& whole, const ModelConfig& cfg,
                      int rank, int tp) {
  const Rule rule = tp == 1 ? Rule::kReplicated : rule_of(name);
  if (rule == Rule::kReplicated) return whole;
  if (rule == Rule::kAbsent || rule == Rule::kRowScales)
    throw Error(name, "no tensor-parallel split rule for this point");
  const ModelConfig local = tp_rank_config(cfg, tp);
  // The rank's columns as segments of the whole row.
  std::vector<std::pair<int64_t, int64_t>> cols;  // (whole column, length)
  const int64_t q = cfg.q_size(), kv = cfg.kv_size(), in = cfg.intermediate;
  const int64_t ql = local.q_size(), kvl = local.kv_size(), il = local.intermediate;
  const int64_t head = kv_head_of(cfg, rank, tp);
  switch (rule) {
    case Rule::kQ:
    case Rule::kRowInput: {
      const int64_t w = whole.cols / tp;
      if (w * tp != whole.cols)
        throw Error(name, std::to_string(whole.cols) + " columns do not divide by tp " +
                              std::to_string(tp));
      cols.push_back({rank * w, w});
      break;
    }
    case Rule::kKv:
      cols.push_back({head * kvl, kvl});
      break;
    case Rule::kQkv:
      cols = {{rank * ql, ql}, {q + head * kvl, kvl}, {q + kv + head * kvl, kvl}};
      break;
    case Rule::kGateUp:
      cols = {{rank * il, il}, {in + rank * il, il}};
      break;
    default:
      break;
  }
  int64_t width = 0;
  for (const auto& [c, n] : cols)
    width += n;
  Matrix out(whole.rows, width);
  for (int64_t r = 0; r < whole.rows; ++r) {
    int64_t at = 0;
    for (const auto& [c, n] : cols) {
      if (c + n > whole.cols)
        throw Error(name, "the whole point has " + std::to_string(whole.cols) +
                              " columns, fewer than the rank's shard needs");
      std::memcpy(&out(r, at), whole.row(r).data() + c, static_cast<size_t>(n) * sizeof(double));
      at += n;
    }
  }
  return out;
}

}  // namespace qparity
