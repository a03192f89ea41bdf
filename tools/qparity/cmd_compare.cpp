// `qparity compare GOLDEN CANDIDATE [--policy FILE] [--role engine|format] [--json]` and
// `qparity bisect GOLDEN CANDIDATE [--policy FILE] [--model DIR]` /
// `qparity bisect --candidates A B --policy F` / `qparity bisect --git GOOD BAD ... -- CMD`.
// Exit status: 0 pass or not judged, 3 the candidate fails, 1 bad input, 2 usage.
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
#include "golden/engine_golden.h"
#include "gpu_engine/device_info.h"
#include "gpu_engine/model_loader.h"
#endif
#include "core/capture/capture_points.h"
#include "core/error.h"
#include "golden/bisect.h"
#include "golden/compare.h"
#include "golden/layer_rerun.h"
#include "golden/reference_run.h"
#include "reference_cpu/models/model_loader.h"
#include "tools/qparity/cli_support.h"

namespace qparity::cli {
namespace {

namespace fs = std::filesystem;

constexpr int kPolicyFails = 3;

struct CompareOptions {
  std::string golden, candidate, policy, role, device, budget;
  bool budget_given = false;  // --budget appeared (an empty value is an error, not "absent")
  bool allow_other_checkpoint = false;
  std::string model, scheme, dialect, mode;  // bisect: the candidate's checkpoint, re-runnable
  std::vector<std::string> candidates;
  std::vector<std::string> git;      // --git GOOD BAD
  std::vector<std::string> command;  // after --: what builds and dumps the candidate
  bool json = false;
};

struct Compared {
  golden::CompareReport report;
  ChosenPolicy chosen;
};

Compared run_compare(const std::string& gpath, const std::string& cpath, const CompareOptions& o) {
  const auto g = golden::GoldenReader::open(gpath);
  const auto c = golden::GoldenReader::open(cpath);
  Compared out;
  out.chosen = choose_policy(o.policy, o.role, g.meta(), c.meta());
  golden::CompareOptions co;
  co.policy = out.chosen.policy ? &*out.chosen.policy : nullptr;
  co.role = out.chosen.role;
  if (!o.device.empty()) co.device = o.device;
  co.budget = budget_for(o.budget, o.budget_given, out.chosen.role);
  if (co.budget) co.budget_source = "--budget " + o.budget;
  co.allow_other_checkpoint = o.allow_other_checkpoint;
  out.report = golden::compare_goldens(g, c, co);
  out.report.policy_source = out.chosen.source;
  return out;
}

int exit_status(const golden::CompareReport& r) {
  return r.verdict == golden::Judgement::kFail ? kPolicyFails : 0;
}

int compare(const CompareOptions& o) {
  const auto [r, chosen] = run_compare(o.golden, o.candidate, o);
  if (o.json)
    std::cout << golden::to_json(r).dump(1) << "\n";
  else
    std::cout << golden::to_text(r);
  return exit_status(r);
}

void print_point(const golden::PointReport& p, const char* tag) {
  std::cout << "  " << tag << " " << p.name << ": rel_l2 " << p.stats.rel_l2 << ", max_abs "
            << p.stats.max_abs << ", cosine " << p.stats.cosine;
  if (p.verdict.gated || !p.verdict.pass)
    std::cout << (p.verdict.pass ? " (within policy)" : " (outside policy)");
  std::cout << "\n";
  for (const auto& f : p.verdict.failures)
    std::cout << "      " << f << "\n";
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
    const auto [r, chosen] = run_compare(o.golden, o.candidate, o);
    if (r.verdict == golden::Judgement::kNotJudged) {
      std::cerr << "qparity bisect oracle: skip: not judged (" << chosen.source << ")\n";
      return 125;
    }
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
  if (o.git.size() != 2) throw UsageError("bisect --git", "takes GOOD and BAD revisions");
  if (o.golden.empty() || o.candidate.empty() || o.command.empty() || o.policy.empty())
    throw UsageError("bisect --git",
                     "usage: qparity bisect --git GOOD BAD --policy P GOLDEN CANDIDATE -- CMD...; "
                     "CMD builds and writes CANDIDATE at each commit");
  golden::load_policy(o.policy);  // a bad policy is an error now, not a skip at every commit
  const std::string self = fs::read_symlink("/proc/self/exe").string();
  const auto run = [](const std::string& c) { return std::system(c.c_str()); };
  if (run("git bisect start " + shell_quote(o.git[1]) + " " + shell_quote(o.git[0])) != 0)
    throw Error("bisect --git",
                "git bisect start failed (is this a git repository, are the "
                "revisions valid?)");
  std::string oracle = shell_quote(self) + " bisect-oracle --policy " + shell_quote(o.policy);
  if (!o.role.empty()) oracle += " --role " + shell_quote(o.role);
  if (!o.device.empty()) oracle += " --device " + shell_quote(o.device);
  oracle += " " + shell_quote(fs::absolute(o.golden).string()) + " " +
            shell_quote(fs::absolute(o.candidate).string()) + " --";
  for (const auto& a : o.command)
    oracle += " " + shell_quote(a);
  const int rc = run("git bisect run " + oracle);
  run("git bisect reset >/dev/null 2>&1");
  if (rc != 0) throw Error("bisect --git", "git bisect run failed");
  return 0;
}

// --model must be the checkpoint the candidate ran: its config and its tensors hash to what the
// candidate recorded, each hash on its own: where the candidate lacks one, the golden's (engine
// role: the same checkpoint) is the reference, so a candidate recording only its config.json's
// hash cannot pass a checkpoint with the same config and other weights.
void check_model_matches(const std::string& model, const golden::GoldenMeta& candidate,
                         const golden::GoldenMeta& golden_meta, golden::PolicyRole role) {
  const auto check = [&](const std::string& got, const std::string& cand, const std::string& gold,
                         const char* what, const char* attr) {
    const bool own = !cand.empty();
    // The format role's golden ran the unquantized checkpoint: nothing to check against there.
    const std::string& recorded = own ? cand : (role == golden::PolicyRole::kEngine ? gold : cand);
    if (recorded.empty() || got == recorded) return;
    const golden::GoldenMeta& want = own ? candidate : golden_meta;
    throw Error("--model " + model,
                std::string(what) + " sha256 " + got.substr(0, 16) + "... differs from " +
                    (own ? "the candidate's " : "the golden's ") + attr + " " +
                    recorded.substr(0, 16) + "...: this is not the checkpoint the candidate ran (" +
                    want.model + ", " + want.architecture + ")");
  };
  check(golden::config_hash(model), candidate.model_config_hash, golden_meta.model_config_hash,
        "config.json", "model_config_hash");
  check(golden::checkpoint_tensor_hash(model), candidate.checkpoint_hash,
        golden_meta.checkpoint_hash, "the tensors'", "checkpoint_hash");
}

// The first NaN/Inf of the dump, located: point, sequence:token, column.
void print_first_nonfinite(const golden::CompareReport& r) {
  if (r.first_nonfinite < 0) {
    for (const auto& n : r.nonfinite)
      std::cout << "first NaN/Inf: " << n << "\n";
    return;
  }
  const auto& p = r.points[static_cast<size_t>(r.first_nonfinite)];
  const int64_t i = p.stats.first_nonfinite, row = i / std::max<int64_t>(p.cols, 1);
  std::cout << "first NaN/Inf (execution order): " << p.name << ", sequence " << row / r.seq_len
            << " token " << row % r.seq_len << ", column " << i % std::max<int64_t>(p.cols, 1)
            << " (" << golden::nonfinite_failures(p.stats).front() << ")\n";
}

int bisect(const CompareOptions& o) {
  if (!o.git.empty()) return git_bisect(o);
  std::string gpath = o.golden, cpath = o.candidate;
  if (!o.candidates.empty()) {
    if (o.candidates.size() != 2 || !o.golden.empty())
      throw UsageError("bisect",
                       "--candidates takes exactly two dumps (the older first) and no golden");
    gpath = o.candidates[0];
    cpath = o.candidates[1];
  }
  if (gpath.empty() || cpath.empty())
    throw UsageError("bisect", "give GOLDEN CANDIDATE (or --candidates OLD NEW)");
  const auto [r, chosen] = run_compare(gpath, cpath, o);
  if (!chosen.policy)
    throw UsageError("bisect",
                     "needs a policy to say what fails: " + chosen.source + "; give --policy FILE");
  std::cout << "bisect " << cpath << " against " << gpath << "\n  judged by "
            << golden::judged_by_text(r) << "\n";
  for (const auto& m : r.missing_failures)
    std::cout << "  the candidate lacks " << m << " (the policy does not allow it)\n";
  if (!r.nonfinite.empty()) print_first_nonfinite(r);
  if (r.first_failing < 0) {
    std::cout << "every common capture point is within policy";
    if (!r.e2e_verdict.pass) std::cout << ", but end to end fails:";
    std::cout << "\n";
    for (const auto& f : r.e2e_verdict.failures)
      std::cout << "  " << f << "\n";
    return exit_status(r);
  }
  const auto i = static_cast<size_t>(r.first_failing);
  const auto& bad = r.points[i];
  std::cout << "first capture point outside policy (execution order): " << bad.name << "\n";
  if (i > 0) print_point(r.points[i - 1], "before");
  print_point(bad, "FIRST ");
  if (i + 1 < r.points.size()) print_point(r.points[i + 1], "after ");
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

  // Local or inherited (golden/bisect.h's decision table).
  const auto g = golden::GoldenReader::open(gpath);
  const auto c = golden::GoldenReader::open(cpath);
  const golden::PolicySection& section =
      golden::policy_section(*chosen.policy, chosen.role,
                             o.device.empty() ? golden::device_key(r.candidate.device) : o.device);
  std::unique_ptr<reference::CausalLm> model;
  std::optional<golden::Runner> spec;
  std::string no_model = "no --model DIR (the checkpoint the candidate ran)";
  std::string own_missing = no_model;
  std::optional<golden::Runner> own;
  if (!o.model.empty() && point_layer(bad.name) >= 0 &&
      r.candidate.run_mode == golden::RunMode::kFree) {
    check_model_matches(o.model, r.candidate, r.golden, chosen.role);
    reference::LoadOptions lo;
    if (!o.scheme.empty()) lo.override_scheme = o.scheme;
    const std::string dialect = !o.dialect.empty() ? o.dialect : r.candidate.dialect;
    lo.dialect = parse_dialect(dialect.empty() ? "ideal" : dialect);
    // Engines store activations in bf16; the reference's emulate mode does the same.
    const std::string mode = !o.mode.empty()                         ? o.mode
                             : r.candidate.precision_mode == "exact" ? "exact"
                                                                     : "emulate";
    lo.mode = reference::parse_precision_mode(mode);
    model = reference::load_model(o.model, lo);
    const std::string name = "the qparity reference (" + golden::plan_scheme(model->plan()) +
                             ", dialect " + std::string(qparity::to_string(lo.dialect)) + ", " +
                             mode + ")";
    spec = golden::reference_runner(*model, name);
    if (r.candidate.producer == "qparity-reference") {
      own = spec;  // the candidate is the reference: its own implementation is the spec's
    } else {
      own_missing =
          "the candidate's engine (" + r.candidate.producer + ") cannot be re-run by qparity";
    }
#ifdef QPARITY_HAS_ENGINE
    std::string why;
    if (r.candidate.producer == "qparity-gpu-engine" && gpu::query_device(0, &why)) {
      gpu::EngineOptions eo;
      eo.max_tokens = std::max<int64_t>(g.seq_len(), 64);
      eo.max_seqs = 1;
      eo.max_context = g.seq_len() + 1;
      gpu::GpuLoadOptions glo;
      glo.dialect = r.candidate.dialect == "sglang" ? Dialect::kSglang : Dialect::kVllm;
      auto engine = std::make_shared<gpu::Engine>(gpu::load_gpu_model(o.model, nullptr, glo), eo);
      own = golden::Runner{
          "the GPU engine",
          [engine](const golden::GoldenReader& source, const std::string& point,
                   std::string* why_not) -> std::optional<golden::PointStats> {
            for (const auto& p : gpu::engine_rerun_layer(*engine, source, point_layer(point)))
              if (p.name == point) return p.stats;
            *why_not = "the GPU engine's re-run does not capture " + point;
            return std::nullopt;
          }};
    } else if (r.candidate.producer == "qparity-gpu-engine") {
      own_missing = "the GPU engine needs a usable GPU (" + why + ")";
    }
#endif
  }
  const golden::LayerDiagnosis d = golden::diagnose_layer(
      r, i, g, c, section, own ? &*own : nullptr, own_missing, spec ? &*spec : nullptr, no_model);
  std::cout << "  the dump: its inputs to this point are " << golden::to_string(d.inputs) << " ("
            << d.input_detail << ")\n";
  for (const auto* rr : {&d.own, &d.spec}) {
    const char* what = rr == &d.own ? "own re-run on the golden's inputs"
                                    : "spec re-run on the candidate's inputs";
    if (rr->ran)
      std::cout << "  " << what << " (" << rr->runner << "): rel_l2 " << rr->stats.rel_l2
                << (rr->agrees ? (rr == &d.own ? ", within policy" : ", reproduces the dump")
                               : (rr == &d.own ? ", outside policy" : ", does not reproduce it"))
                << "\n";
    else
      std::cout << "  " << what << ": not run (" << rr->why_not << ")\n";
  }
  std::cout << "  " << golden::to_string(d.diagnosis) << " (decision table row " << d.row
            << "): " << d.reason << "\n";
  std::cout << "verdict " << golden::to_string(r.verdict)
            << (r.point_gates_judge ? ""
                                    : " (judged end to end: the point gates above judge "
                                      "layer-local dumps, not this free run)")
            << "\n";
  return exit_status(r);
}

}  // namespace

void add_compare_command(CLI::App& app, int& rc) {
  auto o = std::make_shared<CompareOptions>();
  auto* cmd = app.add_subcommand(
      "compare", "Compare a candidate dump with a golden, point by point and end to end");
  cmd->add_option("golden", o->golden, "golden .h5")->required();
  cmd->add_option("candidate", o->candidate, "candidate .h5 (same schema, same inputs)")
      ->required();
  cmd->add_option(
      "--policy", o->policy,
      "tolerance policy JSON (default: the installed policies/<candidate scheme>.json)");
  cmd->add_option("--role", o->role,
                  "engine (same scheme) | format (vs unquantized); default: implied by the files")
      ->check(role_choices());
  cmd->add_option("--device", o->device, "policy device key (default: from the candidate)");
  cmd->add_option("--budget", o->budget,
                  "format role: kld=X,top1=Y,dln_ppl=Z replaces the policy's default budget")
      ->each([o](const std::string&) { o->budget_given = true; });
  cmd->add_flag("--allow-other-checkpoint", o->allow_other_checkpoint,
                "engine role: compare although the candidate records another checkpoint's hashes");
  cmd->add_flag("--json", o->json, "machine-readable report");
  cmd->callback([o, &rc] { rc = compare(*o); });

  auto b = std::make_shared<CompareOptions>();
  auto* bis = app.add_subcommand(
      "bisect", "Find the first capture point, in execution order, that leaves tolerance");
  bis->add_option("golden", b->golden, "golden .h5");
  bis->add_option("candidate", b->candidate, "candidate .h5");
  bis->add_option("--candidates", b->candidates, "two candidate dumps: older, newer")->expected(2);
  bis->add_option(
      "--policy", b->policy,
      "tolerance policy JSON (default: the installed policies/<candidate scheme>.json)");
  bis->add_option("--role", b->role, "engine | format (default: implied by the files)")
      ->check(role_choices());
  bis->add_option("--device", b->device, "policy device key (default: from the candidate)");
  bis->add_flag("--allow-other-checkpoint", b->allow_other_checkpoint,
                "engine role: bisect although the candidate records another checkpoint's hashes "
                "(a checkpoint with a planted fault)");
  bis->add_option("--model", b->model,
                  "the candidate's checkpoint: re-run the failing layer (docs/JUDGE.md: the bisect "
                  "decision table)");
  bis->add_option("--scheme", b->scheme, "with --model: scheme override");
  bis->add_option("--dialect", b->dialect, "with --model: dialect (default: the candidate's)")
      ->check(dialect_choices());
  bis->add_option("--mode", b->mode, "with --model: exact | emulate (default: the candidate's)")
      ->check(mode_choices());
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
  oracle->add_option("--role", orc->role)->check(role_choices());
  oracle->add_option("--device", orc->device);
  oracle->callback([orc, &rc] { rc = bisect_oracle(*orc); });
}

}  // namespace qparity::cli
