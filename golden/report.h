#pragma once
// Accuracy reports: reports/<device>/<model>/<scheme>.{json,md,html} and reports/index.{md,html}
// (schemes x metrics x devices). The JSON is the source (compare.h's to_json plus a summary);
// markdown and a self-contained HTML page with inline SVG plots (error per capture point by
// layer, KLD histogram, KV error against position, MoE router flip rate) are rendered from it.
// Reports are generated artefacts: rewriting them is expected (each write is still atomic).
#include <filesystem>
#include <string>
#include <vector>

#include "core/json_util.h"
#include "golden/compare.h"

namespace qparity::golden {

struct ReportFiles {
  std::filesystem::path json, md, html;
};

// The report JSON: {"summary": {...}, "compare": to_json(r)}; `role` names what was compared
// ("format": quantized reference vs unquantized; "engine": candidate vs same-scheme golden).
Json report_json(const CompareReport& r, const std::string& role);

std::string render_markdown(const Json& report);
std::string render_html(const Json& report);

// Writes the three files under out_root/<device>/<model>/<scheme>.* and lists them in
// out_root/index.json, the manifest of what this tool wrote there. Device, model and scheme come
// from the report (file content): each becomes one sanitized path component (path_safe), and the
// final paths are checked to lie under out_root.
ReportFiles write_report(const Json& report, const std::filesystem::path& out_root);

// A scheme a run could not take on a model, and why ("model.layers.0.mlp.down_proj: K = 172 is
// not divisible by 64"): listed in the index beside the reports.
struct SkippedRow {
  std::string model, scheme, reason;
};
// Records it in out_root/index.json (replacing an earlier entry for the same model and scheme).
void record_skipped(const std::filesystem::path& out_root, const SkippedRow& row);
// A report written for the same model and scheme supersedes an earlier skip (write_report
// removes the skip entry).

// Rebuilds out_root/index.{md,html} from the reports and skips listed in out_root/index.json
// (never from whatever else lies in the folder).
void write_index(const std::filesystem::path& out_root);

// The rows an index lists (read under the index lock): each report's path relative to the root
// (without extension) and its summary, in the order written; and the skipped schemes. Rows whose
// files were deleted since are left out.
struct IndexedReport {
  std::string rel;  // "sm90/llama/fp8-block"
  Json summary;
};
std::vector<IndexedReport> indexed_reports(const std::filesystem::path& out_root);
std::vector<SkippedRow> skipped_rows(const std::filesystem::path& out_root);

// A path component from free text ("NVIDIA H100 sm90" -> "NVIDIA-H100-sm90"): separators and
// other characters become '-', leading dots are dropped (never "." or ".."), at most 80
// characters (a longer name is cut and keeps a hash of the whole).
std::string path_safe(const std::string& s);

}  // namespace qparity::golden
