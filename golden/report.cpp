#include "golden/report.h"

#include <fcntl.h>
#include <sys/file.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <map>
#include <optional>
#include <sstream>
#include <tuple>
#include "core/capture/capture_points.h"

#include "core/error.h"
#include "core/safetensors/safetensors_writer.h"
#include "core/sha256.h"
#include "schemes/description/scheme_bits.h"

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

// A bar chart in inline SVG, readable without hovering: labelled axes, x tick labels under the
// bars (every k-th when crowded), a per-bar limit drawn as a red tick, exact zeros and NaN/Inf
// drawn as distinct marks with a legend, and bars no wider than 48 px.
struct BarChart {
  std::string title, y_label, x_label;
  std::vector<std::string> labels;  // hover text per bar
  std::vector<std::string> ticks;   // x tick label per bar ("" for none)
  std::vector<double> values;
  std::vector<double> limits;  // per bar; NaN where none
  bool log_y = false;
  bool integer_y = false;
};

std::string svg_bars(const BarChart& c) {
  const size_t n = c.values.size();
  size_t longest = 0;
  for (const auto& t : c.ticks)
    longest = std::max(longest, t.size());
  const double left = 64, right = 12, top = 40;  // title on the first line, legend on the second
  const double bottom = 34 + std::min<double>(static_cast<double>(longest) * 5.2, 150);
  const double bw = n == 0 ? 0 : std::min(48.0, 700.0 / static_cast<double>(n));
  const double pw = std::max(420.0, bw * static_cast<double>(n)), ph = 170;
  const double w = left + pw + right, h = top + ph + bottom;
  std::ostringstream s;
  s << "<figure><svg xmlns='http://www.w3.org/2000/svg' width='" << w << "' height='" << h
    << "' role='img' font-family='sans-serif'><title>" << html_escape(c.title) << "</title>";
  s << "<text x='" << left << "' y='16' font-size='13'>" << html_escape(c.title) << "</text>";
  const auto y_of = [&](double v) {
    return c.log_y ? (v > 0 && std::isfinite(v) ? std::log10(v) : NAN)
                   : (std::isfinite(v) ? v : NAN);
  };
  double lo = INFINITY, hi = -INFINITY;
  for (size_t i = 0; i < n; ++i)
    for (double v : {c.values[i], i < c.limits.size() ? c.limits[i] : NAN}) {
      const double y = y_of(v);
      if (std::isfinite(y)) lo = std::min(lo, y), hi = std::max(hi, y);
    }
  bool any_zero = false, any_bad = false;
  for (double v : c.values) {
    any_zero = any_zero || v == 0;
    any_bad = any_bad || !std::isfinite(v);
  }
  if (!std::isfinite(lo)) lo = c.log_y ? -16 : 0, hi = c.log_y ? -15 : 1;
  if (c.log_y) lo = std::floor(lo), hi = std::ceil(hi);
  if (!c.log_y) lo = std::min(lo, 0.0);
  if (hi <= lo) hi = lo + 1;
  // Counts: whole-number ticks at a step of 1, 2, 5, 10, ... with the axis ending on one.
  double count_step = 1;
  if (c.integer_y) {
    for (double mag = 1; std::ceil(hi / count_step) > 6; mag *= 10)
      for (const double m : {1.0, 2.0, 5.0})
        if (std::ceil(hi / count_step) > 6) count_step = m * mag;
    hi = std::max(count_step, std::ceil(hi / count_step) * count_step);
    lo = 0;
  }
  const auto ypix = [&](double y) { return top + ph - (y - lo) / (hi - lo) * ph; };
  // Axes, y ticks (whole decades on a log axis, whole numbers for counts).
  s << "<line x1='" << left << "' y1='" << top << "' x2='" << left << "' y2='" << top + ph
    << "' stroke='#444'/><line x1='" << left << "' y1='" << top + ph << "' x2='" << left + pw
    << "' y2='" << top + ph << "' stroke='#444'/>";
  int ticks = c.log_y ? static_cast<int>(hi - lo) : 4;
  if (c.integer_y) ticks = static_cast<int>(std::lround(hi / count_step));
  const int step = c.log_y ? std::max(1, ticks / 8) : 1;
  for (int i = 0; i <= ticks; i += step) {
    double y = lo + (hi - lo) * i / std::max(ticks, 1);
    if (c.integer_y) y = std::round(y);
    s << "<line x1='" << left - 3 << "' x2='" << left << "' y1='" << ypix(y) << "' y2='" << ypix(y)
      << "' stroke='#444'/><text x='" << left - 5 << "' y='" << ypix(y) + 4
      << "' font-size='10' text-anchor='end'>"
      << (c.log_y       ? "1e" + fmt(y, "%.0f")
          : c.integer_y ? fmt(y, "%.0f")
                        : fmt(y))
      << "</text>";
  }
  s << "<text x='12' y='" << top + ph / 2 << "' font-size='10' text-anchor='middle' "
    << "transform='rotate(-90 12 " << top + ph / 2 << ")'>" << html_escape(c.y_label) << "</text>";
  // Bars, limits, x ticks.
  const size_t every = std::max<size_t>(1, static_cast<size_t>(std::ceil(9.0 / std::max(bw, 1.0))));
  for (size_t i = 0; i < n; ++i) {
    const double x = left + bw * static_cast<double>(i);
    const double v = c.values[i], y = y_of(v);
    const std::string hover =
        html_escape(i < c.labels.size() ? c.labels[i] : std::to_string(i)) + ": " + fmt(v, "%.4g");
    if (!std::isfinite(v)) {  // NaN/Inf: a full-height red hatch
      s << "<rect x='" << x + 0.5 << "' y='" << top << "' width='" << std::max(bw - 1, 1.0)
        << "' height='" << ph << "' fill='#e74c3c' opacity='0.35'><title>" << hover
        << "</title></rect>";
    } else if (!std::isfinite(y)) {  // exact zero on a log axis: a green mark on the floor
      s << "<rect x='" << x + 0.5 << "' y='" << top + ph - 4 << "' width='" << std::max(bw - 1, 1.0)
        << "' height='4' fill='#27ae60'><title>" << hover << " (exact)</title></rect>";
    } else {
      const double y0 = ypix(c.log_y ? lo : std::max(lo, 0.0)), y1 = ypix(y);
      s << "<rect x='" << x + 0.5 << "' y='" << std::min(y0, y1) << "' width='"
        << std::max(bw - 1, 1.0) << "' height='" << std::max(std::fabs(y0 - y1), 1.0)
        << "' fill='#3b6ea5'><title>" << hover << "</title></rect>";
    }
    const double lim = i < c.limits.size() ? y_of(c.limits[i]) : NAN;
    if (std::isfinite(lim))
      s << "<line x1='" << x << "' x2='" << x + bw << "' y1='" << ypix(lim) << "' y2='" << ypix(lim)
        << "' stroke='#c0392b' stroke-width='2'><title>policy limit " << fmt(c.limits[i], "%.4g")
        << "</title></line>";
    if (i < c.ticks.size() && !c.ticks[i].empty() && i % every == 0) {
      const double tx = x + bw / 2, ty = top + ph + 8;
      s << "<text x='" << tx << "' y='" << ty << "' font-size='9' text-anchor='end' "
        << "transform='rotate(-60 " << tx << " " << ty << ")'>" << html_escape(c.ticks[i])
        << "</text>";
    }
  }
  if (!c.x_label.empty())
    s << "<text x='" << left + pw / 2 << "' y='" << h - 4 << "' font-size='10' "
      << "text-anchor='middle'>" << html_escape(c.x_label) << "</text>";
  // Legend for the marks that are not plain bars.
  double lx = left;
  const auto key = [&](const char* color, const char* text) {
    s << "<rect x='" << lx << "' y='23' width='10' height='10' fill='" << color << "'/><text x='"
      << lx + 14 << "' y='32' font-size='10'>" << text << "</text>";
    lx += 14 + 6.0 * static_cast<double>(std::strlen(text)) + 14;
  };
  bool any_limit = false;
  for (double l : c.limits)
    any_limit = any_limit || std::isfinite(y_of(l));
  if (any_limit) key("#c0392b", "policy limit");
  if (any_zero && c.log_y) key("#27ae60", "exact (0)");
  if (any_bad) key("#e74c3c", "NaN/Inf");
  s << "</svg></figure>";
  return s.str();
}

