// `qparity report GOLDEN CANDIDATE [--policy FILE] [--role engine|format] [--out reports/]`:
// compares, then writes reports/<device>/<model>/<scheme>.{json,md,html} and rebuilds
// reports/index.{md,html}. Exit status as compare's: 3 when the candidate fails, with the report
// written.
#include <iostream>
#include <memory>
#include <string>

#include "commands.h"
#include "core/error.h"
#include "golden/junit.h"
#include "golden/report.h"
#include "tools/qparity/cli_support.h"

namespace qparity::cli {
namespace {

struct ReportOptions {
  std::string golden, candidate, policy, role, budget, out = "reports", junit;
  bool budget_given = false;  // --budget appeared (an empty value is an error, not "absent")
  bool allow_other_checkpoint = false;
};

int run(const ReportOptions& o) {
  check_output_dir(o.out);
  if (!o.junit.empty()) golden::check_junit_target(o.junit);
  const auto g = golden::GoldenReader::open(o.golden);
  const auto c = golden::GoldenReader::open(o.candidate);
  ChosenPolicy chosen = choose_policy(o.policy, o.role, g.meta(), c.meta());
  golden::CompareOptions co;
  co.policy = chosen.policy ? &*chosen.policy : nullptr;
  co.role = chosen.role;
  co.budget = budget_for(o.budget, o.budget_given, chosen.role);
  if (co.budget) co.budget_source = "--budget " + o.budget;
  co.allow_other_checkpoint = o.allow_other_checkpoint;
  golden::CompareReport r = golden::compare_goldens(g, c, co);
  r.policy_source = chosen.source;
  const auto files = golden::write_report(
      golden::report_json(r, chosen.role == golden::PolicyRole::kFormat ? "format" : "engine"),
      o.out);
  golden::write_index(o.out);
  if (!o.junit.empty()) golden::write_junit(o.junit, o.out, "qparity report");
  std::cout << files.json.string() << "\n"
            << files.md.string() << "\n"
            << files.html.string() << "\n"
            << golden::to_string(r.verdict) << "\n";
  return r.verdict == golden::Judgement::kFail ? 3 : 0;
}

}  // namespace

void add_report_command(CLI::App& app, int& rc) {
  auto o = std::make_shared<ReportOptions>();
  auto* cmd = app.add_subcommand("report", "Compare and write the json/md/html report + index");
  cmd->add_option("golden", o->golden, "golden .h5")->required();
  cmd->add_option("candidate", o->candidate, "candidate .h5")->required();
  cmd->add_option(
      "--policy", o->policy,
      "tolerance policy JSON (default: the installed policies/<candidate scheme>.json)");
  cmd->add_option("--role", o->role, "engine | format (default: implied by the files)")
      ->check(role_choices());
  cmd->add_option("--budget", o->budget,
                  "format role: kld=X,top1=Y,dln_ppl=Z replaces the policy's default budget")
      ->each([o](const std::string&) { o->budget_given = true; });
  cmd->add_flag("--allow-other-checkpoint", o->allow_other_checkpoint,
                "engine role: compare although the candidate records another checkpoint's hashes");
  cmd->add_option("--out", o->out, "report root")->capture_default_str();
  cmd->add_option("--junit", o->junit,
                  "also write the report root's rows as JUnit XML to this file (replaces only a "
                  "JUnit file qparity wrote)");
  cmd->callback([o, &rc] { rc = run(*o); });
}

}  // namespace qparity::cli
