#include "golden/tp_report.h"

#include <cmath>
#include <cstring>
#include <iomanip>
#include <map>
#include <sstream>

#include "core/error.h"

namespace qparity::golden {

namespace {

const Array2D* find_point(const Golden& g, const std::string& name) {
  for (const CapturePoint& p : g.points)
    if (p.name == name) return &p.values;
  return nullptr;
}

double rel_l2(const std::vector<double>& c, const std::vector<double>& g) {
  double num = 0, den = 0;
  for (size_t i = 0; i < g.size(); ++i) {
    num += (c[i] - g[i]) * (c[i] - g[i]);
    den += g[i] * g[i];
  }
  if (den == 0) return num == 0 ? 0 : std::numeric_limits<double>::infinity();
  return std::sqrt(num / den);
}

void same_tokens(const Golden& a, const Golden& b, const std::string& what) {
  if (a.tokens != b.tokens || a.seq_len != b.seq_len)
    throw Error("tp report", what + " ran other tokens than the TP = 1 run");
}

std::string fmt(double v) {
  if (std::isnan(v)) return "-";
  std::ostringstream s;
  s << std::setprecision(3) << std::scientific << v;
  return s.str();
}

Json end_to_end(const EndToEnd& e) {
  return {{"kld_mean", e.kld_mean.value},
          {"kld_max", e.kld_max},
          {"top1", e.top1.value},
          {"ppl_golden", e.ppl_golden},
          {"ppl_candidate", e.ppl_candidate},
          {"ppl_ratio", e.ppl_ratio.value},
          {"first_greedy_divergence", e.first_greedy_divergence}};
}

}  // namespace

TpReport tp_numerics_report(const Golden& tp1, const Golden& tpn, const Golden* ref, int tp,
                            const Golden* ref_tp) {
  same_tokens(tp1, tpn, "the TP = " + std::to_string(tp) + " run");
  if (ref) same_tokens(tp1, *ref, "the reference golden");
  if (ref_tp) same_tokens(tp1, *ref_tp, "the TP reference golden");
  TpReport r;
  r.tp = tp;
  for (const CapturePoint& p : tp1.points) {
    TpPointRow row;
    row.name = p.name;
    row.count = p.values.rows * p.values.cols;
    const Array2D* n = find_point(tpn, p.name);
    if (!n) {
      const AbsentPoint* a = declared_absent(tpn.meta, p.name);
      row.absent = a ? a->reason : "not in the TP = " + std::to_string(tp) + " dump";
      r.points.push_back(row);
      continue;
    }
    if (n->rows != p.values.rows || n->cols != p.values.cols)
      throw Error("tp report", "points/" + p.name + " is [" + std::to_string(n->rows) + ", " +
                                   std::to_string(n->cols) + "] at TP = " + std::to_string(tp) +
                                   ", [" + std::to_string(p.values.rows) + ", " +
                                   std::to_string(p.values.cols) + "] at TP = 1");
    for (size_t i = 0; i < p.values.data.size(); ++i) {
      const double a = p.values.data[i], b = n->data[i];
      if (std::memcmp(&a, &b, sizeof a) != 0) {
        ++row.changed;
        if (std::isfinite(a) && std::isfinite(b))
          row.max_abs = std::max(row.max_abs, std::fabs(a - b));
        else
          row.max_abs = std::numeric_limits<double>::infinity();
      }
    }
    row.rel_l2 = rel_l2(n->data, p.values.data);
    if (const Array2D* g = ref ? find_point(*ref, p.name) : nullptr;
        g && g->rows == p.values.rows && g->cols == p.values.cols) {
      row.tp1_vs_ref = rel_l2(p.values.data, g->data);
      row.tpn_vs_ref = rel_l2(n->data, g->data);
    }
    if (const Array2D* g = ref_tp ? find_point(*ref_tp, p.name) : nullptr;
        g && g->rows == n->rows && g->cols == n->cols)
      row.tpn_vs_ref_tp = rel_l2(n->data, g->data);
    if (row.changed > 0 && r.changed_points++ == 0) r.first_changed = p.name;
    r.points.push_back(row);
  }
  const int64_t rows = tp1.logits.rows, vocab = tp1.logits.cols;
  if (tpn.logits.rows != rows || tpn.logits.cols != vocab)
    throw Error("tp report", "the TP = " + std::to_string(tp) + " logits have another shape");
  r.tpn_vs_tp1 = compare_logits(tp1.logits.data, tpn.logits.data, rows, vocab, tp1.targets);
  if (ref) {
    r.has_reference = true;
    r.tp1_vs_ref = compare_logits(ref->logits.data, tp1.logits.data, rows, vocab, tp1.targets);
    r.tpn_vs_ref = compare_logits(ref->logits.data, tpn.logits.data, rows, vocab, tp1.targets);
  }
  if (ref_tp) {
    r.has_tp_reference = true;
    r.tpn_vs_ref_tp =
        compare_logits(ref_tp->logits.data, tpn.logits.data, rows, vocab, tp1.targets);
  }
  return r;
}

std::string to_text(const TpReport& r) {
  std::ostringstream o;
  const std::string n = "tp" + std::to_string(r.tp);
  o << "TP-numerics report: TP = " << r.tp << " against TP = 1, same engine, same tokens\n";
  o << std::left << std::setw(40) << "point" << std::right << std::setw(10) << "elements"
    << std::setw(10) << "changed" << std::setw(12) << "max|d|" << std::setw(12) << "relL2"
    << std::setw(13) << "tp1-vs-ref" << std::setw(13) << (n + "-vs-ref") << std::setw(15)
    << (n + "-vs-ref" + std::to_string(r.tp)) << "\n";
  for (const TpPointRow& p : r.points) {
    o << std::left << std::setw(40) << p.name << std::right << std::setw(10) << p.count;
    if (!p.absent.empty()) {
      o << "  absent at TP = " << r.tp << ": " << p.absent << "\n";
      continue;
    }
    o << std::setw(10) << p.changed << std::setw(12) << fmt(p.max_abs) << std::setw(12)
      << fmt(p.rel_l2) << std::setw(13) << fmt(p.tp1_vs_ref) << std::setw(13) << fmt(p.tpn_vs_ref)
      << std::setw(15) << fmt(p.tpn_vs_ref_tp) << "\n";
  }
  o << r.changed_points << " of " << r.points.size() << " points change bits";
  if (!r.first_changed.empty()) o << "; the first is " << r.first_changed;
  o << "\n";
  const auto e2e = [&](const char* what, const EndToEnd& e) {
    o << std::left << std::setw(16) << what << std::right << " KL mean " << fmt(e.kld_mean.value)
      << "  KL max " << fmt(e.kld_max) << "  top-1 " << std::fixed << std::setprecision(4)
      << e.top1.value << "  PPL " << e.ppl_golden << " -> " << e.ppl_candidate << std::defaultfloat
      << "\n";
  };
  e2e(("tp1 -> " + n).c_str(), r.tpn_vs_tp1);
  if (r.has_reference) {
    e2e("ref -> tp1", r.tp1_vs_ref);
    e2e(("ref -> " + n).c_str(), r.tpn_vs_ref);
  }
  if (r.has_tp_reference) e2e(("ref" + std::to_string(r.tp) + " -> " + n).c_str(), r.tpn_vs_ref_tp);
  return o.str();
}

Json to_json(const TpReport& r) {
  Json points = Json::array();
  for (const TpPointRow& p : r.points) {
    Json j = {{"name", p.name}, {"elements", p.count}};
    if (!p.absent.empty()) {
      j["absent"] = p.absent;
    } else {
      j["changed"] = p.changed;
      j["max_abs"] = p.max_abs;
      j["rel_l2"] = p.rel_l2;
      if (!std::isnan(p.tp1_vs_ref)) j["tp1_vs_ref_rel_l2"] = p.tp1_vs_ref;
      if (!std::isnan(p.tpn_vs_ref)) j["tpn_vs_ref_rel_l2"] = p.tpn_vs_ref;
      if (!std::isnan(p.tpn_vs_ref_tp)) j["tpn_vs_ref_tp_rel_l2"] = p.tpn_vs_ref_tp;
    }
    points.push_back(j);
  }
  Json j = {{"tp", r.tp},
            {"points", points},
            {"changed_points", r.changed_points},
            {"first_changed", r.first_changed},
            {"tpn_vs_tp1", end_to_end(r.tpn_vs_tp1)}};
  if (r.has_reference) {
    j["tp1_vs_ref"] = end_to_end(r.tp1_vs_ref);
    j["tpn_vs_ref"] = end_to_end(r.tpn_vs_ref);
  }
  if (r.has_tp_reference) j["tpn_vs_ref_tp"] = end_to_end(r.tpn_vs_ref_tp);
  return j;
}

}  // namespace qparity::golden
