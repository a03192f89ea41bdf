// `qparity validate [--model DIR] [--schemes all|LIST] [--out reports/]`: the main job. Quantizes
// the model into every scheme (statistics from the fp64 reference on synthetic calibration
// tokens), runs the reference per scheme and the unquantized reference on the same inputs, and
// writes the report set: what each format does to this model, layer by layer and end to end.
// Without --model it builds the embedded default: the `small` Qwen3 fixture, plus the `tiny`
// Qwen3-MoE fixture for the MoE-specific paths (expert stacks, per-expert scales, w13
// unification, mxint4).
#include <chrono>
#include <filesystem>
#include <iostream>
#include <memory>
#include <sstream>
#include <string>
#include <tuple>
#include <vector>

#include "commands.h"
#include "core/error.h"
#include "fixtures/checkpoint_quantizer.h"
#include "fixtures/fixture_model.h"
#include "golden/reference_run.h"
#include "golden/report.h"
#include "reference_cpu/models/calibration.h"
#ifdef QPARITY_HAS_ENGINE
#include "gpu_engine/device_info.h"
#include "gpu_engine/engine_golden.h"
#endif

namespace qparity::cli {
namespace {

namespace fs = std::filesystem;

const std::vector<std::string> kAllSchemes = {
    "w8a16-ch",  "w8a16-g64", "w8a8-static", "w8a8s",       "w8a8-int8-dyn", "smoothquant",
    "w4a16-g32", "mxint4",    "fp8-tensor",  "fp8-channel", "fp8-block",     "mxfp8",
    "nvfp4",     "mxfp4",     "kv-int8",     "kv-fp8"};

struct ValidateOptions {
  std::string model, schemes = "all", out = "reports", policies;
  int64_t sequences = 4, seq_len = 32, calib_tokens = 64;
  uint64_t seed = 7;
  bool keep_work = false;
  bool no_engine = false;
};

std::vector<std::string> split(const std::string& s) {
  std::vector<std::string> out;
  std::stringstream ss(s);
  std::string item;
  while (std::getline(ss, item, ','))
    if (!item.empty()) out.push_back(item);
  return out;
}

struct Target {
  fs::path dir;
  std::string name;
  std::vector<std::string> schemes;
};

double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

// Returns the schemes whose format gates failed ("model/scheme: first failing point").
std::vector<std::string> validate_one(const Target& t, const ValidateOptions& o,
                                      const fs::path& work) {
  std::vector<std::string> failed;
  const auto t0 = std::chrono::steady_clock::now();
  const ModelConfig cfg = load_model_config(t.dir / "config.json");
  const golden::TokenInputs in =
      golden::synthetic_inputs(o.sequences, o.seq_len, cfg.vocab, o.seed);
  golden::ReferenceRunOptions ro;
  ro.point_precision = golden::PointPrecision::kF32;  // format errors are far above fp32 rounding
  std::cerr << "qparity validate: " << t.name << ": unquantized reference on " << in.sequences
            << "x" << in.seq_len << " tokens\n";
  golden::Golden base = golden::run_reference(t.dir, in, ro, nullptr);
  base.meta.model = t.name;
  const fs::path base_file = work / (t.name + ".bf16.h5");
  write_golden(base_file, base, OverwritePolicy::kReplace);
  std::cerr << "qparity validate: " << t.name << ": calibrating on " << o.calib_tokens
            << " synthetic tokens\n";
  const auto stats = fixtures::calibrate_checkpoint(
      t.dir, reference::synthetic_tokens(o.calib_tokens, cfg.vocab, o.seed + 1));
  const auto base_reader = golden::GoldenReader::open(base_file);
  for (const auto& scheme : t.schemes) {
    const auto ts = std::chrono::steady_clock::now();
    const fs::path qdir = work / (t.name + "." + scheme);
    fixtures::quantize_checkpoint(t.dir, parse_scheme_id(scheme), reference::Dialect::kIdeal, qdir,
                                  stats, OverwritePolicy::kReplace, nullptr);
    golden::Golden g = golden::run_reference(qdir, in, ro, nullptr);
    g.meta.model = t.name;
    g.meta.scheme = scheme;  // what was asked for (smoothquant's plan reads as w8a8-static)
    const fs::path gfile = work / (t.name + "." + scheme + ".h5");
    write_golden(gfile, g, OverwritePolicy::kReplace);
    golden::Policy policy;
    golden::CompareOptions co;
    co.role = golden::PolicyRole::kFormat;
    const fs::path pfile = fs::path(o.policies) / (scheme + ".json");
    if (!o.policies.empty() && fs::exists(pfile)) {
      policy = golden::load_policy(pfile);
      co.policy = &policy;
    }
    const auto r = golden::compare_goldens(base_reader, golden::GoldenReader::open(gfile), co);
    const auto files = golden::write_report(golden::report_json(r, "format"), o.out);
    std::cerr << "qparity validate: " << t.name << " " << scheme << ": mean KLD "
              << r.e2e.kld_mean.value << ", top-1 " << r.e2e.top1.value << " (" << seconds_since(ts)
              << " s) -> " << files.md.string() << "\n";
    if (!r.pass) {
      const std::string where = r.first_failing >= 0
                                    ? r.points[static_cast<size_t>(r.first_failing)].name
                                    : std::string("end to end");
      failed.push_back(t.name + "/" + scheme + ": " + where);
      std::cerr << "qparity validate: " << t.name << " " << scheme
                << ": FAILS its format policy at " << where << "\n";
    }
    if (!o.keep_work) {
      fs::remove_all(qdir);
      fs::remove(gfile);
    }
  }
#ifdef QPARITY_HAS_ENGINE
  // Engine against the reference, when a GPU is here: the bf16 model (the engine's quantized
  // linear methods are not built yet), the reference golden in emulate mode, the engine policy.
  std::string why;
  if (!o.no_engine && gpu::query_device(0, &why)) {
    const auto te = std::chrono::steady_clock::now();
    golden::ReferenceRunOptions er = ro;
    er.mode = reference::PrecisionMode::kEmulate;
    golden::Golden ref = golden::run_reference(t.dir, in, er, nullptr);
    ref.meta.model = t.name;
    const fs::path rfile = work / (t.name + ".bf16.emulate.h5");
    write_golden(rfile, ref, OverwritePolicy::kReplace);
    gpu::EngineOptions eo;
    eo.max_tokens = std::max<int64_t>(o.seq_len * o.sequences, o.seq_len);
    eo.max_seqs = std::max<int64_t>(o.sequences, 1);
    eo.max_context = o.seq_len + 1;
    gpu::Engine e(gpu::load_gpu_model(t.dir, nullptr), eo);
    golden::Policy policy;
    const fs::path pfile = fs::path(o.policies) / "bf16.json";
    const bool have_policy = !o.policies.empty() && fs::exists(pfile);
    if (have_policy) policy = golden::load_policy(pfile);
    const auto ref_reader = golden::GoldenReader::open(rfile);
    // Layer-local: each layer on the reference's own inputs, judged point by point.
    golden::Golden local = gpu::engine_golden_local(e, ref_reader, "*", nullptr);
    local.meta.model = t.name;
    local.meta.point_precision = golden::PointPrecision::kF32;
    const fs::path lfile = work / (t.name + ".bf16.engine-local.h5");
    write_golden(lfile, local, OverwritePolicy::kReplace);
    golden::CompareOptions co;
    if (have_policy) co.policy = &policy;
    const auto r = golden::compare_goldens(ref_reader, golden::GoldenReader::open(lfile), co);
    const auto files = golden::write_report(golden::report_json(r, "engine"), o.out);
    // Free run: the engine on its own from the tokens; reported with its end-to-end numbers,
    // not gated point by point (upstream error is amplified by the model, layer after layer).
    golden::Golden cand = gpu::engine_golden(e, in, "*", true, nullptr);
    cand.meta.model = t.name;
    cand.meta.scheme = "bf16-free-run";
    cand.meta.point_precision = golden::PointPrecision::kF32;
    const fs::path cfile = work / (t.name + ".bf16.engine.h5");
    write_golden(cfile, cand, OverwritePolicy::kReplace);
    const auto fr = golden::compare_goldens(ref_reader, golden::GoldenReader::open(cfile), {});
    golden::write_report(golden::report_json(fr, "engine"), o.out);
    std::cerr << "qparity validate: " << t.name << " bf16 on " << local.meta.device
              << ": engine vs reference, layer-local " << (r.pass ? "pass" : "FAIL")
              << "; free run mean KLD " << fr.e2e.kld_mean.value << ", top-1 " << fr.e2e.top1.value
              << " (" << seconds_since(te) << " s) -> " << files.md.string() << "\n";
    if (!r.pass) failed.push_back(t.name + "/bf16 engine (layer-local) on " + local.meta.device);
    std::cerr << "qparity validate: the GPU engine runs unquantized checkpoints only; the "
                 "quantized schemes have format rows, no engine rows\n";
  } else if (!o.no_engine) {
    std::cerr << "qparity validate: no engine rows (" << why << ")\n";
  }
#endif
  std::cerr << "qparity validate: " << t.name << " done in " << seconds_since(t0) << " s\n";
  return failed;
}

// True when every scheme is within its format policy.
bool run(const ValidateOptions& o) {
  const auto t0 = std::chrono::steady_clock::now();
  fs::create_directories(o.out);
  const fs::path work = fs::path(o.out) / ".work";
  fs::create_directories(work);
  std::vector<std::string> wanted = o.schemes == "all" ? kAllSchemes : split(o.schemes);
  for (const auto& s : wanted)
    parse_scheme_id(s);  // an unknown id is an error up front
  std::vector<Target> targets;
  if (!o.model.empty()) {
    const ModelConfig cfg = load_model_config(fs::path(o.model) / "config.json");
    Target t{o.model, golden::model_name(o.model), {}};
    for (const auto& s : wanted)
      if (s != "mxint4" || cfg.num_experts > 0) t.schemes.push_back(s);
    targets.push_back(t);
  } else {
    for (const auto& [arch, size, name] :
         {std::tuple{"qwen3", fixtures::FixtureSize::kSmall, "qwen3-small-fixture"},
          std::tuple{"qwen3-moe", fixtures::FixtureSize::kTiny, "qwen3-moe-tiny-fixture"}}) {
      fixtures::FixtureSpec spec;
      spec.arch = fixtures::parse_fixture_arch(arch);
      spec.size = size;
      spec.seed = 1;
      const fs::path dir = work / name;
      fixtures::write_fp_checkpoint(spec, dir, OverwritePolicy::kReplace);
      Target t{dir, name, {}};
      for (const auto& s : wanted)
        if (s != "mxint4" || std::string(arch) == "qwen3-moe") t.schemes.push_back(s);
      targets.push_back(t);
    }
  }
  std::vector<std::string> failed;
  for (const auto& t : targets)
    for (auto& f : validate_one(t, o, work))
      failed.push_back(std::move(f));
  golden::write_index(o.out);
  if (!o.keep_work) fs::remove_all(work);
  std::cerr << "qparity validate: reports in " << o.out << " (index.md, index.html), "
            << seconds_since(t0) << " s\n";
  for (const auto& f : failed)
    std::cerr << "qparity validate: outside its policy: " << f << "\n";
  return failed.empty();
}

}  // namespace

void add_validate_command(CLI::App& app, int& rc) {
  auto o = std::make_shared<ValidateOptions>();
#ifdef QPARITY_POLICY_DIR
  o->policies = QPARITY_POLICY_DIR;
#endif
  auto* cmd = app.add_subcommand(
      "validate", "The main job: every scheme against the unquantized reference, as reports");
  cmd->add_option("--model", o->model, "checkpoint directory (default: the embedded fixtures)");
  cmd->add_option("--schemes", o->schemes, "all, or a comma-separated list of scheme ids")
      ->capture_default_str();
  cmd->add_option("--out", o->out, "report root")->capture_default_str();
  cmd->add_option("--policies", o->policies, "tolerance policy directory")->capture_default_str();
  cmd->add_option("--sequences", o->sequences, "synthetic sequences")->capture_default_str();
  cmd->add_option("--seq-len", o->seq_len, "tokens per sequence")->capture_default_str();
  cmd->add_option("--calib-tokens", o->calib_tokens, "synthetic calibration tokens")
      ->capture_default_str();
  cmd->add_option("--seed", o->seed, "seed of the synthetic tokens")->capture_default_str();
  cmd->add_flag("--keep-work", o->keep_work, "keep quantized checkpoints and goldens in .work/");
  cmd->add_flag("--no-engine", o->no_engine, "skip the engine-vs-reference rows on a GPU machine");
  cmd->callback([o, &rc] {
    // 3: a format did worse than its policy allows (reports are written either way).
    rc = run(*o) ? 0 : 3;
  });
}

}  // namespace qparity::cli