// "layers.3.attn.qkv" -> "3 attn.qkv": tick labels short enough to sit under a bar.
std::string short_point(const std::string& name) {
  return name.rfind("layers.", 0) == 0 ? name.substr(7) : name;
}

}  // namespace

std::string path_safe(const std::string& s) {
  // One component of a path, from text a file supplied (a device, model or scheme name): no
  // separator, no leading dot (so never "." or ".."), and bounded, so that it can only name a
  // file inside the folder it is joined to.
  std::string o;
  for (char c : s)
    o += (std::isalnum(static_cast<unsigned char>(c)) || c == '-' || c == '_' || c == '.' ||
          c == '+')
             ? c
             : '-';
  size_t lead = 0;
  while (lead < o.size() && o[lead] == '.')
    ++lead;
  o = o.substr(lead);
  constexpr size_t kMax = 80;
  if (o.size() > kMax) {
    // Cut, and keep names apart by a hash of the whole text.
    Sha256 h;
    h.update(s);
    o = o.substr(0, kMax - 17) + "-" + h.hex().substr(0, 16);
  }
  return o.empty() ? "unnamed" : o;
}

namespace {

// Whether anything but the budget failed: NaN/Inf, a missing point, a judged point gate, the
// section's own end-to-end gates (the format role's "does it do the format's math").
bool math_failures(const CompareReport& r) {
  for (const auto& f : r.failures)
    if (f.rfind("budget: ", 0) != 0) return true;
  return false;
}

}  // namespace

namespace {

// The candidate dump's bytes, hashed: what tells two dumps of one engine on one device apart
// (a report row's identity). "" when the file is gone.
std::string file_sha256(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  if (path.empty() || !f) return "";
  Sha256 h;
  std::vector<char> buf(1 << 20);
  while (f) {
    f.read(buf.data(), static_cast<std::streamsize>(buf.size()));
    h.update(std::string_view(buf.data(), static_cast<size_t>(f.gcount())));
  }
  return h.hex();
}

}  // namespace

