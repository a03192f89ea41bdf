// `qparity compare GOLDEN CANDIDATE [--policy FILE] [--role engine|format] [--json]` and
// `qparity bisect GOLDEN CANDIDATE --policy FILE` / `qparity bisect --candidates A B --policy F`.
// Exit status: 0 pass, 3 the policy fails, 1 bad input, 2 usage.
#include <algorithm>
#include <cstdlib>
#include <filesystem>
#include <iostream>
#include <memory>
#include <numeric>
#include <string>
#include <vector>

#include "commands.h"
#ifdef QPARITY_HAS_ENGINE
#include "gpu_engine/engine_golden.h"
#endif
#include "core/error.h"
#include "golden/compare.h"
#include "golden/layer_rerun.h"
#include "reference_cpu/models/model_loader.h"

namespace qparity::cli {
namespace {

constexpr int kPolicyFails = 3;

struct CompareOptions {
  std::string golden, candidate, policy, role = "engine", device;
  std::string model, scheme, dialect = "ideal", mode;  // bisect: the candidate as a runnable model
  std::vector<std::string> candidates;
  std::vector<std::string> git;      // --git GOOD BAD
  std::vector<std::string> command;  // after --: what builds and dumps the candidate
  bool json = false;
};

golden::CompareReport run_compare(const std::string& gpath, const std::string& cpath,
                                  const CompareOptions& o, golden::Policy* holder) {
  const auto g = golden::GoldenReader::open(gpath);
  const auto c = golden::GoldenReader::open(cpath);
  golden::CompareOptions co;
  if (!o.policy.empty()) {
    *holder = golden::load_policy(o.policy);
    co.policy = holder;
  }
  if (o.role != "engine" && o.role != "format")
    throw Error("--role", "'" + o.role + "' (engine or format)");
  co.role = o.role == "format" ? golden::PolicyRole::kFormat : golden::PolicyRole::kEngine;
  if (!o.device.empty()) co.device = o.device;
  return golden::compare_goldens(g, c, co);
}

int compare(const CompareOptions& o) {
  golden::Policy policy;
  const auto r = run_compare(o.golden, o.candidate, o, &policy);
  if (o.json)
    std::cout << golden::to_json(r).dump(1) << "\n";
  else
    std::cout << golden::to_text(r);
  return r.pass ? 0 : kPolicyFails;
}

void print_point(const golden::PointReport& p, const char* tag, int64_t seq_len) {
  std::cout << "  " << tag << " " << p.name << ": rel_l2 " << p.stats.rel_l2 << ", max_abs "
            << p.stats.max_abs << ", cosine " << p.stats.cosine;
  if (p.verdict.gated) std::cout << (p.verdict.pass ? " (within policy)" : " (FAILS policy)");
  std::cout << "\n";
  for (const auto& f : p.verdict.failures)
    std::cout << "      " << f << "\n";
  (void)seq_len;
}

std::string shell_quote(const std::string& s) {
  std::string q = "'";
  for (char c : s)
    q += c == '\'' ? std::string("'\\''") : std::string(1, c);
  return q + "'";
}

// One step of `git bisect run`: build and dump with the command, then judge the dump. Exit 0
// good, 1 bad (outside the policy), 125 skip (the command failed or produced nothing readable:
// this commit cannot be judged).
int bisect_oracle(const CompareOptions& o) {
  std::string cmd;
  for (const auto& a : o.command)
    cmd += (cmd.empty() ? "" : " ") + shell_quote(a);
  if (std::system(cmd.c_str()) != 0) return 125;
  try {
    golden::Policy policy;
    const auto r = run_compare(o.golden, o.candidate, o, &policy);
    std::cout << "qparity bisect oracle: " << (r.pass ? "good" : "bad");
    if (r.first_failing >= 0)
      std::cout << " (first failing point " << r.points[static_cast<size_t>(r.first_failing)].name
                << ")";
    std::cout << "\n";
    return r.pass ? 0 : 1;
  } catch (const std::exception& e) {
    std::cerr << "qparity bisect oracle: skip: " << e.what() << "\n";
    return 125;
  }
}

// `git bisect start BAD GOOD; git bisect run <this oracle>; git bisect reset`, in the current
// directory's repository; prints git's verdict (the first bad commit).
int git_bisect(const CompareOptions& o) {
  if (o.git.size() != 2) throw Error("bisect --git", "takes GOOD and BAD revisions");
  if (o.golden.empty() || o.candidate.empty() || o.command.empty() || o.policy.empty())
    throw Error("bisect --git",
                "usage: qparity bisect --git GOOD BAD --policy P GOLDEN CANDIDATE -- CMD...; CMD "
                "builds and writes CANDIDATE at each commit");
  const std::string self = std::filesystem::read_symlink("/proc/self/exe").string();
  const auto run = [](const std::string& c) {
    const int rc = std::system(c.c_str());
    return rc;
  };
  if (run("git bisect start " + shell_quote(o.git[1]) + " " + shell_quote(o.git[0])) != 0)
    throw Error("bisect --git",
                "git bisect start failed (is this a git repository, are the "
                "revisions valid?)");
  std::string oracle = shell_quote(self) + " bisect-oracle --policy " + shell_quote(o.policy) +
                       " --role " + shell_quote(o.role);
  if (!o.device.empty()) oracle += " --device " + shell_quote(o.device);
  oracle += " " + shell_quote(std::filesystem::absolute(o.golden).string()) + " " +
            shell_quote(std::filesystem::absolute(o.candidate).string()) + " --";
  for (const auto& a : o.command)
    oracle += " " + shell_quote(a);
  const int rc = run("git bisect run " + oracle);
  run("git bisect reset >/dev/null 2>&1");
  if (rc != 0) throw Error("bisect --git", "git bisect run failed");
  return 0;
}

int bisect(const CompareOptions& o) {
  if (!o.git.empty()) return git_bisect(o);
  if (o.policy.empty()) throw Error("bisect", "needs --policy FILE (what counts as failing)");
  std::string gpath = o.golden, cpath = o.candidate;
  if (!o.candidates.empty()) {
    if (o.candidates.size() != 2 || !o.golden.empty())
      throw Error("bisect",
                  "--candidates takes exactly two dumps (the older first) and no "
                  "golden");
    gpath = o.candidates[0];
    cpath = o.candidates[1];
  }
  if (gpath.empty() || cpath.empty()) throw Error("bisect", "give GOLDEN CANDIDATE");
  golden::Policy policy;
  const auto r = run_compare(gpath, cpath, o, &policy);
  std::cout << "bisect " << cpath << " against " << gpath << " under " << r.policy_file << " ["
            << r.policy_section << "]\n";
  if (r.first_failing < 0) {
    std::cout << "every common capture point is within policy";
    if (!r.e2e_verdict.pass) std::cout << ", but end to end fails:";
    std::cout << "\n";
    for (const auto& f : r.e2e_verdict.failures)
      std::cout << "  " << f << "\n";
    return r.pass ? 0 : kPolicyFails;
  }
  const auto i = static_cast<size_t>(r.first_failing);
  const auto& bad = r.points[i];
  std::cout << "first failing capture point (execution order): " << bad.name << "\n";
  if (i > 0) print_point(r.points[i - 1], "before", r.seq_len);
  print_point(bad, "FIRST ", r.seq_len);
  if (i + 1 < r.points.size()) print_point(r.points[i + 1], "after ", r.seq_len);
  // Worst token positions of the failing point.
  std::vector<size_t> rows(bad.stats.row_rel_l2.size());
  std::iota(rows.begin(), rows.end(), 0);
  std::stable_sort(rows.begin(), rows.end(), [&](size_t a, size_t b) {
    return bad.stats.row_rel_l2[a] > bad.stats.row_rel_l2[b];
  });
  std::cout << "  worst positions (sequence:token rel_l2):";
  for (size_t k = 0; k < std::min<size_t>(5, rows.size()); ++k)
    std::cout << "  " << rows[k] / static_cast<size_t>(r.seq_len) << ":"
              << rows[k] % static_cast<size_t>(r.seq_len) << " " << bad.stats.row_rel_l2[rows[k]];
  std::cout << "\n";
  // Local or inherited: re-run the layer on the golden's inputs in the candidate (the reference
  // running the candidate's checkpoint), when we have it.
  if (o.model.empty()) {
    std::cout << "  local or inherited: give --model DIR (the checkpoint the candidate ran) to "
                 "re-run this layer on the golden's inputs\n";
    return kPolicyFails;
  }
#ifdef QPARITY_HAS_ENGINE
  // A dump of the GPU engine is re-run in the GPU engine (`qparity engine layer` does the same).
  if (r.candidate.producer == "qparity-gpu-engine") {
    const auto g = golden::GoldenReader::open(gpath);
    const auto dot = bad.name.find('.', 7);
    if (bad.name.rfind("layers.", 0) != 0 || dot == std::string::npos) {
      std::cout << "  local or inherited: " << bad.name << " is not inside a decoder layer\n";
      return kPolicyFails;
    }
    const int64_t layer = std::stoll(bad.name.substr(7, dot - 7));
    gpu::EngineOptions eo;
    eo.max_tokens = std::max<int64_t>(g.seq_len(), 64);
    eo.max_seqs = 1;
    eo.max_context = g.seq_len() + 1;
    gpu::Engine e(gpu::load_gpu_model(o.model, nullptr), eo);
    const golden::PolicySection& section = golden::policy_section(
        policy, golden::PolicyRole::kEngine,
        o.device.empty() ? golden::device_key(r.candidate.device) : o.device);
    for (const auto& p : gpu::engine_rerun_layer(e, g, layer)) {
      if (p.name != bad.name) continue;
      const golden::Verdict v = golden::judge_point(section, p.name, p.stats);
      std::cout << (v.pass ? "  INHERITED" : "  LOCAL") << ": the GPU engine re-run of layer "
                << layer << " on the golden's inputs gives " << p.name << " rel_l2 "
                << p.stats.rel_l2
                << (v.pass ? ", within policy: the error flowed in from earlier points\n"
                           : ", still outside policy: the layer itself is wrong\n");
    }
    return kPolicyFails;
  }
#endif
  reference::LoadOptions lo;
  if (!o.scheme.empty()) lo.override_scheme = o.scheme;
  lo.dialect = reference::parse_dialect(o.dialect);
  lo.mode = reference::parse_precision_mode(
      !o.mode.empty() ? o.mode : (r.candidate.precision_mode == "emulate" ? "emulate" : "exact"));
  auto model = reference::load_model(o.model, lo);
  const auto g = golden::GoldenReader::open(gpath);
  const golden::PolicySection& section = golden::policy_section(
      policy, o.role == "format" ? golden::PolicyRole::kFormat : golden::PolicyRole::kEngine,
      o.device.empty() ? golden::device_key(r.candidate.device) : o.device);
  const auto rr = golden::rerun_layer_point(*model, g, bad.name, &section);
  if (!rr.available) {
    std::cout << "  local or inherited: cannot re-run (" << rr.why_not << ")\n";
  } else if (rr.local) {
    std::cout << "  LOCAL: re-run on the golden's " << rr.input_point << ", " << bad.name
              << " still fails (rel_l2 " << rr.stats.rel_l2 << "): the layer itself is wrong\n";
  } else {
    std::cout << "  INHERITED: re-run on the golden's " << rr.input_point << ", " << bad.name
              << " is within policy (rel_l2 " << rr.stats.rel_l2
              << "): the error flowed in from earlier points\n";
  }
  return kPolicyFails;
}

}  // namespace

void add_compare_command(CLI::App& app, int& rc) {
  auto o = std::make_shared<CompareOptions>();
  auto* cmd = app.add_subcommand(
      "compare", "Compare a candidate dump with a golden, point by point and end to end");
  cmd->add_option("golden", o->golden, "golden .h5")->required();
  cmd->add_option("candidate", o->candidate, "candidate .h5 (same schema, same inputs)")
      ->required();
  cmd->add_option("--policy", o->policy, "tolerance policy JSON (tests/accuracy/policies/)");
  cmd->add_option("--role", o->role, "engine (same scheme) | format (vs unquantized)")
      ->capture_default_str();
  cmd->add_option("--device", o->device, "policy device key (default: from the candidate)");
  cmd->add_flag("--json", o->json, "machine-readable report");
  cmd->callback([o, &rc] { rc = compare(*o); });

  auto b = std::make_shared<CompareOptions>();
  auto* bis = app.add_subcommand(
      "bisect", "Find the first capture point, in execution order, that leaves tolerance");
  bis->add_option("golden", b->golden, "golden .h5");
  bis->add_option("candidate", b->candidate, "candidate .h5");
  bis->add_option("--candidates", b->candidates, "two candidate dumps: older, newer")->expected(2);
  bis->add_option("--policy", b->policy, "tolerance policy JSON");
  bis->add_option("--role", b->role, "engine | format")->capture_default_str();
  bis->add_option("--device", b->device, "policy device key (default: from the candidate)");
  bis->add_option("--model", b->model,
                  "the candidate's checkpoint: re-run the failing layer on golden inputs (in the "
                  "GPU engine when the candidate is its dump, else in the reference)");
  bis->add_option("--scheme", b->scheme, "with --model: scheme override");
  bis->add_option("--dialect", b->dialect, "with --model: dialect")->capture_default_str();
  bis->add_option("--mode", b->mode, "with --model: exact | emulate (default: the candidate's)");
  bis->add_option("--git", b->git, "GOOD BAD: drive git bisect run with compare as the oracle")
      ->expected(2);
  bis->add_option("command", b->command, "(with --git, after --) builds and writes CANDIDATE");
  bis->callback([b, &rc] { rc = bisect(*b); });

  auto orc = std::make_shared<CompareOptions>();
  auto* oracle = app.add_subcommand("bisect-oracle", "one git-bisect step (used by --git)");
  oracle->group("");  // internal: not listed in --help
  oracle->add_option("golden", orc->golden)->required();
  oracle->add_option("candidate", orc->candidate)->required();
  oracle->add_option("command", orc->command)->required();
  oracle->add_option("--policy", orc->policy)->required();
  oracle->add_option("--role", orc->role);
  oracle->add_option("--device", orc->device);
  oracle->callback([orc, &rc] { rc = bisect_oracle(*orc); });
}

}  // namespace qparity::cli
