// `qparity report GOLDEN CANDIDATE [--policy FILE] [--role engine|format] [--out reports/]`:
// compares, then writes reports/<device>/<model>/<scheme>.{json,md,html} and rebuilds
// reports/index.{md,html}.
#include <iostream>
#include <memory>
#include <string>

#include "commands.h"
#include "core/error.h"
#include "golden/report.h"

namespace qparity::cli {
namespace {

struct ReportOptions {
  std::string golden, candidate, policy, role = "engine", out = "reports";
};

void run(const ReportOptions& o) {
  if (o.role != "engine" && o.role != "format")
    throw Error("--role", "'" + o.role + "' (engine or format)");
  golden::Policy policy;
  golden::CompareOptions co;
  if (!o.policy.empty()) {
    policy = golden::load_policy(o.policy);
    co.policy = &policy;
  }
  co.role = o.role == "format" ? golden::PolicyRole::kFormat : golden::PolicyRole::kEngine;
  const auto r = golden::compare_goldens(golden::GoldenReader::open(o.golden),
                                         golden::GoldenReader::open(o.candidate), co);
  const auto files = golden::write_report(golden::report_json(r, o.role), o.out);
  golden::write_index(o.out);
  std::cout << files.json.string() << "\n"
            << files.md.string() << "\n"
            << files.html.string() << "\n";
}

}  // namespace

void add_report_command(CLI::App& app, int& rc) {
  auto o = std::make_shared<ReportOptions>();
  auto* cmd = app.add_subcommand("report", "Compare and write the json/md/html report + index");
  cmd->add_option("golden", o->golden, "golden .h5")->required();
  cmd->add_option("candidate", o->candidate, "candidate .h5")->required();
  cmd->add_option("--policy", o->policy, "tolerance policy JSON");
  cmd->add_option("--role", o->role, "engine | format")->capture_default_str();
  cmd->add_option("--out", o->out, "report root")->capture_default_str();
  cmd->callback([o, &rc] {
    run(*o);
    rc = 0;
  });
}

}  // namespace qparity::cli
