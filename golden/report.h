#pragma once
// Accuracy reports: reports/<device>/<model>/<scheme>.{json,md,html} and reports/index.{md,html}
// (schemes x metrics x devices). The JSON is the source (compare.h's to_json plus a summary);
// markdown and a self-contained HTML page with inline SVG plots (error per capture point by
// layer, KLD histogram, KV error against position, MoE router flip rate) are rendered from it.
// Reports are generated artefacts: rewriting them is expected (each write is still atomic).
#include <filesystem>
#include <string>

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

// Writes the three files under out_root/<device>/<model>/<scheme>.*; device, model and scheme
// come from the report (candidate's device key and model, and its scheme).
ReportFiles write_report(const Json& report, const std::filesystem::path& out_root);

// Rebuilds out_root/index.{md,html} from every out_root/*/*/*.json report.
void write_index(const std::filesystem::path& out_root);

// A path component from free text ("NVIDIA H100 sm90" -> "NVIDIA-H100-sm90").
std::string path_safe(const std::string& s);

}  // namespace qparity::golden
