#pragma once
// The TP-numerics report: the same engine at tensor parallelism N against itself at TP = 1 on
// the same tokens (and both against the fp64 reference golden when given), the question "what
// does TP itself change?". Row-parallel layers' all-reduce adds the ranks' bf16 partial sums
// where TP = 1 sums the whole dot product in fp32 and rounds once; a row-parallel layer with
// dynamic per-token activation quantization quantizes each rank's slice with its own scale.
// Per capture point, in execution order: how many elements changed bits, by how much, and how
// far each run is from the reference; end to end: KL, top-1 agreement and perplexity of TP = N
// against TP = 1 and of each against the reference. Points one run lacks are listed with the
// producer's declared reason (tp_gather.h's absent points).
#include <cstdint>
#include <limits>
#include <string>
#include <vector>

#include "core/json_util.h"
#include "golden/golden_file.h"
#include "golden/metrics.h"

namespace qparity::golden {

struct TpPointRow {
  std::string name;
  int64_t count = 0;    // elements
  int64_t changed = 0;  // elements whose bits differ between TP = N and TP = 1
  double max_abs = 0;   // max |tpN - tp1|
  double rel_l2 = 0;    // ||tpN - tp1|| / ||tp1||
  // ||run - reference|| / ||reference||; NaN where there is no reference point.
  double tp1_vs_ref = std::numeric_limits<double>::quiet_NaN();
  double tpn_vs_ref = std::numeric_limits<double>::quiet_NaN();
  // TP = N against the reference that emulates TP = N's arithmetic (golden make --tp N).
  double tpn_vs_ref_tp = std::numeric_limits<double>::quiet_NaN();
  std::string absent;  // non-empty: the TP = N run lacks the point (its declared reason)
};

struct TpReport {
  int tp = 0;
  std::vector<TpPointRow> points;
  int64_t changed_points = 0;  // points with at least one changed element
  std::string first_changed;   // in execution order; empty when none changed
  EndToEnd tpn_vs_tp1;
  bool has_reference = false;
  EndToEnd tp1_vs_ref, tpn_vs_ref;
  bool has_tp_reference = false;
  EndToEnd tpn_vs_ref_tp;
};

// tp1 and tpn: engine goldens of the same tokens (TP = 1 and TP = tp); ref: the reference golden
// of those tokens, or null; ref_tp: the reference with TP = tp's arithmetic, or null. Throws
// naming the file's role when the tokens differ or a point's shape does.
TpReport tp_numerics_report(const Golden& tp1, const Golden& tpn, const Golden* ref, int tp,
                            const Golden* ref_tp = nullptr);

std::string to_text(const TpReport& r);
Json to_json(const TpReport& r);

}  // namespace qparity::golden
