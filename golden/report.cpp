#include "golden/report.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <sstream>
#include <tuple>

#include "core/error.h"
#include "core/safetensors/safetensors_writer.h"

namespace qparity::golden {

namespace fs = std::filesystem;

namespace {

double num(const Json& j) {
  return json_double(j);
}

Json number(double v) {
  return json_number(v);
}

std::string fmt(double v, const char* f = "%.3g") {
  if (std::isnan(v)) return "n/a";
  if (std::isinf(v)) return v > 0 ? "inf" : "-inf";
  char b[64];
  std::snprintf(b, sizeof b, f, v);
  return b;
}

std::string html_escape(const std::string& s) {
  std::string o;
  for (char c : s) {
    switch (c) {
      case '<':
        o += "&lt;";
        break;
      case '>':
        o += "&gt;";
        break;
      case '&':
        o += "&amp;";
        break;
      case '"':
        o += "&quot;";
        break;
      default:
        o += c;
    }
  }
  return o;
}

void write_text(const fs::path& p, const std::string& text) {
  fs::create_directories(p.parent_path());
  write_file_atomic(
      p, std::span<const uint8_t>(reinterpret_cast<const uint8_t*>(text.data()), text.size()),
      OverwritePolicy::kReplace);
}

// A bar chart in inline SVG: one bar per value, log10 y axis when `log_y` (values <= 0 drawn at
// the floor), each bar titled with its label and value (hover).
std::string svg_bars(const std::string& title, const std::vector<std::string>& labels,
                     const std::vector<double>& values, bool log_y, const std::string& y_label,
                     double threshold = NAN) {
  const double w = 760, h = 220, left = 60, bottom = 30, top = 24;
  std::ostringstream s;
  s << "<figure><svg xmlns='http://www.w3.org/2000/svg' width='" << w << "' height='" << h
    << "' role='img'><title>" << html_escape(title) << "</title>";
  s << "<text x='" << left << "' y='16' font-size='13' font-family='sans-serif'>"
    << html_escape(title) << "</text>";
  std::vector<double> ys;
  for (double v : values)
    ys.push_back(log_y ? (v > 0 && std::isfinite(v) ? std::log10(v) : NAN)
                       : (std::isfinite(v) ? v : NAN));
  double lo = INFINITY, hi = -INFINITY;
  for (double y : ys)
    if (std::isfinite(y)) lo = std::min(lo, y), hi = std::max(hi, y);
  const double thr = log_y && threshold > 0 ? std::log10(threshold) : threshold;
  if (std::isfinite(thr)) lo = std::min(lo, thr), hi = std::max(hi, thr);
  if (!std::isfinite(lo)) {
    s << "<text x='" << left << "' y='" << h / 2
      << "' font-size='12' font-family='sans-serif'>no finite values (all zero: identical)"
      << "</text></svg></figure>";
    return s.str();
  }
  if (log_y) lo = std::floor(lo), hi = std::ceil(hi);
  if (!log_y) lo = std::min(lo, 0.0);
  if (hi <= lo) hi = lo + 1;
  const double pw = w - left - 10, ph = h - top - bottom;
  const auto ypix = [&](double y) { return top + ph - (y - lo) / (hi - lo) * ph; };
  // Axis and ticks.
  s << "<line x1='" << left << "' y1='" << top << "' x2='" << left << "' y2='" << top + ph
    << "' stroke='#444'/><line x1='" << left << "' y1='" << top + ph << "' x2='" << left + pw
    << "' y2='" << top + ph << "' stroke='#444'/>";
  const int ticks = log_y ? static_cast<int>(hi - lo) : 4;
  for (int i = 0; i <= ticks; ++i) {
    const double y = lo + (hi - lo) * i / std::max(ticks, 1);
    s << "<text x='" << left - 4 << "' y='" << ypix(y) + 4
      << "' font-size='10' text-anchor='end' font-family='sans-serif'>"
      << (log_y ? "1e" + fmt(y, "%.0f") : fmt(y)) << "</text>";
  }
  s << "<text x='12' y='" << top + ph / 2 << "' font-size='10' font-family='sans-serif' "
    << "transform='rotate(-90 12 " << top + ph / 2 << ")'>" << html_escape(y_label) << "</text>";
  const double bw = pw / static_cast<double>(std::max<size_t>(values.size(), 1));
  for (size_t i = 0; i < values.size(); ++i) {
    const double y = std::isfinite(ys[i]) ? ys[i] : lo;
    const double y0 = ypix(std::max(lo, log_y ? lo : 0.0)), y1 = ypix(y);
    s << "<rect x='" << left + bw * static_cast<double>(i) + 0.5 << "' y='" << std::min(y0, y1)
      << "' width='" << std::max(bw - 1, 0.5) << "' height='" << std::max(std::fabs(y0 - y1), 0.5)
      << "' fill='" << (std::isfinite(ys[i]) ? "#3b6ea5" : "#bbb") << "'><title>"
      << html_escape(i < labels.size() ? labels[i] : std::to_string(i)) << ": "
      << fmt(values[i], "%.4g") << "</title></rect>";
  }
  if (std::isfinite(thr))
    s << "<line x1='" << left << "' x2='" << left + pw << "' y1='" << ypix(thr) << "' y2='"
      << ypix(thr) << "' stroke='#c0392b' stroke-dasharray='4 3'><title>policy threshold "
      << fmt(threshold, "%.4g") << "</title></line>";
  s << "</svg></figure>";
  return s.str();
}

}  // namespace

std::string path_safe(const std::string& s) {
  std::string o;
  for (char c : s)
    o += (std::isalnum(static_cast<unsigned char>(c)) || c == '-' || c == '_' || c == '.' ||
          c == '+')
             ? c
             : '-';
  return o.empty() ? "unnamed" : o;
}

Json report_json(const CompareReport& r, const std::string& role) {
  const EndToEnd& e = r.e2e;
  double logits_rel = NAN, worst_rel = -1;
  std::string worst;
  for (const auto& p : r.points) {
    if (p.name == "logits") logits_rel = p.stats.rel_l2;
    if (p.name != "logits" && p.name.find("topk_ids") == std::string::npos &&
        p.stats.rel_l2 > worst_rel)
      worst_rel = p.stats.rel_l2, worst = p.name;
  }
  double flips = 0;
  int64_t tokens = 0;
  for (const auto& l : r.router)
    flips += static_cast<double>(l.flips.flipped), tokens += l.flips.tokens;
  double worst_expert_rel = -1;
  std::string worst_expert;
  for (const auto& l : r.experts)
    for (const auto& x : l.experts)
      if (!(x.rel_l2 <= worst_expert_rel)) {
        worst_expert_rel = x.rel_l2;
        worst_expert =
            l.point.substr(0, l.point.size() - 10) + "experts." + std::to_string(x.expert);
      }
  double max_sat = -1;
  int64_t zero_scales = 0;
  for (const auto& a : r.activation_stats)
    if (a.candidate && a.candidate->codes > 0) {
      max_sat = std::max(max_sat, static_cast<double>(a.candidate->saturated) /
                                      static_cast<double>(a.candidate->codes));
      zero_scales += a.candidate->zero_scales;
    }
  const std::string dev = device_key(r.candidate.device);
  bool gated = r.e2e_verdict.gated;  // a policy without gates for this role judges nothing
  for (const auto& p : r.points)
    gated = gated || p.verdict.gated;
  Json summary = {
      {"device", dev == "default" ? path_safe(r.candidate.device) : dev},
      {"device_name", r.candidate.device},
      {"model", r.candidate.model},
      {"scheme", r.candidate.scheme},
      {"baseline_scheme", r.golden.scheme},
      {"role", role},
      {"pass", r.pass},
      {"policy", r.policy_file.empty() || !gated ? Json(nullptr) : Json(r.policy_section)},
      {"positions", e.positions},
      {"kld_mean", number(e.kld_mean.value)},
      {"kld_mean_hi", number(e.kld_mean.hi)},
      {"kld_p99", number(e.kld_p99)},
      {"kld_max", number(e.kld_max)},
      {"top1", number(e.top1.value)},
      {"top1_lo", number(e.top1.lo)},
      {"dp_rms", number(e.dp_rms)},
      {"dln_ppl", number(e.dln_ppl.value)},
      {"dln_ppl_lo", number(e.dln_ppl.lo)},
      {"dln_ppl_hi", number(e.dln_ppl.hi)},
      {"ppl_ratio", number(e.ppl_ratio.value)},
      {"first_greedy_divergence", e.first_greedy_divergence},
      {"logits_rel_l2", number(logits_rel)},
      {"worst_point", worst},
      {"worst_point_rel_l2", number(worst_rel)},
      {"max_activation_saturation", max_sat >= 0 ? number(max_sat) : Json(nullptr)},
      {"activation_zero_scales", max_sat >= 0 ? Json(zero_scales) : Json(nullptr)},
      {"router_flip_rate",
       tokens > 0 ? number(flips / static_cast<double>(tokens)) : Json(nullptr)},
      {"worst_expert", worst_expert.empty() ? Json(nullptr) : Json(worst_expert)},
      {"worst_expert_rel_l2", worst_expert.empty() ? Json(nullptr) : number(worst_expert_rel)},
      {"first_failing_point", r.first_failing >= 0
                                  ? Json(r.points[static_cast<size_t>(r.first_failing)].name)
                                  : Json(nullptr)}};
  return {{"report_version", 1}, {"summary", summary}, {"compare", to_json(r)}};
}

std::string render_markdown(const Json& rep) {
  const Json& s = rep.at("summary");
  const Json& c = rep.at("compare");
  std::ostringstream o;
  o << "# " << s["model"].get<std::string>() << " — " << s["scheme"].get<std::string>() << " on "
    << s["device"].get<std::string>() << "\n\n";
  o << (s["role"] == "format"
            ? "What the format does to the model: the quantized reference against the "
              "unquantized reference (" +
                  s["baseline_scheme"].get<std::string>() + ").\n\n"
            : "The candidate engine against the reference golden of the same scheme.\n\n");
  o << "| metric | value |\n|---|---|\n";
  o << "| positions | " << s["positions"] << " |\n";
  o << "| mean KLD (95% upper) | " << fmt(num(s["kld_mean"]), "%.4g") << " ("
    << fmt(num(s["kld_mean_hi"]), "%.4g") << ") |\n";
  o << "| KLD p99 / max | " << fmt(num(s["kld_p99"]), "%.4g") << " / "
    << fmt(num(s["kld_max"]), "%.4g") << " |\n";
  o << "| top-1 agreement (95% lower) | " << fmt(num(s["top1"]), "%.4f") << " ("
    << fmt(num(s["top1_lo"]), "%.4f") << ") |\n";
  o << "| RMS Δp | " << fmt(num(s["dp_rms"]), "%.4g") << " |\n";
  o << "| Δ ln PPL [95%] | " << fmt(num(s["dln_ppl"]), "%.4g") << " ["
    << fmt(num(s["dln_ppl_lo"]), "%.4g") << ", " << fmt(num(s["dln_ppl_hi"]), "%.4g") << "] |\n";
  o << "| PPL ratio | " << fmt(num(s["ppl_ratio"]), "%.4g") << " |\n";
  o << "| first greedy divergence | " << s["first_greedy_divergence"] << " |\n";
  o << "| logits rel L2 | " << fmt(num(s["logits_rel_l2"])) << " |\n";
  o << "| worst capture point | " << s["worst_point"].get<std::string>() << " ("
    << fmt(num(s["worst_point_rel_l2"])) << ") |\n";
  if (!s["router_flip_rate"].is_null())
    o << "| MoE router flip rate | " << fmt(num(s["router_flip_rate"]), "%.4f") << " |\n";
  if (s.contains("worst_expert") && !s["worst_expert"].is_null())
    o << "| worst MoE expert (rel L2, routing-aligned) | " << s["worst_expert"].get<std::string>()
      << " (" << fmt(num(s["worst_expert_rel_l2"])) << ") |\n";
  if (s.contains("max_activation_saturation") && !s["max_activation_saturation"].is_null())
    o << "| activation saturation (worst layer) / zero scales | "
      << fmt(num(s["max_activation_saturation"]), "%.3g") << " / " << s["activation_zero_scales"]
      << " |\n";
  if (!s["policy"].is_null())
    o << "| policy | " << s["policy"].get<std::string>() << ": **"
      << (s["pass"].get<bool>() ? "pass" : "FAIL") << "** |\n";
  o << "\n## Capture points (execution order)\n\n| point | rel L2 | worst channel rel L2 | "
       "cosine | SQNR dB | verdict |\n|---|---|---|---|---|---|\n";
  for (const auto& p : c["points"]) {
    std::string verdict = !p["gated"].get<bool>() ? "-" : (p["pass"].get<bool>() ? "ok" : "FAIL");
    for (const auto& f : p["failures"])
      verdict += "; " + f.get<std::string>();
    o << "| " << p["name"].get<std::string>() << " | " << fmt(num(p["rel_l2"])) << " | "
      << fmt(num(p["max_col_rel_l2"])) << " | " << fmt(num(p["cosine"]), "%.6f") << " | "
      << fmt(num(p["sqnr_db"]), "%.1f") << " | " << verdict << " |\n";
  }
  if (!c["router"].empty()) {
    o << "\n## MoE router\n\n| layer | flipped / tokens |\n|---|---|\n";
    for (const auto& l : c["router"])
      o << "| " << l["point"].get<std::string>() << " | " << l["flipped"] << " / " << l["tokens"]
        << " |\n";
  }
  if (c.contains("experts") && !c["experts"].empty()) {
    o << "\n## MoE experts (outputs before the routing weight, on the experts both sides "
         "chose)\n\n| layer | compared / routed differently | expert: rel L2 (tokens) |\n"
         "|---|---|---|\n";
    for (const auto& l : c["experts"]) {
      o << "| " << l["point"].get<std::string>() << " | " << l["matched"] << " / " << l["unmatched"]
        << " | ";
      int i = 0;
      for (const auto& x : l["experts"])
        o << (i++ ? ", " : "") << x["expert"] << ": " << fmt(num(x["rel_l2"])) << " (" << x["pairs"]
          << ")";
      o << " |\n";
    }
  }
  if (!c["activation_stats"].empty()) {
    o << "\n## Activation quantization per layer (this run)\n\n| layer | codes | saturated | "
         "rate | zero scales / scales |\n|---|---|---|---|---|\n";
    for (const auto& a : c["activation_stats"]) {
      const Json& st = a["candidate"].is_null() ? a["golden"] : a["candidate"];
      o << "| " << a["name"].get<std::string>() << " | " << st["codes"] << " | " << st["saturated"]
        << " | " << fmt(num(st["saturation_rate"]), "%.3g") << " | " << st["zero_scales"] << " / "
        << st["scales"] << " |\n";
    }
  }
  if (!c["kv_error_by_position"].empty()) {
    o << "\n## Keys entering the KV cache: rel L2 by position (mean over layers)\n\n";
    int i = 0;
    for (const auto& v : c["kv_error_by_position"])
      o << (i++ ? ", " : "") << fmt(num(v));
    o << "\n";
  }
  o << "\nGolden: `" << c["golden"]["file"].get<std::string>() << "`; candidate: `"
    << c["candidate"]["file"].get<std::string>() << "`.\n";
  return o.str();
}

std::string render_html(const Json& rep) {
  const Json& s = rep.at("summary");
  const Json& c = rep.at("compare");
  std::ostringstream o;
  const std::string title = s["model"].get<std::string>() + " — " + s["scheme"].get<std::string>() +
                            " on " + s["device"].get<std::string>();
  o << "<!doctype html><html><head><meta charset='utf-8'><title>" << html_escape(title)
    << "</title><style>body{font-family:sans-serif;max-width:900px;margin:2em auto}"
       "table{border-collapse:collapse}td,th{border:1px solid #ccc;padding:2px 6px;"
       "font-size:13px}.fail{color:#c0392b;font-weight:bold}</style></head><body>";
  o << "<h1>" << html_escape(title) << "</h1>";
  // The summary table is the markdown's, line for line.
  std::istringstream md(render_markdown(rep));
  std::string line;
  bool in_table = false;
  o << "<table>";
  while (std::getline(md, line)) {
    if (line.rfind("| metric", 0) == 0) {
      in_table = true;
      continue;
    }
    if (!in_table) continue;
    if (line.rfind("|---", 0) == 0) continue;
    if (line.empty() || line[0] != '|') break;
    std::vector<std::string> cells;
    std::stringstream ls(line.substr(1));
    std::string cell;
    while (std::getline(ls, cell, '|'))
      cells.push_back(cell);
    o << "<tr><th>" << html_escape(cells.size() > 0 ? cells[0] : "") << "</th><td>"
      << html_escape(cells.size() > 1 ? cells[1] : "") << "</td></tr>";
  }
  o << "</table>";
  // Plots.
  std::vector<std::string> labels;
  std::vector<double> rel;
  double threshold = NAN;
  for (const auto& p : c["points"]) {
    if (p["name"].get<std::string>().find("topk_ids") != std::string::npos) continue;
    labels.push_back(p["name"].get<std::string>());
    rel.push_back(num(p["rel_l2"]));
  }
  o << "<h2>Error per capture point</h2>"
    << svg_bars("relative L2 per capture point, execution order (layer by layer)", labels, rel,
                true, "rel L2 (log10)", threshold);
  std::vector<double> kld;
  for (const auto& v : c["end_to_end"]["kld"])
    kld.push_back(num(v));
  {
    // Histogram of log10 KLD in 20 bins.
    std::vector<double> logs;
    for (double k : kld)
      logs.push_back(std::log10(std::max(k, 1e-16)));
    std::vector<std::string> bl;
    std::vector<double> counts;
    if (!logs.empty()) {
      const double lo = *std::min_element(logs.begin(), logs.end());
      const double hi = std::max(*std::max_element(logs.begin(), logs.end()), lo + 1e-9);
      const int bins = 20;
      counts.assign(bins, 0.0);
      for (double l : logs)
        counts[static_cast<size_t>(
            std::min(bins - 1, static_cast<int>((l - lo) / (hi - lo) * bins)))] += 1;
      for (int b = 0; b < bins; ++b)
        bl.push_back("KLD 1e" + fmt(lo + (hi - lo) * b / bins, "%.2f") + " .. 1e" +
                     fmt(lo + (hi - lo) * (b + 1) / bins, "%.2f"));
    }
    o << "<h2>Next-token KL divergence</h2>"
      << svg_bars("positions per log10(KLD) bin (left: smallest)", bl, counts, false, "positions");
  }
  std::vector<double> kv;
  std::vector<std::string> kvl;
  for (const auto& v : c["kv_error_by_position"]) {
    kvl.push_back("position " + std::to_string(kv.size()));
    kv.push_back(num(v));
  }
  if (!kv.empty())
    o << "<h2>KV cache</h2>"
      << svg_bars("keys entering the cache (rope_k): rel L2 by position, mean over layers", kvl, kv,
                  true, "rel L2 (log10)");
  std::vector<double> flips;
  std::vector<std::string> fl;
  for (const auto& l : c["router"]) {
    fl.push_back(l["point"].get<std::string>());
    flips.push_back(num(l["flip_rate"]));
  }
  if (!flips.empty())
    o << "<h2>MoE router</h2>"
      << svg_bars("top-k flip rate per MoE layer", fl, flips, false, "flip rate");
  if (c.contains("experts"))
    for (const auto& l : c["experts"]) {
      std::vector<std::string> el;
      std::vector<double> er;
      for (const auto& x : l["experts"]) {
        el.push_back("expert " + std::to_string(x["expert"].get<int64_t>()) + " (" +
                     std::to_string(x["pairs"].get<int64_t>()) + " tokens)");
        er.push_back(num(x["rel_l2"]));
      }
      if (!er.empty())
        o << svg_bars(l["point"].get<std::string>() + ": rel L2 per expert (routing-aligned)", el,
                      er, true, "rel L2 (log10)");
    }
  o << "<h2>Capture points</h2><table><tr><th>point</th><th>rel L2</th><th>worst channel</th>"
       "<th>cosine</th><th>SQNR dB</th><th>verdict</th></tr>";
  for (const auto& p : c["points"]) {
    const bool fail = p["gated"].get<bool>() && !p["pass"].get<bool>();
    std::string verdict = !p["gated"].get<bool>() ? "-" : (fail ? "FAIL" : "ok");
    for (const auto& f : p["failures"])
      verdict += "; " + f.get<std::string>();
    o << "<tr><td>" << html_escape(p["name"].get<std::string>()) << "</td><td>"
      << fmt(num(p["rel_l2"])) << "</td><td>" << fmt(num(p["max_col_rel_l2"])) << "</td><td>"
      << fmt(num(p["cosine"]), "%.6f") << "</td><td>" << fmt(num(p["sqnr_db"]), "%.1f")
      << "</td><td" << (fail ? " class='fail'" : "") << ">" << html_escape(verdict) << "</td></tr>";
  }
  o << "</table><p>Rendered from " << html_escape(s["scheme"].get<std::string>())
    << ".json (the source of this page).</p></body></html>\n";
  return o.str();
}

ReportFiles write_report(const Json& rep, const fs::path& root) {
  const Json& s = rep.at("summary");
  const fs::path dir =
      root / path_safe(s["device"].get<std::string>()) / path_safe(s["model"].get<std::string>());
  const std::string base = path_safe(s["scheme"].get<std::string>());
  ReportFiles f{dir / (base + ".json"), dir / (base + ".md"), dir / (base + ".html")};
  write_text(f.json, rep.dump(1) + "\n");
  write_text(f.md, render_markdown(rep));
  write_text(f.html, render_html(rep));
  return f;
}

void write_index(const fs::path& root) {
  struct Row {
    std::string device, model, scheme, rel;
    Json s;
  };
  std::vector<Row> rows;
  if (fs::exists(root))
    for (const auto& dev : fs::directory_iterator(root)) {
      if (!dev.is_directory()) continue;
      for (const auto& model : fs::directory_iterator(dev.path())) {
        if (!model.is_directory()) continue;
        for (const auto& f : fs::directory_iterator(model.path())) {
          if (f.path().extension() != ".json") continue;
          Json j;
          try {
            j = read_json_file(f.path());
          } catch (const std::exception&) {
            continue;  // not a report
          }
          if (!j.contains("summary")) continue;
          rows.push_back({dev.path().filename().string(), model.path().filename().string(),
                          f.path().stem().string(),
                          fs::relative(f.path(), root).replace_extension("").string(),
                          j["summary"]});
        }
      }
    }
  std::sort(rows.begin(), rows.end(), [](const Row& a, const Row& b) {
    return std::tie(a.model, a.scheme, a.device) < std::tie(b.model, b.scheme, b.device);
  });
  std::ostringstream md, html;
  md << "# qparity accuracy reports\n\nSchemes × metrics × devices. Format rows compare the "
        "quantized reference with the unquantized one; engine rows a candidate engine with the "
        "reference golden of its scheme.\n\n"
     << "| model | scheme | device | role | mean KLD | top-1 | Δ ln PPL | logits rel L2 | worst "
        "point (rel L2) | router flips | act. saturation | policy |\n"
        "|---|---|---|---|---|---|---|---|---|---|---|---|\n";
  html << "<!doctype html><html><head><meta charset='utf-8'><title>qparity accuracy "
          "reports</title><style>body{font-family:sans-serif;margin:2em}table{border-collapse:"
          "collapse}td,th{border:1px solid #ccc;padding:2px 6px;font-size:13px}.fail{color:"
          "#c0392b}</style></head><body><h1>qparity accuracy reports</h1><table><tr><th>model"
          "</th><th>scheme</th><th>device</th><th>role</th><th>mean KLD</th><th>top-1</th><th>"
          "Δ ln PPL</th><th>logits rel L2</th><th>worst point</th><th>router flips</th><th>"
          "act. saturation</th><th>policy</th></tr>";
  for (const Row& r : rows) {
    const Json& s = r.s;
    const std::string policy =
        s["policy"].is_null() ? "-" : (s["pass"].get<bool>() ? "pass" : "FAIL");
    const std::string flips =
        s["router_flip_rate"].is_null() ? "-" : fmt(num(s["router_flip_rate"]), "%.3f");
    const std::string sat =
        !s.contains("max_activation_saturation") || s["max_activation_saturation"].is_null()
            ? "-"
            : fmt(num(s["max_activation_saturation"]), "%.2g");
    const std::string cells[] = {
        r.model,
        r.scheme,
        r.device,
        s.value("role", ""),
        fmt(num(s["kld_mean"]), "%.3g"),
        fmt(num(s["top1"]), "%.3f"),
        fmt(num(s["dln_ppl"]), "%.3g"),
        fmt(num(s["logits_rel_l2"])),
        s["worst_point"].get<std::string>() + " (" + fmt(num(s["worst_point_rel_l2"])) + ")",
        flips,
        sat,
        policy};
    md << "|";
    html << "<tr>";
    for (size_t i = 0; i < std::size(cells); ++i) {
      md << " " << (i == 1 ? "[" + cells[i] + "](" + r.rel + ".md)" : cells[i]) << " |";
      html << "<td" << (cells[i] == "FAIL" ? " class='fail'" : "") << ">"
           << (i == 1
                   ? "<a href='" + html_escape(r.rel) + ".html'>" + html_escape(cells[i]) + "</a>"
                   : html_escape(cells[i]))
           << "</td>";
    }
    md << "\n";
    html << "</tr>";
  }
  html << "</table></body></html>\n";
  write_text(root / "index.md", md.str());
  write_text(root / "index.html", html.str());
}

}  // namespace qparity::golden
