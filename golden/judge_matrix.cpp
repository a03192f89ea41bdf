#include "golden/judge_matrix.h"

#include <map>
#include <ostream>
#include <sstream>

#include "core/capture/capture_points.h"
#include "core/error.h"
#include "core/safetensors/safetensors_writer.h"
#include "golden/checkpoint_identity.h"
#include "golden/layer_rerun.h"
#include "golden/policy.h"
#include "golden/reference_candidate.h"
#include "golden/reference_run.h"
#include "reference_cpu/models/model_loader.h"

namespace qparity::golden {

namespace fs = std::filesystem;
using reference::Deviation;
using reference::DeviationExpectation;
using reference::DeviationKind;

namespace {

bool fits(const LayerShape& s, DeviationKind k) {
  using K = DeviationKind;
  switch (k) {
    case K::kNeighbourExpert:
    case K::kRouterNotRenormalized:
      return s.moe;
    case K::kGateUpSwapped:
      return !s.moe;
    case K::kQkNormSkipped:
      return s.qk_norm && !s.linear_attention;
    case K::kNormInStorageDtype:
      return true;
    default:
      return !s.linear_attention;
  }
}

reference::LoadOptions load_options(DeviationKind k) {
  reference::LoadOptions lo;
  lo.dialect = Dialect::kVllm;
  lo.mode = k == DeviationKind::kExactArithmetic ? reference::PrecisionMode::kExact
                                                 : reference::PrecisionMode::kEmulate;
  lo.run_dtype = k == DeviationKind::kFp32Activations ? DType::kF32 : DType::kBF16;
  return lo;
}

std::string first_reason(const CompareReport& r) {
  return r.failures.empty() ? "" : r.failures.front();
}

std::string failing_point(const CompareReport& r) {
  return r.first_failing < 0 ? "" : r.points[static_cast<size_t>(r.first_failing)].name;
}

// Judges the cell against its expectation (judge_matrix.h).
void decide_outcome(MatrixCell& c) {
  if (!c.applicable) {
    c.as_expected = true;
    c.outcome = "n/a";
    return;
  }
  const bool local_fail = c.local == Judgement::kFail, free_fail = c.free == Judgement::kFail;
  switch (c.expect) {
    case DeviationExpectation::kPass:
      c.as_expected = c.local == Judgement::kPass && c.free == Judgement::kPass;
      c.outcome = c.as_expected ? "PASS" : (local_fail || free_fail ? "false alarm" : "undecided");
      return;
    case DeviationExpectation::kFail: {
      const bool located = c.local_first_failing == c.expected_point;
      const bool bisect_right =
          !c.bisected || (c.bisect_point == c.expected_point && c.bisect == Diagnosis::kLocal);
      c.as_expected = local_fail && located && bisect_right;
      c.outcome = !local_fail     ? "miss"
                  : !located      ? "wrong location"
                  : !bisect_right ? "bisect wrong"
                                  : "caught";
      return;
    }
    case DeviationExpectation::kMeasure:
      c.as_expected = true;
      c.outcome = local_fail || free_fail ? "measured: caught" : "measured: passes";
      return;
  }
}

}  // namespace

int64_t deviation_layer(const ModelConfig& cfg, DeviationKind kind) {
  const int64_t n = cfg.num_layers, mid = n / 2;
  std::vector<int64_t> order;
  for (int64_t l = mid; l < n; ++l)
    order.push_back(l);
  for (int64_t l = mid - 1; l >= 0; --l)
    order.push_back(l);
  for (int64_t l : order)
    if (fits(layer_shape(cfg, l), kind)) return l;
  return -1;
}

std::vector<MatrixCell> run_judge_matrix(const std::vector<fs::path>& models,
                                         const JudgeMatrixOptions& o) {
  if (models.empty()) throw Error("judge matrix", "no checkpoint to judge");
  if (o.sequences < 1 || o.seq_len < 2)
    throw Error("judge matrix", "needs at least 1 sequence of 2 tokens");
  fs::create_directories(o.work);
  std::vector<MatrixCell> cells;
  for (const fs::path& dir : models) {
    const ModelConfig cfg = load_model_config(dir / "config.json");
    const TokenInputs in = synthetic_inputs(o.sequences, o.seq_len, cfg.vocab, o.seed);
    // The engine-row golden, as validate makes it.
    ReferenceRunOptions er;
    er.mode = reference::PrecisionMode::kEmulate;
    er.dialect = Dialect::kVllm;
    er.run_dtype = DType::kBF16;
    er.point_precision = PointPrecision::kF32;
    Golden ref = run_reference(dir, in, er, nullptr);
    const std::string label = model_name(dir), scheme = ref.meta.scheme;
    const fs::path gfile = o.work / (label + ".golden.h5");
    write_golden(gfile, ref, OverwritePolicy::kReplace);
    const GoldenReader golden = GoldenReader::open(gfile);
    const fs::path policy_file = o.policies / (scheme + ".json");
    const Policy policy = load_policy(policy_file);
    const PolicySection& section =
        policy_section(policy, PolicyRole::kEngine, device_key(kReferenceCandidateDevice));
    CompareOptions co;
    co.policy = &policy;
    auto clean = reference::load_model(dir, load_options(DeviationKind::kNone));
    const Runner spec =
        reference_runner(*clean, "the qparity reference (" + scheme + ", dialect vllm, emulate)");

    std::vector<Deviation> candidates = o.candidates;
    if (candidates.empty()) {
      candidates.push_back(Deviation{});  // the reference itself
      for (const auto& info : reference::deviation_table())
        candidates.push_back(Deviation{info.kind, info.layer_scoped ? Deviation::kChosenLayer : 0});
    }
    for (Deviation d : candidates) {
      MatrixCell c;
      c.model = label;
      c.scheme = scheme;
      if (d.any()) {
        const auto& info = reference::deviation_info(d.kind);
        c.expect = info.expect;
        if (info.layer_scoped && (o.candidates.empty() || d.layer == Deviation::kChosenLayer))
          d.layer = deviation_layer(cfg, d.kind);
        if (info.layer_scoped && d.layer < 0) {
          c.candidate = std::string(info.name);
          c.applicable = false;
          decide_outcome(c);
          cells.push_back(c);
          continue;
        }
      }
      c.candidate = d.any() ? reference::to_string(d) : "none";
      c.expected_point = reference::expected_first_point(d);
      auto model = reference::load_model(dir, load_options(d.kind));
      model->set_deviation(d);
      const std::string stem = label + "." + c.candidate;
      const auto dump = [&](Golden cand, const std::string& file) {
        cand.meta.model = ref.meta.model;
        cand.meta.scheme = scheme;
        cand.meta.model_config_hash = ref.meta.model_config_hash;
        cand.meta.checkpoint_hash = ref.meta.checkpoint_hash;
        cand.meta.point_precision = PointPrecision::kF32;
        write_golden(o.work / file, cand, OverwritePolicy::kReplace);
        return GoldenReader::open(o.work / file);
      };
      const GoldenReader local =
          dump(reference_candidate_local(*model, golden), stem + ".local.h5");
      const int64_t local_hits = model->deviation_hits();
      const GoldenReader free = dump(reference_candidate_free(*model, in), stem + ".free.h5");
      c.applicable = !d.any() || local_hits > 0 || model->deviation_hits() > 0;
      const CompareReport lr = compare_goldens(golden, local, co);
      const CompareReport fr = compare_goldens(golden, free, co);
      c.local = lr.verdict;
      c.free = fr.verdict;
      c.local_first_failing = failing_point(lr);
      c.free_first_failing = failing_point(fr);
      c.local_failure = first_reason(lr);
      c.free_failure = first_reason(fr);
      c.kld_mean = fr.e2e.kld_mean.value;
      c.kld_upper = fr.e2e.kld_mean.hi;
      c.top1 = fr.e2e.top1.value;
      if (fr.first_failing >= 0 && point_layer(c.free_first_failing) >= 0) {
        const Runner own = reference_runner(*model, "the candidate (" + c.candidate + ")");
        const LayerDiagnosis diag = diagnose_layer(fr, static_cast<size_t>(fr.first_failing),
                                                   golden, free, section, &own, "", &spec, "");
        c.bisected = true;
        c.bisect_point = diag.point;
        c.bisect = diag.diagnosis;
      }
      decide_outcome(c);
      if (o.progress)
        *o.progress << "qparity judge-matrix: " << label << " " << c.candidate << ": layer-local "
                    << to_string(c.local)
                    << (c.local_first_failing.empty() ? "" : " at " + c.local_first_failing)
                    << ", free run " << to_string(c.free) << " (KLD " << c.kld_mean << ")"
                    << (c.bisected ? ", bisect " + c.bisect_point + " " + to_string(c.bisect) : "")
                    << " -> " << c.outcome << "\n"
                    << std::flush;
      cells.push_back(std::move(c));
    }
  }
  return cells;
}

Json matrix_json(const std::vector<MatrixCell>& cells) {
  Json j;
  j["schema"] = "qparity-judge-matrix-1";
  int64_t wrong = 0, false_alarms = 0, misses = 0, located = 0;
  for (const MatrixCell& c : cells) {
    Json r;
    r["model"] = c.model;
    r["scheme"] = c.scheme;
    r["candidate"] = c.candidate;
    r["expect"] = c.expect == DeviationExpectation::kPass   ? "pass"
                  : c.expect == DeviationExpectation::kFail ? "fail"
                                                            : "measure";
    r["applicable"] = c.applicable;
    r["expected_point"] = c.expected_point;
    r["layer_local"] = {{"verdict", to_string(c.local)},
                        {"first_failing", c.local_first_failing},
                        {"reason", c.local_failure}};
    r["free_run"] = {{"verdict", to_string(c.free)},
                     {"first_failing", c.free_first_failing},
                     {"reason", c.free_failure},
                     {"kld_mean", json_number(c.kld_mean)},
                     {"kld_upper", json_number(c.kld_upper)},
                     {"top1", json_number(c.top1)}};
    if (c.bisected) r["bisect"] = {{"point", c.bisect_point}, {"diagnosis", to_string(c.bisect)}};
    r["as_expected"] = c.as_expected;
    r["outcome"] = c.outcome;
    j["cells"].push_back(r);
    wrong += c.as_expected ? 0 : 1;
    false_alarms += c.outcome == "false alarm";
    misses += c.outcome == "miss";
    located += c.outcome == "wrong location" || c.outcome == "bisect wrong";
  }
  j["summary"] = {{"cells", cells.size()},
                  {"not_as_expected", wrong},
                  {"false_alarms", false_alarms},
                  {"misses", misses},
                  {"wrong_locations", located}};
  return j;
}

namespace {

// Rows (candidates, in first-seen order) by columns ("model (scheme)").
struct Grid {
  std::vector<std::string> rows, cols;
  std::map<std::pair<std::string, std::string>, const MatrixCell*> at;
};

Grid grid_of(const std::vector<MatrixCell>& cells) {
  Grid g;
  for (const MatrixCell& c : cells) {
    const std::string col = c.model + " (" + c.scheme + ")";
    if (std::find(g.rows.begin(), g.rows.end(), c.candidate) == g.rows.end())
      g.rows.push_back(c.candidate);
    if (std::find(g.cols.begin(), g.cols.end(), col) == g.cols.end()) g.cols.push_back(col);
    g.at[{c.candidate, col}] = &c;
  }
  return g;
}

std::string cell_text(const MatrixCell& c) {
  if (!c.applicable) return "n/a";
  std::string s = std::string(to_string(c.local));
  if (!c.local_first_failing.empty()) s += " " + c.local_first_failing;
  s += " / free " + std::string(to_string(c.free));
  if (c.bisected) s += " (bisect " + c.bisect_point + " " + to_string(c.bisect) + ")";
  return s + (c.as_expected ? "" : " **" + c.outcome + "**");
}

std::string escape(const std::string& s) {
  std::string out;
  for (char ch : s)
    out += ch == '<' ? "&lt;" : ch == '>' ? "&gt;" : ch == '&' ? "&amp;" : std::string(1, ch);
  return out;
}

std::string expectation(const MatrixCell& c) {
  return c.expect == DeviationExpectation::kPass   ? "must PASS"
         : c.expect == DeviationExpectation::kFail ? "must FAIL"
                                                   : "measured";
}

}  // namespace

std::string matrix_markdown(const std::vector<MatrixCell>& cells) {
  const Grid g = grid_of(cells);
  std::ostringstream md;
  const Json s = matrix_json(cells)["summary"];
  md << "# The judge's confusion matrix\n\n"
     << "Each cell: the layer-local verdict (and its first failing point), the free run's "
        "verdict (and bisect's point and diagnosis where its points leave the gates). "
     << s["cells"].get<int64_t>() << " cells, " << s["not_as_expected"].get<int64_t>()
     << " not as expected (" << s["false_alarms"].get<int64_t>() << " false alarms, "
     << s["misses"].get<int64_t>() << " misses, " << s["wrong_locations"].get<int64_t>()
     << " wrong locations).\n\n| candidate | expected |";
  for (const auto& col : g.cols)
    md << " " << col << " |";
  md << "\n|---|---|";
  for (size_t i = 0; i < g.cols.size(); ++i)
    md << "---|";
  md << "\n";
  for (const auto& row : g.rows) {
    const MatrixCell* any = nullptr;
    for (const auto& col : g.cols)
      if (auto it = g.at.find({row, col}); it != g.at.end()) any = it->second;
    md << "| " << row << " | " << (any ? expectation(*any) : "") << " |";
    for (const auto& col : g.cols) {
      const auto it = g.at.find({row, col});
      md << " " << (it == g.at.end() ? "" : cell_text(*it->second)) << " |";
    }
    md << "\n";
  }
  md << "\nWhat each deviation computes:\n\n";
  for (const auto& info : reference::deviation_table())
    md << "- `" << info.name << "`: " << info.what << "\n";
  return md.str();
}

std::string matrix_html(const std::vector<MatrixCell>& cells) {
  const Grid g = grid_of(cells);
  std::ostringstream h;
  h << "<!doctype html><html><head><meta charset=\"utf-8\"><title>qparity: the judge's "
       "confusion matrix</title><style>body{font-family:sans-serif}table{border-collapse:"
       "collapse}td,th{border:1px solid #999;padding:3px 6px;font-size:13px}.ok{background:"
       "#d8f0d8}.bad{background:#f6c8c8}.na{background:#eee;color:#777}</style></head><body>"
       "<h1>The judge's confusion matrix</h1><p>Rows: candidates (the reference itself, "
       "legitimate implementation choices that must PASS, planted faults that must FAIL at "
       "their point, measured faults). Columns: checkpoints in their schemes. Green: as "
       "expected; red: a false alarm, a miss or a wrong location.</p><table><tr><th>candidate"
       "</th><th>expected</th>";
  for (const auto& col : g.cols)
    h << "<th>" << escape(col) << "</th>";
  h << "</tr>";
  for (const auto& row : g.rows) {
    const MatrixCell* any = nullptr;
    for (const auto& col : g.cols)
      if (auto it = g.at.find({row, col}); it != g.at.end()) any = it->second;
    h << "<tr><td>" << escape(row) << "</td><td>" << (any ? expectation(*any) : "") << "</td>";
    for (const auto& col : g.cols) {
      const auto it = g.at.find({row, col});
      if (it == g.at.end()) {
        h << "<td></td>";
        continue;
      }
      const MatrixCell& c = *it->second;
      const char* cls = !c.applicable ? "na" : c.as_expected ? "ok" : "bad";
      std::string text = cell_text(c);
      std::string plain;
      for (char ch : text)
        if (ch != '*') plain += ch;
      h << "<td class=\"" << cls << "\" title=\"" << escape(c.local_failure) << "\">"
        << escape(plain) << "</td>";
    }
    h << "</tr>";
  }
  h << "</table></body></html>\n";
  return h.str();
}

void write_judge_matrix(const fs::path& dir, const std::vector<MatrixCell>& cells) {
  fs::create_directories(dir);
  const auto put = [&](const char* name, const std::string& text) {
    write_file_atomic(
        dir / name,
        std::span<const uint8_t>(reinterpret_cast<const uint8_t*>(text.data()), text.size()),
        OverwritePolicy::kReplace);
  };
  put("judge-matrix.json", matrix_json(cells).dump(1) + "\n");
  put("judge-matrix.md", matrix_markdown(cells));
  put("judge-matrix.html", matrix_html(cells));
}

}  // namespace qparity::golden
