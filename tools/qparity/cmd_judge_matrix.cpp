// `qparity judge-matrix --model DIR [--model DIR ...] [--candidates LIST] [--sequences S]
// [--seq-len T] [--policies DIR] [--work DIR] --out DIR`: the judge measured (golden/
// judge_matrix.h). Each checkpoint is judged in its own scheme; the candidates are the reference
// itself, its legitimate implementation choices and its planted faults
// (reference_cpu/models/deviation.h). Writes judge-matrix.{json,md,html} under --out and prints
// the Markdown. Exit 0 when every cell is as expected, 3 when one is not (a false alarm, a miss or
// a wrong location: the table says which).
#include <iostream>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

#include "commands.h"
#include "core/error.h"
#include "golden/judge_matrix.h"
#include "tools/qparity/cli_support.h"

namespace qparity::cli {
namespace {

struct JudgeMatrixCliOptions {
  std::vector<std::string> models;
  std::string candidates, policies, out, work;
  int64_t sequences = 4, seq_len = 32;
  uint64_t seed = 7;
};

int run(const JudgeMatrixCliOptions& o) {
  check_output_dir(o.out);
  golden::JudgeMatrixOptions jo;
  jo.sequences = o.sequences;
  jo.seq_len = o.seq_len;
  jo.seed = o.seed;
  jo.policies = policy_dir(o.policies);
  jo.work = o.work.empty() ? std::filesystem::path(o.out) / "work" : std::filesystem::path(o.work);
  jo.progress = &std::cerr;
  if (!o.candidates.empty()) {
    std::stringstream list(o.candidates);
    for (std::string item; std::getline(list, item, ',');)
      jo.candidates.push_back(item == "none" ? reference::Deviation{}
                                             : reference::parse_deviation(item));
  }
  std::vector<std::filesystem::path> models(o.models.begin(), o.models.end());
  const auto cells = golden::run_judge_matrix(models, jo);
  golden::write_judge_matrix(o.out, cells);
  std::cout << golden::matrix_markdown(cells);
  for (const auto& c : cells)
    if (!c.as_expected) return 3;
  return 0;
}

}  // namespace

void add_judge_matrix_command(CLI::App& app, int& rc) {
  auto o = std::make_shared<JudgeMatrixCliOptions>();
  auto* cmd = app.add_subcommand(
      "judge-matrix",
      "Measure the judge: the reference with legitimate implementation choices (must PASS) and "
      "planted faults (must FAIL at their point), each checkpoint under its scheme's engine "
      "policy");
  cmd->add_option("--model", o->models, "checkpoint directory (repeat for more)")->required();
  cmd->add_option("--candidates", o->candidates,
                  "comma-separated deviations (name or name@layer; 'none' = the reference "
                  "itself); default: every one, each at its chosen layer");
  cmd->add_option("--sequences", o->sequences, "synthetic sequences per checkpoint")
      ->capture_default_str()
      ->check(CLI::Range(int64_t{1}, int64_t{1} << 20));
  cmd->add_option("--seq-len", o->seq_len, "tokens per sequence")
      ->capture_default_str()
      ->check(CLI::Range(int64_t{2}, int64_t{1} << 20));
  cmd->add_option("--seed", o->seed, "token seed")->capture_default_str()->check(seed_check());
  cmd->add_option("--policies", o->policies, "policy directory (default: the installed one)");
  cmd->add_option("--work", o->work, "where goldens and dumps go (default: OUT/work)");
  cmd->add_option("--out", o->out, "output directory")->required();
  cmd->callback([o, &rc] { rc = run(*o); });
}

}  // namespace qparity::cli