Json report_json(const CompareReport& r, const std::string& role) {
  const EndToEnd& e = r.e2e;
  double logits_rel = NAN, worst_rel = -1;
  std::string worst;
  for (const auto& p : r.points) {
    if (p.name == point::kLogits) logits_rel = p.stats.rel_l2;
    if (p.name != point::kLogits && p.name.find("topk_ids") == std::string::npos &&
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
  int64_t nonfinite_points = 0;
  for (const auto& p : r.points)
    nonfinite_points += !nonfinite_failures(p.stats).empty();
  Json summary = {
      {"device", dev == "default" ? path_safe(r.candidate.device) : dev},
      {"device_name", r.candidate.device},
      {"model", r.candidate.model},
      {"scheme", r.candidate.scheme},
      {"baseline_scheme", r.golden.scheme},
      {"model_dtype", r.golden.model_dtype},
      {"golden_mode", r.golden.precision_mode},
      {"role", role},
      {"verdict", to_string(r.verdict)},
      {"pass", r.pass},
      {"failures", r.failures},
      {"policy", r.policy_file.empty() ? Json(nullptr) : Json(r.policy_section)},
      {"judged_by", judged_by_text(r)},
      {"run", to_string(r.candidate.run_mode)},
      {"nonfinite_points", nonfinite_points},
      {"nonfinite_logit_rows", e.nonfinite_candidate_rows + e.nonfinite_golden_rows},
      {"missing_points", r.missing_in_candidate.size()},
      {"missing_points_failing", r.missing_failures.size()},
      {"declared_absent_points", r.declared_absent.size()},
      {"engine", r.candidate.producer},
      {"engine_version", r.candidate.producer_version},
      {"candidate_sha256", file_sha256(r.candidate_file)},
      {"math_check", role == "format" && !r.policy_file.empty()
                         ? Json(math_failures(r) ? "FAIL" : "ok")
                         : Json(nullptr)},
      {"budget_check", r.has_budget ? Json(budget_check_text(r.budget_verdict)) : Json(nullptr)},
      {"budget_source", r.has_budget ? Json(r.budget_source) : Json(nullptr)},
      {"notes", r.warnings},  // compare's warnings lead; callers append their own notes
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

namespace {

// A markdown cell as HTML: escaped, with **bold** and `code` spans.
std::string md_inline_html(const std::string& cell) {
  std::string o, e = html_escape(cell);
  bool bold = false, code = false;
  for (size_t i = 0; i < e.size(); ++i) {
    if (e.compare(i, 2, "**") == 0) {
      o += bold ? "</strong>" : "<strong>";
      bold = !bold;
      ++i;
    } else if (e[i] == '`') {
      o += code ? "</code>" : "<code>";
      code = !code;
    } else {
      o += e[i];
    }
  }
  if (bold) o += "</strong>";
  if (code) o += "</code>";
  return o;
}

// "PASS" / "FAIL" / "NOT JUDGED" of a summary (older reports carry only "pass").
std::string point_verdict_word(const Json& s) {
  if (s.contains("verdict")) return s["verdict"].get<std::string>();
  return s["pass"].get<bool>() ? "PASS" : "FAIL";
}

// One point's verdict cell: ok / FAIL / "outside" (outside a gate that does not judge this run) /
// "-" (no gate).
std::string point_cell(const Json& p) {
  const bool pass = p["pass"].get<bool>(), gated = p["gated"].get<bool>();
  const bool judged = p.value("judged", gated);
  if (pass) return gated ? "ok" : "-";
  const bool nonfinite = p.value("nan_candidate", int64_t{0}) +
                             p.value("inf_candidate", int64_t{0}) +
                             p.value("nan_golden", int64_t{0}) + p.value("inf_golden", int64_t{0}) >
                         0;
  return judged || nonfinite ? "FAIL" : "outside (not judged)";
}

}  // namespace

namespace {

// What the KV-by-position numbers measure: the quantized cache's contents, or (no cache points:
// an unquantized cache) the keys entering it.
std::string kv_title(const Json& c) {
  return c.value("kv_error_source", std::string("attn.rope_k")) == "attn.rope_k"
             ? "Keys entering the KV cache (rope_k): rel L2 by position, mean over layers"
             : "What the quantized KV cache holds (k_cache, v_cache): rel L2 by position, mean "
               "over layers and K/V";
}

}  // namespace

std::string render_markdown(const Json& rep) {
  const Json& s = rep.at("summary");
  const Json& c = rep.at("compare");
  std::ostringstream o;
  o << "# " << s["model"].get<std::string>() << " — " << s["scheme"].get<std::string>() << " on "
    << s["device"].get<std::string>() << "\n\n";
  if (s.value("role", std::string()) == "engine" && s.contains("engine"))
    o << "Engine: `" << s["engine"].get<std::string>() << "` "
      << s.value("engine_version", std::string()) << " on " << s.value("device_name", std::string())
      << ".\n\n";
  const std::string dtype = s.value("model_dtype", std::string());
  const std::string mode = s.value("golden_mode", std::string());
  const std::string arithmetic =
      mode == "exact"     ? "computed in fp64, rounding only where the format rounds"
      : mode == "emulate" ? "computed in fp64, stored activations rounded to the model dtype as an "
                            "engine stores them"
                          : mode;
  const std::string baseline =
      s["baseline_scheme"].get<std::string>() == "bf16"
          ? "unquantized" + (dtype.empty() ? "" : " " + dtype + " checkpoint")
          : s["baseline_scheme"].get<std::string>();
  o << (s["role"] == "format"
            ? "What the format does to the model: the quantized reference against the "
              "reference of the " +
                  baseline + (arithmetic.empty() ? "" : ", " + arithmetic) + ".\n\n"
            : "The candidate engine against the reference golden of the same scheme (" + baseline +
                  (arithmetic.empty() ? "" : ", " + arithmetic) + ").\n\n");
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
  if (const Json& e = c.value("end_to_end", Json::object()); e.contains("ppl_golden"))
    o << "| PPL golden → candidate | " << fmt(num(e["ppl_golden"]), "%.5g") << " → "
      << fmt(num(e["ppl_candidate"]), "%.5g") << " |\n";
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
  if (s.value("nonfinite_points", 0) + s.value("nonfinite_logit_rows", 0) > 0)
    o << "| NaN/Inf | " << s["nonfinite_points"] << " capture point(s), "
      << s["nonfinite_logit_rows"] << " logit row(s) |\n";
  if (s.value("declared_absent_points", 0) > 0)
    o << "| capture points the candidate's engine declares it cannot expose | "
      << s["declared_absent_points"] << " (listed in the JSON's compare.declared_absent) |\n";
  if (s.value("missing_points", 0) > 0)
    o << "| capture points missing in the candidate | " << s["missing_points"] << " ("
      << s["missing_points_failing"] << " not allowed by the policy) |\n";
  o << "| judged by | " << s.value("judged_by", "") << " |\n";
  if (s.contains("math_check") && !s["math_check"].is_null())
    o << "| does it do the format's math (first op) | " << s["math_check"].get<std::string>()
      << " |\n";
  if (s.contains("budget_check") && !s["budget_check"].is_null())
    o << "| is it acceptable for this model (budget: " << s["budget_source"].get<std::string>()
      << ") | " << s["budget_check"].get<std::string>() << " |\n";
  if (s.contains("notes"))
    for (const auto& n : s["notes"])
      o << "| note | " << n.get<std::string>() << " |\n";
  o << "| verdict | **" << point_verdict_word(s) << "**";
  if (s.contains("failures") && !s["failures"].empty())
    o << ": " << s["failures"][0].get<std::string>()
      << (s["failures"].size() > 1 ? " (and " + std::to_string(s["failures"].size() - 1) + " more)"
                                   : std::string());
  o << " |\n";
  o << "\n## Capture points (execution order)\n\n| point | rel L2 | worst channel rel L2 | "
       "cosine | SQNR dB | NaN/Inf | verdict |\n|---|---|---|---|---|---|---|\n";
  for (const auto& p : c["points"]) {
    std::string verdict = point_cell(p);
    for (const auto& f : p["failures"])
      verdict += "; " + f.get<std::string>();
    const int64_t bad = p.value("nan_candidate", int64_t{0}) +
                        p.value("inf_candidate", int64_t{0}) + p.value("nan_golden", int64_t{0}) +
                        p.value("inf_golden", int64_t{0});
    o << "| " << p["name"].get<std::string>() << " | " << fmt(num(p["rel_l2"])) << " | "
      << fmt(num(p["max_col_rel_l2"])) << " | " << fmt(num(p["cosine"]), "%.6f") << " | "
      << fmt(num(p["sqnr_db"]), "%.1f") << " | " << (bad ? std::to_string(bad) : "-") << " | "
      << verdict << " |\n";
  }
  if (c.contains("detection_limits") && !c["detection_limits"].empty()) {
    o << "\n## Detection limit: what this run's gates exclude\n\nAn error planted on this "
         "candidate's own values, confined to one slice of a point (the slice times 1 + e), "
         "fails the point's gate from the size below on (grid 2^-14 .. 2^2 in half octaves). A "
         "PASS here excludes a fault of that size or larger on such a slice; a smaller one may "
         "pass.\n\n| point | slice (index) | smallest relative error caught |\n|---|---|---|\n";
    for (const auto& d : c["detection_limits"])
      o << "| " << d["point"].get<std::string>() << " | " << d["slice"].get<std::string>() << " ("
        << d["index"] << ") | "
        << (d["smallest_caught"].is_null() ? std::string("not caught up to 4 (400 %)")
                                           : fmt(num(d["smallest_caught"]), "%.3g"))
        << " |\n";
  }
  if (c.contains("missing_in_candidate") && !c["missing_in_candidate"].empty()) {
    o << "\nMissing in the candidate:";
    for (const auto& m : c["missing_in_candidate"])
      o << " `" << m.get<std::string>() << "`";
    o << "\n";
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
    o << "\n## " << kv_title(c) << "\n\n";
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
       "font-size:13px}.fail{color:#c0392b;font-weight:bold}.pass{color:#1e7b34;font-weight:bold}"
       ".unjudged{color:#8a6d00;font-weight:bold}</style></head><body>";
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
    const std::string value = cells.size() > 1 ? cells[1] : "";
    const std::string cls = value.find("**FAIL") != std::string::npos         ? " class='fail'"
                            : value.find("**PASS") != std::string::npos       ? " class='pass'"
                            : value.find("**NOT JUDGED") != std::string::npos ? " class='unjudged'"
                                                                              : "";
    o << "<tr><th>" << html_escape(cells.size() > 0 ? cells[0] : "") << "</th><td" << cls << ">"
      << md_inline_html(value) << "</td></tr>";
  }
  o << "</table>";
  // Plots.
  {
    BarChart chart;
    chart.title = "relative L2 per capture point, execution order (layer by layer)";
    chart.y_label = "rel L2 (log10)";
    chart.x_label = "capture point (layer index, point)";
    chart.log_y = true;
    for (const auto& p : c["points"]) {
      const std::string name = p["name"].get<std::string>();
      if (name.find("topk_ids") != std::string::npos) continue;
      chart.labels.push_back(name);
      chart.ticks.push_back(short_point(name));
      chart.values.push_back(num(p["rel_l2"]));
      chart.limits.push_back(p.contains("limit_rel_l2") && !p["limit_rel_l2"].is_null()
                                 ? num(p["limit_rel_l2"])
                                 : NAN);
    }
    o << "<h2>Error per capture point</h2>" << svg_bars(chart);
  }
  {
    // Histogram of log10 KLD in 20 bins; positions with KLD <= 1e-16 (identical) fall in the
    // first bin, which says so.
    BarChart chart;
    chart.title = "positions per KL divergence bin";
    chart.y_label = "positions";
    chart.x_label = "KL divergence of the next-token distribution (log scale)";
    chart.integer_y = true;
    std::vector<double> logs;
    int64_t infinite = 0;
    for (const auto& v : c["end_to_end"]["kld"]) {
      const double k = num(v);
      if (!std::isfinite(k)) {
        ++infinite;
        continue;
      }
      logs.push_back(std::log10(std::max(k, 1e-16)));
    }
    if (!logs.empty()) {
      const double lo = *std::min_element(logs.begin(), logs.end());
      const double hi = std::max(*std::max_element(logs.begin(), logs.end()), lo + 1e-9);
      const int bins = 20;
      chart.values.assign(bins, 0.0);
      for (double l : logs)
        chart.values[static_cast<size_t>(
            std::min(bins - 1, static_cast<int>((l - lo) / (hi - lo) * bins)))] += 1;
      for (int b = 0; b < bins; ++b) {
        const double a = lo + (hi - lo) * b / bins, z = lo + (hi - lo) * (b + 1) / bins;
        chart.labels.push_back("KLD " + fmt(std::pow(10.0, a), "%.2g") + " .. " +
                               fmt(std::pow(10.0, z), "%.2g"));
        chart.ticks.push_back(b % 4 == 0 ? fmt(std::pow(10.0, a), "%.1e") : "");
      }
    }
    if (infinite > 0) {
      chart.values.push_back(static_cast<double>(infinite));
      chart.labels.push_back("NaN/Inf logits (KLD +inf)");
      chart.ticks.push_back("+inf");
    }
    o << "<h2>Next-token KL divergence</h2>" << svg_bars(chart);
  }
  if (!c["kv_error_by_position"].empty()) {
    BarChart chart;
    chart.title = kv_title(c);
    chart.y_label = "rel L2 (log10)";
    chart.x_label = "position in the sequence";
    chart.log_y = true;
    for (const auto& v : c["kv_error_by_position"]) {
      const size_t i = chart.values.size();
      chart.labels.push_back("position " + std::to_string(i));
      chart.ticks.push_back(i % 4 == 0 ? std::to_string(i) : "");
      chart.values.push_back(num(v));
    }
    o << "<h2>KV cache</h2>" << svg_bars(chart);
  }
  if (!c["router"].empty()) {
    BarChart chart;
    chart.title = "top-k flip rate per MoE layer";
    chart.y_label = "flip rate";
    chart.x_label = "MoE layer";
    for (const auto& l : c["router"]) {
      const std::string name = l["point"].get<std::string>();
      chart.labels.push_back(name + " (" + std::to_string(l["flipped"].get<int64_t>()) + " of " +
                             std::to_string(l["tokens"].get<int64_t>()) + " tokens)");
      chart.ticks.push_back(short_point(name));
      chart.values.push_back(num(l["flip_rate"]));
    }
    o << "<h2>MoE router</h2>" << svg_bars(chart);
  }
  if (c.contains("experts"))
    for (const auto& l : c["experts"]) {
      BarChart chart;
      chart.title = l["point"].get<std::string>() + ": rel L2 per expert (routing-aligned)";
      chart.y_label = "rel L2 (log10)";
      chart.x_label = "expert id";
      chart.log_y = true;
      for (const auto& x : l["experts"]) {
        const int64_t id = x["expert"].get<int64_t>();
        chart.labels.push_back("expert " + std::to_string(id) + " (" +
                               std::to_string(x["pairs"].get<int64_t>()) + " tokens)");
        chart.ticks.push_back(std::to_string(id));
        chart.values.push_back(num(x["rel_l2"]));
      }
      if (!chart.values.empty()) o << svg_bars(chart);
    }
  o << "<h2>Capture points</h2><table><tr><th>point</th><th>rel L2</th><th>limit</th>"
       "<th>worst channel</th><th>cosine</th><th>SQNR dB</th><th>NaN/Inf</th><th>verdict</th>"
       "</tr>";
  for (const auto& p : c["points"]) {
    std::string verdict = point_cell(p);
    const bool fail = verdict == "FAIL";
    for (const auto& f : p["failures"])
      verdict += "; " + f.get<std::string>();
    const int64_t bad = p.value("nan_candidate", int64_t{0}) +
                        p.value("inf_candidate", int64_t{0}) + p.value("nan_golden", int64_t{0}) +
                        p.value("inf_golden", int64_t{0});
    const std::string limit = p.contains("limit_rel_l2") && !p["limit_rel_l2"].is_null()
                                  ? fmt(num(p["limit_rel_l2"]))
                                  : "-";
    o << "<tr><td>" << html_escape(p["name"].get<std::string>()) << "</td><td>"
      << fmt(num(p["rel_l2"])) << "</td><td>" << limit << "</td><td>"
      << fmt(num(p["max_col_rel_l2"])) << "</td><td>" << fmt(num(p["cosine"]), "%.6f")
      << "</td><td>" << fmt(num(p["sqnr_db"]), "%.1f") << "</td><td"
      << (bad ? " class='fail'>" + std::to_string(bad) : std::string(">-")) << "</td><td"
      << (fail ? " class='fail'" : "") << ">" << html_escape(verdict) << "</td></tr>";
  }
  o << "</table><p>Rendered from " << html_escape(s["scheme"].get<std::string>())
    << ".json (the source of this page).</p></body></html>\n";
  return o.str();
}

namespace {

constexpr const char* kManifest = "index.json";

// What this tool wrote under a root: reports (paths relative to it, without extension) and
// schemes it skipped. The index lists these and nothing else, so a stray *.json in the folder
// never breaks it.
struct Manifest {
  std::vector<std::string> reports;
  std::vector<SkippedRow> skipped;
};

Manifest read_manifest(const fs::path& root) {
  Manifest out;
  const fs::path file = root / kManifest;
  if (!fs::exists(file)) return out;
  const Json j = read_json_file(file);
  if (!j.is_object() || !j.contains("reports") || !j["reports"].is_array())
    throw Error(file.string(),
                "is not a qparity report index (needs a 'reports' array); move "
                "it away or use another --out");
  for (const auto& r : j["reports"])
    if (r.is_string()) out.reports.push_back(r.get<std::string>());
  if (j.contains("skipped") && j["skipped"].is_array())
    for (const auto& k : j["skipped"])
      if (k.is_object() && k.value("model", Json()).is_string() &&
          k.value("scheme", Json()).is_string() && k.value("reason", Json()).is_string())
        out.skipped.push_back({k["model"].get<std::string>(), k["scheme"].get<std::string>(),
                               k["reason"].get<std::string>()});
  return out;
}

void write_manifest(const fs::path& root, const Manifest& m) {
  Json skipped = Json::array();
  for (const auto& k : m.skipped)
    skipped.push_back({{"model", k.model}, {"scheme", k.scheme}, {"reason", k.reason}});
  write_text(root / kManifest,
             Json{{"comment", "what qparity wrote here; index.md and index.html list it"},
                  {"reports", m.reports},
                  {"skipped", skipped}}
                     .dump(1) +
                 "\n");
}

// `p` lies under `root` (both resolved as far as they exist; no symlink or ".." escapes).
bool lies_under(const fs::path& p, const fs::path& root) {
  const fs::path a = fs::weakly_canonical(p), b = fs::weakly_canonical(root);
  const auto [end, it] = std::mismatch(b.begin(), b.end(), a.begin(), a.end());
  return end == b.end();
}

}  // namespace

namespace {

// The engine a report row judged ("" in reports written before the column existed).
std::string report_engine(const Json& summary) {
  return summary.contains("engine") && summary["engine"].is_string()
             ? summary["engine"].get<std::string>()
             : std::string();
}

bool is_own_producer(const std::string& producer) {
  return producer.empty() || producer.rfind("qparity-", 0) == 0;
}

// What makes two rows of one scheme different sources: the device's full name (an H100 and an
// H200 share the key sm90), the engine and its version, the role.
std::string row_key(const Json& s) {
  std::string k;
  for (const char* f : {"device_name", "engine", "engine_version", "role"})
    k += (s.contains(f) && s[f].is_string() ? s[f].get<std::string>() : std::string()) + "\x1f";
  return k;
}

// An exclusive flock on <root>/.qparity-index.lock for the read-modify-write of the manifest and
// the index (released on every way out, process death included).
class IndexLock {
 public:
  explicit IndexLock(const fs::path& root) {
    fs::create_directories(root);
    const fs::path p = root / ".qparity-index.lock";
    fd_ = ::open(p.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644);
    if (fd_ < 0)
      throw Error(p.string(), std::string("cannot open the lock: ") + std::strerror(errno));
    while (::flock(fd_, LOCK_EX) != 0)
      if (errno != EINTR) {
        const int err = errno;
        ::close(fd_);
        throw Error(p.string(), std::string("cannot lock: ") + std::strerror(err));
      }
  }
  ~IndexLock() { ::close(fd_); }
  IndexLock(const IndexLock&) = delete;
  IndexLock& operator=(const IndexLock&) = delete;

 private:
  int fd_ = -1;
};

}  // namespace

ReportFiles write_report(const Json& rep, const fs::path& root) {
  const Json& s = rep.at("summary");
  const std::string dev = path_safe(s["device"].get<std::string>());
  const std::string model = path_safe(s["model"].get<std::string>());
  // Another engine's row sits beside qparity's own for the same scheme and device:
  // "<scheme>.<engine>" ("bf16.hf-transformers").
  const std::string engine = report_engine(s);
  std::string base =
      path_safe(s["scheme"].get<std::string>() + (is_own_producer(engine) ? "" : "." + engine));
  const fs::path dir = root / dev / model;
  // One writer at a time updates a report root (concurrent `report`s lost index rows).
  const IndexLock lock(root);
  // A row is the judgement of one dump by one engine on one device: a row already at this path
  // of another device name, engine version or role stays, and this one goes beside it; a new
  // dump of the same makes the row anew, except that a PASS never replaces a FAIL.
  const fs::path existing = dir / (base + ".json");
  if (fs::is_regular_file(existing)) {
    const Json old = read_json_file(existing);
    const Json& os = old.contains("summary") ? old["summary"] : Json::object();
    const bool same_source = row_key(os) == row_key(s);
    const bool pass_over_fail =
        os.value("verdict", std::string()) == "FAIL" &&
        s.value("verdict", std::string()) != "FAIL" &&
        os.value("candidate_sha256", std::string()) != s.value("candidate_sha256", std::string());
    if (!same_source || pass_over_fail) {
      Sha256 id;
      id.update(row_key(s) + "\n" + s.value("candidate_sha256", std::string()));
      base += "." + id.hex().substr(0, 10);
    }
  }
  ReportFiles f{dir / (base + ".json"), dir / (base + ".md"), dir / (base + ".html")};
  for (const fs::path& p : {f.json, f.md, f.html})
    if (!lies_under(p, root))
      throw Error(p.string(), "would be written outside the report root " + root.string());
  Manifest manifest = read_manifest(root);
  const std::string rel = dev + "/" + model + "/" + base;
  write_text(f.json, rep.dump(1) + "\n");
  write_text(f.md, render_markdown(rep));
  write_text(f.html, render_html(rep));
  if (std::find(manifest.reports.begin(), manifest.reports.end(), rel) == manifest.reports.end())
    manifest.reports.push_back(rel);
  std::erase_if(manifest.skipped, [&](const SkippedRow& k) {
    return k.model == s["model"].get<std::string>() && k.scheme == s["scheme"].get<std::string>();
  });
  write_manifest(root, manifest);
  return f;
}

void record_skipped(const fs::path& root, const SkippedRow& row) {
  const IndexLock lock(root);
  Manifest manifest = read_manifest(root);
  std::erase_if(manifest.skipped, [&](const SkippedRow& k) {
    return k.model == row.model && k.scheme == row.scheme;
  });
  manifest.skipped.push_back(row);
  write_manifest(root, manifest);
}

std::vector<IndexedReport> indexed_reports(const fs::path& root) {
  std::vector<IndexedReport> out;
  const IndexLock lock(root);
  for (const auto& rel : read_manifest(root).reports) {
    const fs::path file = root / (rel + ".json");
    if (!lies_under(file, root) || !fs::is_regular_file(file)) continue;  // deleted since
    const Json j = read_json_file(file);
    if (!j.is_object() || !j.contains("summary") || !j["summary"].is_object())
      throw Error(file.string(), "is listed in " + (root / kManifest).string() +
                                     " but is not a qparity report (no 'summary')");
    out.push_back({rel, j["summary"]});
  }
  return out;
}

std::vector<SkippedRow> skipped_rows(const fs::path& root) {
  const IndexLock lock(root);
  return read_manifest(root).skipped;
}

namespace {

// Bits per weight of a report's scheme id; nullopt for a mixed plan ("a+b") or an id this build
// does not know.
std::optional<double> scheme_bits(const std::string& scheme) {
  if (scheme.find('+') != std::string::npos) return std::nullopt;
  try {
    return weight_bits_per_element(parse_scheme_id(scheme));
  } catch (const Error&) {
    return std::nullopt;
  }
}

// A cell's background for its mean KLD: green at 1e-5 and below, through yellow, red at 0.1 and
// above (log scale); NaN / Inf red.
std::string kld_colour(double kld) {
  if (!std::isfinite(kld)) return "hsl(0,70%,82%)";
  const double t = std::clamp((std::log10(std::max(kld, 1e-12)) + 5.0) / 4.0, 0.0, 1.0);
  char buf[40];
  std::snprintf(buf, sizeof buf, "hsl(%d,65%%,82%%)", static_cast<int>(120.0 * (1.0 - t)));
  return buf;
}

struct GlanceRow {
  std::string column, scheme;  // column: "model · device · engine (role)"
  std::optional<double> bits;
  std::string verdict;
  double kld = 0, kld_hi = 0;
  bool format = false;
  std::string model, rel;
};

// The matrix of schemes (sorted by bits per weight, widest first) by model x device x engine,
// each cell the verdict and mean KLD; Markdown and HTML (cells coloured by KLD).
void write_glance_matrix(const std::vector<GlanceRow>& g, std::ostream& md, std::ostream& html) {
  std::vector<std::string> cols;
  std::vector<std::pair<double, std::string>> schemes;
  std::map<std::pair<std::string, std::string>, const GlanceRow*> at;
  for (const GlanceRow& r : g) {
    if (std::find(cols.begin(), cols.end(), r.column) == cols.end()) cols.push_back(r.column);
    const std::pair<double, std::string> key{-r.bits.value_or(-1.0), r.scheme};
    if (std::find(schemes.begin(), schemes.end(), key) == schemes.end()) schemes.push_back(key);
    at[{r.scheme, r.column}] = &r;
  }
  std::sort(schemes.begin(), schemes.end());
  md << "## At a glance\n\nSchemes by bits per weight (codes plus their group's scales) against "
        "models, devices and engines: the verdict and mean KLD of each row.\n\n| scheme | bits "
        "/ weight |";
  html << "<h2>At a glance</h2><p>Schemes by bits per weight (codes plus their group's scales) "
          "against models, devices and engines: the verdict and mean KLD of each row, coloured by "
          "mean KLD (green 1e-5, red 0.1).</p><table><tr><th>scheme</th><th>bits / weight</th>";
  for (const auto& c : cols) {
    md << " " << c << " |";
    html << "<th>" << html_escape(c) << "</th>";
  }
  md << "\n|---|---|";
  for (size_t i = 0; i < cols.size(); ++i)
    md << "---|";
  md << "\n";
  html << "</tr>";
  for (const auto& [neg_bits, scheme] : schemes) {
    const std::string bits = neg_bits > 0 ? "-" : fmt(-neg_bits, "%.3g");
    md << "| " << scheme << " | " << bits << " |";
    html << "<tr><td>" << html_escape(scheme) << "</td><td>" << bits << "</td>";
    for (const auto& c : cols) {
      const auto it = at.find({scheme, c});
      if (it == at.end()) {
        md << " |";
        html << "<td></td>";
        continue;
      }
      const GlanceRow& r = *it->second;
      const std::string text = r.verdict + " " + fmt(r.kld, "%.2g");
      md << " [" << text << "](" << r.rel << ".md) |";
      html << "<td style='background:" << kld_colour(r.kld) << "'><a href='" << html_escape(r.rel)
           << ".html'>" << html_escape(text) << "</a></td>";
    }
    md << "\n";
    html << "</tr>";
  }
  html << "</table>";
}

// Mean KLD (log scale, its upper 95% bound as a bar) against bits per weight, one colour per
// model, from the format rows (what each format does to each model); rows at KLD 0 (bf16
// against itself) are not drawn. Inline SVG.
void write_glance_chart(const std::vector<GlanceRow>& g, std::ostream& html) {
  std::vector<const GlanceRow*> pts;
  for (const GlanceRow& r : g)
    if (r.format && r.bits && std::isfinite(r.kld) && r.kld > 0) pts.push_back(&r);
  if (pts.empty()) return;
  double bmin = 1e9, bmax = -1e9, kmin = 1e9, kmax = -1e9;
  std::vector<std::string> models;
  for (const GlanceRow* r : pts) {
    bmin = std::min(bmin, *r->bits), bmax = std::max(bmax, *r->bits);
    kmin = std::min(kmin, std::log10(r->kld));
    kmax =
        std::max(kmax, std::log10(std::isfinite(r->kld_hi) ? std::max(r->kld_hi, r->kld) : r->kld));
    if (std::find(models.begin(), models.end(), r->model) == models.end())
      models.push_back(r->model);
  }
  const double y0 = std::floor(kmin), y1 = std::max(std::ceil(kmax), y0 + 1);
  const double x0 = std::floor(bmin) - 0.5, x1 = std::ceil(bmax) + 0.5;
  const double W = 720, H = 380, L = 70, R = 160, T = 20, B = 50;
  const auto X = [&](double b) { return L + (b - x0) / (x1 - x0) * (W - L - R); };
  const auto Y = [&](double lk) { return T + (y1 - lk) / (y1 - y0) * (H - T - B); };
  static const char* const palette[] = {"#1f77b4", "#d62728", "#2ca02c", "#9467bd",
                                        "#ff7f0e", "#8c564b", "#e377c2", "#17becf"};
  html << "<h2>Mean KLD against bits per weight</h2><p>Format rows (each quantized reference "
          "against the unquantized one): mean KLD, log scale, with its upper 95% bound as a bar; "
          "one colour per model.</p><svg xmlns='http://www.w3.org/2000/svg' width='"
       << W << "' height='" << H << "' font-family='sans-serif' font-size='12'>";
  html << "<rect x='" << L << "' y='" << T << "' width='" << W - L - R << "' height='" << H - T - B
       << "' fill='none' stroke='#999'/>";
  for (double e = y0; e <= y1 + 1e-9; e += 1) {
    html << "<line x1='" << L << "' x2='" << W - R << "' y1='" << Y(e) << "' y2='" << Y(e)
         << "' stroke='#eee'/><text x='" << L - 6 << "' y='" << Y(e) + 4 << "' text-anchor='end'>1e"
         << static_cast<int>(e) << "</text>";
  }
  for (double b = std::ceil(x0); b <= x1; b += 1)
    html << "<text x='" << X(b) << "' y='" << H - B + 16 << "' text-anchor='middle'>" << b
         << "</text>";
  html << "<text x='" << (L + W - R) / 2 << "' y='" << H - 12
       << "' text-anchor='middle'>bits per weight</text><text x='14' y='" << (T + H - B) / 2
       << "' transform='rotate(-90 14 " << (T + H - B) / 2
       << ")' text-anchor='middle'>mean KLD</text>";
  for (const GlanceRow* r : pts) {
    const size_t m =
        static_cast<size_t>(std::find(models.begin(), models.end(), r->model) - models.begin());
    const char* colour = palette[m % std::size(palette)];
    const double x = X(*r->bits) + (static_cast<double>(m) - (models.size() - 1) / 2.0) * 4;
    const double hi = std::isfinite(r->kld_hi) && r->kld_hi > r->kld ? r->kld_hi : r->kld;
    html << "<line x1='" << x << "' x2='" << x << "' y1='" << Y(std::log10(r->kld)) << "' y2='"
         << Y(std::log10(hi)) << "' stroke='" << colour << "'/><circle cx='" << x << "' cy='"
         << Y(std::log10(r->kld)) << "' r='3.5' fill='" << colour << "'><title>"
         << html_escape(r->model + " " + r->scheme + ": mean KLD " + fmt(r->kld, "%.3g"))
         << "</title></circle>";
  }
  for (size_t m = 0; m < models.size(); ++m)
    html << "<circle cx='" << W - R + 16 << "' cy='" << T + 12 + 18 * m << "' r='4' fill='"
         << palette[m % std::size(palette)] << "'/><text x='" << W - R + 26 << "' y='"
         << T + 16 + 18 * m << "'>" << html_escape(models[m]) << "</text>";
  html << "</svg>";
}

}  // namespace

void write_index(const fs::path& root) {
  struct Row {
    std::string device, model, scheme, rel;
    Json s;
  };
  std::vector<Row> rows;
  Manifest kept;
  const IndexLock lock(root);
  const Manifest manifest = read_manifest(root);
  kept.skipped = manifest.skipped;
  for (const auto& rel : manifest.reports) {
    const fs::path file = root / (rel + ".json");
    if (!lies_under(file, root) || !fs::is_regular_file(file)) continue;  // deleted since
    const Json j = read_json_file(file);
    if (!j.is_object() || !j.contains("summary"))
      throw Error(file.string(), "is listed in " + (root / kManifest).string() +
                                     " but is not a qparity report (no 'summary')");
    const fs::path relp(rel);
    rows.push_back({relp.begin()->string(), relp.parent_path().filename().string(),
                    relp.filename().string(), rel, j["summary"]});
    kept.reports.push_back(rel);
  }
  write_manifest(root, kept);
  std::sort(rows.begin(), rows.end(), [](const Row& a, const Row& b) {
    return std::tie(a.model, a.scheme, a.device) < std::tie(b.model, b.scheme, b.device);
  });
  std::ostringstream md, html;
  const char* legend[][2] = {
      {"role",
       "format: the quantized reference against the unquantized one (what the format "
       "does to this model); engine: a candidate engine against the reference golden of "
       "its own scheme (does it implement the format right)"},
      {"verdict",
       "PASS / FAIL by the policy named in the report; NOT JUDGED: no policy gate "
       "applies (never a pass). Format rows split it: budget = is the format "
       "acceptable for this model (end-to-end budget), math = does the quantized "
       "reference do the format's math (the first op that carries its error alone)"},
      {"mean KLD [hi]",
       "mean KL divergence of the next-token distribution, with its upper 95% "
       "bound"},
      {"top-1 [lo]",
       "fraction of positions whose most likely token agrees, with its lower 95% "
       "(Wilson) bound"},
      {"Δ ln PPL [hi]",
       "ln(PPL candidate / PPL golden) over the scored targets, with its upper "
       "95% bound"},
      {"engine",
       "what produced the candidate: qparity-reference (format rows), qparity-gpu-engine, or "
       "another engine's dump (its producer attribute: hf-transformers, vllm, ...)"},
      {"worst point", "the capture point with the largest relative L2 error"},
      {"router flips", "MoE: fraction of tokens whose top-k expert set changed"},
      {"act. saturation", "largest fraction of activation codes at the format's extreme"},
      {"notes", "identical rows and other remarks (the report says why)"}};
  static const char* const header[] = {
      "model",       "scheme",        "device",          "engine",        "role",
      "verdict",     "mean KLD [hi]", "top-1 [lo]",      "Δ ln PPL [hi]", "logits rel L2",
      "worst point", "router flips",  "act. saturation", "notes"};
  std::vector<GlanceRow> glance;
  for (const Row& r : rows) {
    GlanceRow gr;
    gr.model = r.model;
    gr.scheme = r.scheme;
    gr.bits = scheme_bits(r.s.value("scheme", r.scheme));
    gr.format = r.s.value("role", "") == "format";
    const std::string engine = report_engine(r.s);
    gr.column = r.model + " · " + r.device + " · " + (engine.empty() ? "-" : engine) + " (" +
                r.s.value("role", "") + ")";
    gr.verdict = point_verdict_word(r.s);
    if (gr.format && r.s.contains("budget_check") && !r.s["budget_check"].is_null())
      gr.verdict = "budget " + r.s["budget_check"].get<std::string>();
    gr.kld = num(r.s["kld_mean"]);
    gr.kld_hi = num(r.s["kld_mean_hi"]);
    gr.rel = r.rel;
    glance.push_back(gr);
  }
  md << "# qparity accuracy reports\n\n";
  html << "<!doctype html><html><head><meta charset='utf-8'><title>qparity accuracy "
          "reports</title><style>body{font-family:sans-serif;margin:2em}table{border-collapse:"
          "collapse}td,th{border:1px solid #ccc;padding:2px 6px;font-size:13px}"
          ".fail{color:#c0392b;font-weight:bold}.pass{color:#1e7b34}.unjudged{color:#8a6d00}"
          "dt{font-weight:bold;margin-top:.3em}dd{margin-left:1.5em;font-size:13px}"
          "td a{color:inherit}</style></head><body><h1>qparity accuracy reports</h1>";
  if (!glance.empty()) {
    write_glance_matrix(glance, md, html);
    write_glance_chart(glance, html);
    md << "\n(The chart of mean KLD against bits per weight is in index.html.)\n\n";
  }
  md << "## Every row\n\nSchemes × metrics × devices.\n\n|";
  html << "<h2>Every row</h2><table><tr>";
  for (const char* h : header) {
    md << " " << h << " |";
    html << "<th>" << html_escape(h) << "</th>";
  }
  md << "\n|";
  for (size_t i = 0; i < std::size(header); ++i)
    md << "---|";
  md << "\n";
  html << "</tr>";
  const auto with_bound = [](const Json& s, const char* v, const char* b, const char* f) {
    return fmt(num(s[v]), f) + (s.contains(b) ? " [" + fmt(num(s[b]), f) + "]" : "");
  };
  for (const Row& r : rows) {
    const Json& s = r.s;
    std::string verdict = point_verdict_word(s);
    if (s.contains("budget_check") && !s["budget_check"].is_null())
      verdict += " (budget " + s["budget_check"].get<std::string>() + ", math " +
                 s.value("math_check", std::string("-")) + ")";
    const std::string flips =
        s["router_flip_rate"].is_null() ? "-" : fmt(num(s["router_flip_rate"]), "%.3f");
    const std::string sat =
        !s.contains("max_activation_saturation") || s["max_activation_saturation"].is_null()
            ? "-"
            : fmt(num(s["max_activation_saturation"]), "%.2g");
    std::string notes;
    if (s.contains("notes"))
      for (const auto& n : s["notes"])
        notes += (notes.empty() ? "" : "; ") + n.get<std::string>();
    const std::string cells[] = {
        r.model,
        r.scheme,
        r.device,
        report_engine(s).empty() ? "-" : report_engine(s),
        s.value("role", ""),
        verdict,
        with_bound(s, "kld_mean", "kld_mean_hi", "%.3g"),
        with_bound(s, "top1", "top1_lo", "%.3f"),
        with_bound(s, "dln_ppl", "dln_ppl_hi", "%.3g"),
        fmt(num(s["logits_rel_l2"])),
        s["worst_point"].get<std::string>() + " (" + fmt(num(s["worst_point_rel_l2"])) + ")",
        flips,
        sat,
        notes.empty() ? "-" : notes};
    md << "|";
    html << "<tr>";
    for (size_t i = 0; i < std::size(cells); ++i) {
      md << " " << (i == 1 ? "[" + cells[i] + "](" + r.rel + ".md)" : cells[i]) << " |";
      const std::string cls = i != 5                           ? ""
                              : cells[i].rfind("FAIL", 0) == 0 ? " class='fail'"
                              : cells[i].rfind("PASS", 0) == 0 ? " class='pass'"
                                                               : " class='unjudged'";
      html << "<td" << cls << ">"
           << (i == 1
                   ? "<a href='" + html_escape(r.rel) + ".html'>" + html_escape(cells[i]) + "</a>"
                   : html_escape(cells[i]))
           << "</td>";
    }
    md << "\n";
    html << "</tr>";
  }
  html << "</table>";
  if (!kept.skipped.empty()) {
    md << "\n## Not run\n\n| model | scheme | why |\n|---|---|---|\n";
    html << "<h2>Not run</h2><table><tr><th>model</th><th>scheme</th><th>why</th></tr>";
    for (const auto& k : kept.skipped) {
      md << "| " << k.model << " | " << k.scheme << " | " << k.reason << " |\n";
      html << "<tr><td>" << html_escape(k.model) << "</td><td>" << html_escape(k.scheme)
           << "</td><td>" << html_escape(k.reason) << "</td></tr>";
    }
    html << "</table>";
  }
  md << "\n## Legend\n\n";
  html << "<h2>Legend</h2><dl>";
  for (const auto& [term, text] : legend) {
    md << "- **" << term << "**: " << text << "\n";
    html << "<dt>" << html_escape(term) << "</dt><dd>" << html_escape(text) << "</dd>";
  }
  html << "</dl></body></html>\n";
  write_text(root / "index.md", md.str());
  write_text(root / "index.html", html.str());
}

}  // namespace qparity::golden
