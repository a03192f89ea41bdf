#include "golden/junit.h"

#include <sstream>
#include <vector>

#include "core/error.h"
#include "core/input_file.h"
#include "core/safetensors/safetensors_writer.h"
#include "golden/report.h"

namespace qparity::golden {

namespace fs = std::filesystem;

namespace {

constexpr std::string_view kMarker =
    "<?xml version=\"1.0\" encoding=\"UTF-8\"?><!-- qparity junit -->";

// XML 1.0 text: the five entities escaped, control characters other than tab / newline dropped.
std::string xml_escape(const std::string& s) {
  std::string o;
  for (const char ch : s) {
    const auto c = static_cast<unsigned char>(ch);
    switch (ch) {
      case '&':
        o += "&amp;";
        break;
      case '<':
        o += "&lt;";
        break;
      case '>':
        o += "&gt;";
        break;
      case '"':
        o += "&quot;";
        break;
      case '\'':
        o += "&apos;";
        break;
      default:
        if (c >= 0x20 || ch == '\t' || ch == '\n') o += ch;
    }
  }
  return o;
}

std::string text_of(const Json& s, const char* key) {
  if (!s.contains(key) || s[key].is_null()) return "";
  if (s[key].is_string()) return s[key].get<std::string>();
  return s[key].dump();
}

struct Case {
  std::string classname, name, verdict, message, body;
  std::vector<std::pair<std::string, std::string>> properties;
};

}  // namespace

std::string junit_xml(const fs::path& root, const std::string& suite) {
  std::vector<Case> cases;
  for (const auto& r : indexed_reports(root)) {
    const Json& s = r.summary;
    Case c;
    c.classname = "qparity." + text_of(s, "model") + "." + text_of(s, "device");
    const std::string engine = text_of(s, "engine");
    c.name = text_of(s, "scheme") + " (" + text_of(s, "role") +
             (engine.empty() ? "" : ", " + engine) + ", " + text_of(s, "run") + ")";
    c.verdict =
        s.contains("verdict") ? text_of(s, "verdict") : (s.value("pass", false) ? "PASS" : "FAIL");
    std::string failures;
    if (s.contains("failures") && s["failures"].is_array())
      for (const auto& f : s["failures"])
        failures += (f.is_string() ? f.get<std::string>() : f.dump()) + "\n";
    const std::string judged_by = text_of(s, "judged_by");
    c.message = c.verdict == "FAIL"
                    ? (failures.empty() ? "FAIL" : failures.substr(0, failures.find('\n')))
                    : "NOT JUDGED" + (judged_by.empty() ? "" : ": " + judged_by);
    c.body = failures + "report: " + (root / (r.rel + ".md")).string() + "\n";
    c.properties.push_back({"report", (root / (r.rel + ".json")).string()});
    for (const char* k :
         {"verdict", "judged_by", "kld_mean", "kld_mean_hi", "top1", "top1_lo", "dln_ppl",
          "dln_ppl_hi", "worst_point", "worst_point_rel_l2", "first_failing_point", "device_name",
          "engine_version", "budget_check", "math_check"})
      if (const std::string v = text_of(s, k); !v.empty()) c.properties.push_back({k, v});
    cases.push_back(std::move(c));
  }
  for (const auto& k : skipped_rows(root))
    cases.push_back({"qparity." + k.model, k.scheme + " (not run)", "SKIPPED", k.reason, "", {}});
  int failures = 0, skipped = 0;
  for (const auto& c : cases) {
    failures += c.verdict == "FAIL";
    skipped += c.verdict != "FAIL" && c.verdict != "PASS";
  }
  std::ostringstream o;
  o << kMarker << "\n<testsuites name=\"qparity\" tests=\"" << cases.size() << "\" failures=\""
    << failures << "\" skipped=\"" << skipped << "\">\n  <testsuite name=\"" << xml_escape(suite)
    << "\" tests=\"" << cases.size() << "\" failures=\"" << failures << "\" skipped=\"" << skipped
    << "\" errors=\"0\">\n";
  for (const auto& c : cases) {
    o << "    <testcase classname=\"" << xml_escape(c.classname) << "\" name=\""
      << xml_escape(c.name) << "\">\n";
    if (!c.properties.empty()) {
      o << "      <properties>\n";
      for (const auto& [k, v] : c.properties)
        o << "        <property name=\"" << xml_escape(k) << "\" value=\"" << xml_escape(v)
          << "\"/>\n";
      o << "      </properties>\n";
    }
    if (c.verdict == "FAIL")
      o << "      <failure type=\"FAIL\" message=\"" << xml_escape(c.message) << "\">"
        << xml_escape(c.body) << "</failure>\n";
    else if (c.verdict != "PASS")
      o << "      <skipped message=\"" << xml_escape(c.message) << "\"/>\n";
    if (!c.body.empty()) o << "      <system-out>" << xml_escape(c.body) << "</system-out>\n";
    o << "    </testcase>\n";
  }
  o << "  </testsuite>\n</testsuites>\n";
  return o.str();
}

namespace {

// Whether `path` exists; an error when it is there and not a JUnit file qparity wrote (only such
// a file is replaced: a re-run of the same CI job).
bool existing_junit(const fs::path& path) {
  if (!fs::exists(fs::symlink_status(path))) {
    const fs::path dir = path.parent_path().empty() ? fs::path(".") : path.parent_path();
    if (!fs::is_directory(dir))
      throw Error(path.string(), "--junit: the directory " + dir.string() + " does not exist");
    return false;
  }
  const std::string old = read_input_file(path, "--junit file");
  if (old.compare(0, kMarker.size(), kMarker) != 0)
    throw Error(path.string(),
                "exists and is not a JUnit file qparity wrote; remove it or "
                "choose another --junit path");
  return true;
}

}  // namespace

void check_junit_target(const fs::path& path) {
  (void)existing_junit(path);
}

void write_junit(const fs::path& path, const fs::path& root, const std::string& suite) {
  const std::string xml = junit_xml(root, suite);
  const OverwritePolicy policy =
      existing_junit(path) ? OverwritePolicy::kReplace : OverwritePolicy::kRefuse;
  write_file_atomic(
      path, std::span<const uint8_t>(reinterpret_cast<const uint8_t*>(xml.data()), xml.size()),
      policy);
}

}  // namespace qparity::golden
