// `qparity validate [--model DIR] [--schemes all|LIST] [--out reports/]`: the main job. Quantizes
// the model into every scheme that applies (statistics from the fp64 reference on synthetic
// calibration tokens), runs the reference per scheme and the unquantized reference on the same
// inputs, and writes the report set: what each format does to this model, layer by layer and end
// to end, judged twice: does the quantized reference do the format's math (the policy's "format"
// gates), and is the format acceptable for this model (its "budget", or --budget). A scheme a
// model's shapes exclude runs with those linears left unquantized, or is skipped when it could
// quantize none; the index lists every skip with the constraint and tensor behind it.
// Without --model it runs the trained fixtures (fixtures/trained/README.md: tiny Llama, Qwen3 and
// Qwen3-MoE models trained on the King James Bible, with their own byte-level BPE tokenizer),
// evaluated on their held-out text and calibrated on a second held-out text, so KLD, top-1 and
// perplexity measure real next-token distributions. --fixtures random runs the generated random
// fixtures instead (the `small` Qwen3 and the `tiny` Qwen3-MoE: exact shapes, synthetic tokens).
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <iostream>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <sstream>
#include <string>
#include <tuple>
#include <vector>

#include "commands.h"
#include "core/capture/capture_points.h"
#include "core/dtype.h"
#include "core/error.h"
#include "core/memory_budget.h"
#include "core/sha256.h"
#include "core/temp_cleanup.h"
#include "fixtures/checkpoint_quantizer.h"
#include "fixtures/fixture_model.h"
#include "golden/reference_run.h"
#include "golden/junit.h"
#include "golden/report.h"
#include "reference_cpu/models/calibration.h"
#include "schemes/description/dialect.h"
#include "schemes/description/quant_plan.h"
#include "tools/qparity/cli_support.h"
#ifdef QPARITY_HAS_ENGINE
#include "golden/engine_golden.h"
#include "gpu_engine/device_info.h"
#include "gpu_engine/model_loader.h"
#include "gpu_engine/quant/gpu_linear_method.h"
#endif

namespace qparity::cli {
namespace {

namespace fs = std::filesystem;

// compressed-tensors' integer presets W4A16, W4A16_ASYM and W8A16 are the ct-w... rows.
const std::vector<std::string> kAllSchemes = {
    "w8a16-ch",      "w8a16-g64",   "w8a8-static", "w8a8s",         "w8a8-int8-dyn",
    "w4a8-dyn",      "smoothquant", "w4a16-g32",   "ct-w4a16-g128", "ct-w4a16-g128-asym",
    "ct-w8a16-g128", "mxint4",      "fp8-tensor",  "fp8-channel",   "fp8-block",
    "mxfp8",         "nvfp4",       "mxfp4",       "kv-int8",       "kv-fp8"};

// Pairs whose rows can be identical by construction, and why (the report says so).
const std::map<std::pair<std::string, std::string>, std::string> kIdenticalBecause = {
    {{"mxint4", "w4a16-g32"},
     "mxint4 is the w4a16-g32 checkpoint format (int4, bf16 scale per 32 inputs) run as one "
     "expert stack; on expert weights the two compute the same numbers"},
    {{"w8a8-static", "w8a8s"},
     "w8a8s carries w8a8-static's tensors and math on a weight the sparse quantizer pruned; "
     "quantizing dense weights without pruning gives the same codes"}};

// Schemes whose activation or KV scales are fixed by calibration: codes at the format's extreme
// mean the evaluation data left the calibrated range (dynamic scales put each row's or group's
// largest value there by construction, so their saturation says nothing).
const std::set<std::string> kStaticallyCalibrated = {"w8a8-static", "w8a8s", "fp8-tensor",
                                                     "kv-int8", "kv-fp8"};
// Schemes whose producer needs input statistics (fixtures/checkpoint_quantizer.h): static
// activation scales, nvfp4's global input scale, KV-cache ranges, smoothing factors.
const std::set<std::string> kNeedsCalibration = {"w8a8-static", "w8a8s",  "fp8-tensor", "nvfp4",
                                                 "kv-int8",     "kv-fp8", "smoothquant"};
// The default calibration: 2048 synthetic tokens. Measured on the tiny Qwen3-MoE fixture, kv-int8's
// mean KLD against the unquantized model falls from 0.46 with 512 tokens to 0.004 with 2048 (0.005
// with 4096): fewer tokens leave K/V channels' ranges short of what evaluation data reaches.
// Warn above 0.1 % of codes at the extreme: a value exactly at the calibrated maximum is one code
// per range, clipping beyond that is the evaluation data outside it.
constexpr double kSaturationWarning = 1e-3;

struct ValidateOptions {
  std::string model, schemes = "all", out = "reports", policies, budget, text, calib_text,
                     memory_budget;
  std::string fixtures = "trained";  // without --model: trained | random
  std::string format;  // --format: the integer points' checkpoints in GPTQ's / AWQ's layout
  int64_t sequences = 4, seq_len = 32, calib_tokens = 2048, stride = 0;
  bool sequences_given = false, seq_len_given = false;  // else the trained set's own defaults
  uint64_t seed = 7;
  bool keep_work = false;
  std::string junit;  // --junit FILE: the report root's rows as JUnit XML
  bool budget_given = false;  // --budget appeared (an empty value is an error, not "absent")
  bool schemes_given = false;
  bool no_engine = false;
  std::vector<std::string> candidates;  // --candidate: another engine's dumps of --model
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

// The points a row's goldens capture: every point while they take at most kRowCaptureLimit in
// memory (fp64, as the run holds them), else the layer boundaries (core/capture/capture_points.h).
constexpr uint64_t kRowCaptureLimit = uint64_t{1} << 30;
std::string row_capture(const fs::path& dir, const golden::TokenInputs& in) {
  return auto_capture(load_model_config(dir / "config.json"), in.sequences * in.seq_len, 8,
                      kRowCaptureLimit);
}

double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

// A hash of what a run computed (logits and every point), to find rows that are identical.
std::string run_fingerprint(const golden::Golden& g) {
  Sha256 h;
  const auto add = [&](const std::vector<double>& v) {
    h.update(std::span<const uint8_t>(reinterpret_cast<const uint8_t*>(v.data()),
                                      v.size() * sizeof(double)));
  };
  add(g.logits.data);
  for (const auto& p : g.points)
    add(p.values.data);
  return h.hex();
}

class Validation {
 public:
  Validation(const ValidateOptions& o, fs::path policies, int64_t total)
      : o_(o), policies_(std::move(policies)), total_(total) {
    // The budget judges the format rows (the engine rows have their engine policies).
    budget_ = budget_for(o.budget, o.budget_given, golden::PolicyRole::kFormat);
  }

  // Returns the rows that failed ("model/scheme: why").
  std::vector<std::string> run_target(const Target& t, const fs::path& work);

 private:
  void progress(const std::string& line) {
    std::cerr << "qparity validate: [" << done_ << "/" << total_ << ", "
              << static_cast<int64_t>(seconds_since(t0_)) << " s] " << line << "\n";
  }
  void format_row(const Target& t, const std::string& scheme,
                  const fixtures::SchemeExclusions& exclusions, const golden::GoldenReader& base,
                  const fixtures::StatsProviders& stats, const golden::TokenInputs& in,
                  const fs::path& work, std::vector<std::string>& failed);
  void engine_rows(const Target& t, const golden::TokenInputs& in, const fs::path& work,
                   const fixtures::StatsProviders& stats, std::vector<std::string>& failed);

  const ValidateOptions& o_;
  fs::path policies_;
  int64_t total_, done_ = 0;
  std::optional<golden::EndToEndGate> budget_;
  std::chrono::steady_clock::time_point t0_ = std::chrono::steady_clock::now();
  // Per model: fingerprint -> (scheme, report json), to note identical rows.
  std::map<std::string, std::vector<std::tuple<std::string, std::string, Json>>> runs_;
};

void Validation::format_row(const Target& t, const std::string& scheme,
                            const fixtures::SchemeExclusions& exclusions,
                            const golden::GoldenReader& base, const fixtures::StatsProviders& stats,
                            const golden::TokenInputs& in, const fs::path& work,
                            std::vector<std::string>& failed) {
  const auto ts = std::chrono::steady_clock::now();
  const SchemeId id = parse_scheme_id(scheme);
  // The linears this scheme cannot take stay unquantized (the row says which and why).
  const std::vector<fixtures::SchemeExclusion>& excluded = exclusions.modules;
  fixtures::QuantizeCheckpointOptions qo;
  qo.ignore_unsupported = true;
  qo.layout = o_.format;
  const fs::path qdir = work / (t.name + "." + scheme);
  fixtures::quantize_checkpoint(t.dir, id, Dialect::kIdeal, qdir, stats, OverwritePolicy::kReplace,
                                nullptr, qo);
  golden::ReferenceRunOptions ro;
  ro.point_precision = golden::PointPrecision::kF32;  // format errors are far above fp32 rounding
  ro.memory_budget = memory_budget_of(o_.memory_budget);
  ro.capture = row_capture(t.dir, in);
  golden::Golden g = golden::run_reference(qdir, in, ro, nullptr);
  g.meta.model = t.name;
  g.meta.scheme = scheme;  // what was asked for (smoothquant's plan reads as w8a8-static)
  const std::string fingerprint = run_fingerprint(g);
  const fs::path gfile = work / (t.name + "." + scheme + ".h5");
  write_golden(gfile, g, OverwritePolicy::kReplace);
  const golden::Policy policy = golden::load_policy(policies_ / (scheme + ".json"));
  golden::CompareOptions co;
  co.role = golden::PolicyRole::kFormat;
  co.policy = &policy;
  if (budget_) {
    co.budget = budget_;
    co.budget_source = "--budget " + o_.budget;
  }
  golden::CompareReport r = golden::compare_goldens(base, golden::GoldenReader::open(gfile), co);
  r.policy_source = "validate: " + (policies_ / (scheme + ".json")).string();
  Json rep = golden::report_json(r, "format");
  if (!o_.format.empty())
    rep["summary"]["notes"].push_back("checkpoint written in the " + o_.format +
                                      " layout (quantize --format " + o_.format + ")");
  if (!excluded.empty()) {
    std::string list;
    for (const auto& e : excluded)
      list += (list.empty() ? "" : "; ") + e.module + " (" + e.tensor + ": " + e.rule + ")";
    rep["summary"]["notes"].push_back(
        std::to_string(excluded.size()) +
        " module(s) left unquantized, the scheme cannot take them: " + list);
  }
  if (scheme_family(id.kind) == SchemeFamily::kTransform) {
    rep["summary"]["role"] = "transform";
    rep["summary"]["notes"].push_back(
        "a transform, not a format: it quantizes nothing (smoothing factors folded into the norms "
        "and the next linears' weights), so this row is what the fold's re-rounding costs; "
        "msModelSlim applies it before w8a8-static, which this run does not combine");
  }
  // Statically calibrated scales clip what leaves the calibrated range: say how much did.
  if (kStaticallyCalibrated.count(scheme)) {
    const golden::ActivationStatsRow* worst = nullptr;
    double rate = 0;
    for (const auto& a : r.activation_stats)
      if (a.candidate && a.candidate->codes > 0) {
        const double x =
            static_cast<double>(a.candidate->saturated) / static_cast<double>(a.candidate->codes);
        if (x > rate) rate = x, worst = &a;
      }
    if (worst && rate > kSaturationWarning) {
      char head[256];
      std::snprintf(head, sizeof head,
                    "the evaluation data leaves the calibrated range: %.2f%% of %s's codes sit at "
                    "the format's extreme (clipped, or at the calibrated maximum); calibrated on ",
                    100 * rate, worst->name.c_str());
      const std::string line =
          head + std::to_string(o_.calib_tokens) +
          (o_.calib_text.empty() ? " synthetic tokens" : " tokens of " + o_.calib_text) +
          " (--calib-tokens)";
      rep["summary"]["notes"].push_back(line);
      std::cerr << "qparity validate: warning: " << t.name << " " << scheme << ": " << line << "\n";
    }
  }
  // Identical rows: the same numbers as an earlier scheme of this model.
  for (auto& [other, other_fp, other_rep] : runs_[t.name]) {
    if (other_fp != fingerprint) continue;
    const auto key = std::minmax(scheme, other);
    const auto why = kIdenticalBecause.find({key.first, key.second});
    const std::string because =
        why != kIdenticalBecause.end() ? ": " + why->second : " on this model";
    rep["summary"]["notes"].push_back("identical to " + other + because);
    other_rep["summary"]["notes"].push_back("identical to " + scheme + because);
    golden::write_report(other_rep, o_.out);
  }
  const auto files = golden::write_report(rep, o_.out);
  runs_[t.name].emplace_back(scheme, fingerprint, rep);
  ++done_;
  std::ostringstream line;
  line << t.name << " " << scheme << ": " << golden::to_string(r.verdict) << " (budget "
       << (r.has_budget ? golden::budget_check_text(r.budget_verdict) : std::string("-"))
       << "), mean KLD " << r.e2e.kld_mean.value << ", top-1 " << r.e2e.top1.value << " ("
       << static_cast<int64_t>(seconds_since(ts)) << " s) -> " << files.md.string();
  progress(line.str());
  if (r.verdict == golden::Judgement::kFail) {
    failed.push_back(t.name + "/" + scheme + ": " + r.failures.front());
    for (const auto& f : r.failures)
      std::cerr << "qparity validate:   " << f << "\n";
  }
  if (!o_.keep_work) {
    fs::remove_all(qdir);
    fs::remove(gfile);
  }
}

// Why no producer writes `scheme` for this model in `dialect` (ChatGLM2: msModelSlim's layouts
// only; Qwen3.5: compressed-tensors only), or nullopt.
std::optional<std::string> no_producer(const ModelConfig& cfg, const std::string& scheme,
                                       Dialect dialect) {
  if (cfg.arch == Arch::kChatGlm2 &&
      !fixtures::writes_msmodelslim_layout(parse_scheme_id(scheme), dialect))
    return "ChatGLM2 (remote-code modelling) has no compressed-tensors producer; its quantized "
           "checkpoints are msModelSlim's";
  if (cfg.image_text && fixtures::writes_msmodelslim_layout(parse_scheme_id(scheme), dialect))
    return cfg.arch_name + ": msModelSlim's layout for image-text checkpoints is not written here";
  if (cfg.has_linear_attention()) {
    const SchemeId id = parse_scheme_id(scheme);
    if (fixtures::writes_msmodelslim_layout(id, dialect) ||
        scheme_family(id.kind) == SchemeFamily::kTransform)
      return cfg.arch_name +
             " (Gated DeltaNet): no msModelSlim producer or smoothing transform for it is known "
             "to this tool; its quantized checkpoints here are compressed-tensors' (the Gated "
             "DeltaNet kept unquantized, as llm-compressor's recipes write it)";
  }
  return std::nullopt;
}

std::vector<std::string> Validation::run_target(const Target& t, const fs::path& work) {
  std::vector<std::string> failed;
  const auto t0 = std::chrono::steady_clock::now();
  const ModelConfig cfg = load_model_config(t.dir / "config.json");
  // Constraints first: nothing expensive runs for a scheme the model's shapes exclude entirely.
  std::vector<std::pair<std::string, fixtures::SchemeExclusions>> runnable;
  for (const auto& scheme : t.schemes) {
    if (const auto why = no_producer(cfg, scheme, Dialect::kIdeal)) {
      golden::record_skipped(o_.out, {t.name, scheme, *why});
      ++done_;
      progress(t.name + " " + scheme + ": skipped, " + *why);
      continue;
    }
    const fixtures::SchemeExclusions excluded =
        fixtures::scheme_exclusions(t.dir, parse_scheme_id(scheme), Dialect::kIdeal);
    if (excluded.everything()) {
      const auto& first = excluded.modules.front();
      const std::string why =
          first.tensor + ": " + first.rule +
          (excluded.modules.size() > 1
               ? " (and " + std::to_string(excluded.modules.size() - 1) + " more)"
               : "");
      golden::record_skipped(o_.out, {t.name, scheme, why});
      ++done_;
      progress(t.name + " " + scheme + ": skipped, the model's shapes exclude every linear (" +
               why + ")");
      continue;
    }
    runnable.emplace_back(scheme, excluded);
  }
  // The evaluation tokens: --text through the checkpoint's tokenizer (the first --sequences
  // windows), else synthetic.
  const golden::TokenInputs in =
      o_.text.empty()
          ? golden::synthetic_inputs(o_.sequences, o_.seq_len, cfg.vocab, o_.seed)
          : golden::tokenized_text_inputs(o_.text, t.dir, o_.seq_len, o_.stride, o_.sequences);
  // Fewer windows than asked: an error when --sequences was given, said otherwise (main ran
  // fewer sequences without a word).
  if (!o_.text.empty() && in.sequences < o_.sequences) {
    const std::string what = "the text gives " + std::to_string(in.sequences) + " window(s) of " +
                             std::to_string(in.seq_len) + " tokens, fewer than the " +
                             std::to_string(o_.sequences) + " sequences asked";
    if (o_.sequences_given)
      throw Error(o_.text, what + " (--sequences); give more text or fewer sequences");
    std::cerr << "qparity validate: " << o_.text << ": " << what << " by default; evaluating "
              << in.sequences << "\n";
  }
  for (const int64_t id : in.tokens)
    if (id >= cfg.vocab)
      throw Error(o_.text, "the tokenizer gave id " + std::to_string(id) +
                               ", outside the model's vocabulary of " + std::to_string(cfg.vocab));
  golden::ReferenceRunOptions ro;
  ro.point_precision = golden::PointPrecision::kF32;
  ro.memory_budget = memory_budget_of(o_.memory_budget);
  ro.capture = row_capture(t.dir, in);
  if (ro.capture != "*")
    progress(t.name + ": every capture point of " + std::to_string(in.sequences) + "x" +
             std::to_string(in.seq_len) + " tokens would take more than " +
             format_bytes(kRowCaptureLimit) +
             " in memory; the rows capture the layer boundaries (" + ro.capture + ")");
  progress(t.name + ": the unquantized reference (" +
           (cfg.dtype.empty() ? std::string("bfloat16") : cfg.dtype) +
           " checkpoint, computed in fp64) on " + std::to_string(in.sequences) + "x" +
           std::to_string(in.seq_len) + (o_.text.empty() ? " synthetic" : " text") +
           " tokens; every scheme in dialect ideal");
  golden::Golden base = golden::run_reference(t.dir, in, ro, nullptr);
  base.meta.model = t.name;
  const fs::path base_file = work / (t.name + ".bf16.h5");
  write_golden(base_file, base, OverwritePolicy::kReplace);
  const auto base_reader = golden::GoldenReader::open(base_file);
  fixtures::StatsProviders stats;
  bool calibrate = false;
  for (const auto& [scheme, exclusions] : runnable)
    calibrate = calibrate || kNeedsCalibration.count(scheme) > 0;
  // Streamed layer by layer past --memory-budget, as the reference runs.
  fixtures::CalibrationOptions co;
  co.memory_budget = ro.memory_budget;
  if (calibrate && o_.calib_text.empty()) {
    progress(t.name + ": calibrating on " + std::to_string(o_.calib_tokens) + " synthetic tokens");
    stats = fixtures::calibrate_checkpoint(
        t.dir, reference::synthetic_tokens(o_.calib_tokens, cfg.vocab, o_.seed + 1), co);
  } else if (calibrate) {
    // The first --calib-tokens tokens of the text, as one sequence.
    const golden::TokenInputs calib =
        golden::tokenized_text_inputs(o_.calib_text, t.dir, o_.calib_tokens, 0, 1);
    progress(t.name + ": calibrating on the first " + std::to_string(calib.tokens.size()) +
             " tokens of " + o_.calib_text);
    stats = fixtures::calibrate_checkpoint(t.dir, calib.tokens, co);
  }
  for (const auto& [scheme, exclusions] : runnable)
    format_row(t, scheme, exclusions, base_reader, stats, in, work, failed);
  engine_rows(t, in, work, stats, failed);
  progress(t.name + " done in " + std::to_string(static_cast<int64_t>(seconds_since(t0))) + " s");
  return failed;
}

void Validation::engine_rows(const Target& t, const golden::TokenInputs& in, const fs::path& work,
                             const fixtures::StatsProviders& stats,
                             std::vector<std::string>& failed) {
#ifdef QPARITY_HAS_ENGINE
  // Engine against the reference, when a GPU is here: the bf16 model and every scheme the GPU
  // runs, each against the reference golden of the same checkpoint in emulate mode, judged by that
  // scheme's engine policy. MoE experts stay bf16 in the engine rows' checkpoints where the GPU has
  // no expert method for the scheme; the row's report says so.
  std::string why;
  if (o_.no_engine) return;
  if (!gpu::query_device(0, &why)) {
    std::cerr << "qparity validate: no engine rows (no usable GPU: " << why << ")\n";
    return;
  }
  const ModelConfig cfg = load_model_config(t.dir / "config.json");
  std::vector<std::string> schemes = {"bf16"};
  for (const auto& scheme : t.schemes) {
    const SchemeId id = parse_scheme_id(scheme);
    if (const auto no = no_producer(cfg, scheme, Dialect::kVllm)) {
      std::cerr << "qparity validate: " << t.name << " " << scheme << ": no engine row (" << *no
                << ")\n";
      continue;
    }
    // KV caches (bf16 linears, the cache quantized on write) and transforms (bf16 linears,
    // folded norms) need no linear method.
    if (scheme_family(id.kind) == SchemeFamily::kKvCache ||
        scheme_family(id.kind) == SchemeFamily::kTransform) {
      schemes.push_back(scheme);
      continue;
    }
    // An expert-only format (mxint4) runs where the model has experts.
    const bool experts_run = cfg.num_experts > 0 && gpu::gpu_supports_expert_scheme(id, nullptr);
    if (!gpu::gpu_supports_linear_scheme(id, &why) && !experts_run) {
      std::cerr << "qparity validate: " << t.name << " " << scheme << ": no engine row (" << why
                << ")\n";
      continue;
    }
    schemes.push_back(scheme);
  }
  for (const std::string& scheme : schemes) {
    // A row that cannot be made (a checkpoint the engine refuses, a loader error) is a failed
    // row, said with its reason; the other rows still run.
    try {
      const auto te = std::chrono::steady_clock::now();
      fs::path dir = t.dir;
      std::vector<std::string> notes;
      if (scheme != "bf16") {
        fixtures::QuantizeCheckpointOptions qo;
        qo.ignore_unsupported = true;
        qo.layout = o_.format;
        if (!o_.format.empty())
          notes.push_back("checkpoint written in the " + o_.format + " layout (quantize --format " +
                          o_.format + ")");
        std::string expert_why;
        if (cfg.num_experts > 0 &&
            scheme_family(parse_scheme_id(scheme).kind) == SchemeFamily::kWeight &&
            !gpu::gpu_supports_expert_scheme(parse_scheme_id(scheme), &expert_why)) {
          qo.ignore.push_back("re:.*\\.mlp\\.experts\\..*");
          notes.push_back("the MoE experts stay bf16 in this engine row (" + expert_why +
                          "); the format row quantizes them");
        }
        if (parse_scheme_id(scheme).kind == SchemeKind::kMxfp8 ||
            parse_scheme_id(scheme).kind == SchemeKind::kMxfp4)
          notes.push_back(
              "Hopper emulation of a Blackwell (MX) format: sm_90 has no block-scaled tensor-core "
              "MMA, so element products are summed exactly on CUDA cores, 16 at a time (mxfp8: "
              "fp32; mxfp4: int32 dp4a on doubled e2m1 codes, the weights packed two a byte), and "
              "each 32-block's E8M0 scales multiply its sum; a native kernel applies the scales "
              "inside the MMA, accumulating in its own order and width. The activation codes and "
              "scales are the dialect's bit for bit either way");
        if (parse_scheme_id(scheme).kind == SchemeKind::kNvfp4)
          notes.push_back(
              "Hopper emulation of a Blackwell (NVFP4) format: sm_90 has no FP4 tensor-core MMA, "
              "so e2m1 products (the weights packed two a byte) are summed exactly by int32 dp4a "
              "on "
              "doubled codes, 16 at a time, each 16-group's sum times its two e4m3 block scales "
              "(exact), fp32 accumulation, then alpha = fl32(1/gs_in) * fl32(1/gs_w) as vLLM's "
              "layer.alpha; a native kernel applies the block scales inside the MMA and "
              "accumulates in its own order. The activation codes and block scales are the "
              "dialect's bit for bit either way");
        if (scheme_family(parse_scheme_id(scheme).kind) == SchemeFamily::kKvCache)
          notes.push_back(
              "the engine reads its quantized cache as bf16(fp32 dequantized value) for its bf16 "
              "attention operands: one rounding beyond the reference's read, shown at the "
              "attn.k_cache / attn.v_cache points; the codes it writes are the reference's");
        dir = work / (t.name + "." + scheme + ".engine-ckpt");
        // Produced under the engine's dialect, whose loader rules (fp8-block's partition
        // alignment, ...) the engine then meets; the linears it cannot take stay bf16 and the row
        // says which.
        const fixtures::SchemeExclusions ex =
            fixtures::scheme_exclusions(t.dir, parse_scheme_id(scheme), Dialect::kVllm);
        if (!ex.modules.empty())
          notes.push_back(
              std::to_string(ex.modules.size()) +
              " module(s) left bf16 in this engine row (dialect vllm cannot take them), "
              "first " +
              ex.modules.front().module + ": " + ex.modules.front().rule);
        fixtures::quantize_checkpoint(t.dir, parse_scheme_id(scheme), Dialect::kVllm, dir, stats,
                                      OverwritePolicy::kReplace, nullptr, qo);
      }
      // The engine imitates vLLM; where the scheme quantizes activations the reference golden
      // takes the same dialect, so that the codes can match bit for bit.
      golden::ReferenceRunOptions er;
      er.point_precision = golden::PointPrecision::kF32;
      er.mode = reference::PrecisionMode::kEmulate;
      er.dialect = Dialect::kVllm;
      // The engine runs every weight and activation in bf16, whatever the checkpoint stores: the
      // golden does the same (a no-op for a bf16 checkpoint).
      er.run_dtype = DType::kBF16;
      golden::Golden ref = golden::run_reference(dir, in, er, nullptr);
      ref.meta.model = t.name;
      ref.meta.scheme = scheme;
      const fs::path rfile = work / (t.name + "." + scheme + ".emulate.h5");
      write_golden(rfile, ref, OverwritePolicy::kReplace);
      gpu::EngineOptions eo;
      eo.max_tokens = std::max<int64_t>(o_.seq_len * o_.sequences, o_.seq_len);
      eo.max_seqs = std::max<int64_t>(o_.sequences, 1);
      eo.max_context = o_.seq_len + 1;
      gpu::Engine e(gpu::load_gpu_model(dir, nullptr), eo);
      const fs::path policy_file = policies_ / (scheme + ".json");
      const golden::Policy policy = golden::load_policy(policy_file);
      const auto ref_reader = golden::GoldenReader::open(rfile);
      golden::CompareOptions co;
      co.policy = &policy;
      const auto row = [&](golden::Golden cand, const std::string& file, const std::string& name) {
        cand.meta.model = t.name;
        cand.meta.scheme = name;
        cand.meta.point_precision = golden::PointPrecision::kF32;
        write_golden(work / file, cand, OverwritePolicy::kReplace);
        golden::CompareReport r =
            golden::compare_goldens(ref_reader, golden::GoldenReader::open(work / file), co);
        r.policy_source = "validate: " + policy_file.string();
        Json rep = golden::report_json(r, "engine");
        for (const auto& n : notes)
          rep["summary"]["notes"].push_back(n);
        golden::write_report(rep, o_.out);
        if (r.verdict == golden::Judgement::kFail)
          failed.push_back(t.name + "/" + name + " engine (" + to_string(cand.meta.run_mode) +
                           ") on " + cand.meta.device + ": " + r.failures.front());
        return r;
      };
      // Layer-local: each layer on the reference's own inputs, judged point by point. Free run: the
      // engine on its own from the tokens, judged end to end (the policy says which gates judge
      // which run).
      const auto local = row(gpu::engine_golden_local(e, ref_reader, "*", nullptr),
                             t.name + "." + scheme + ".engine-local.h5", scheme);
      const auto free = row(gpu::engine_golden(e, in, "*", true, nullptr),
                            t.name + "." + scheme + ".engine.h5", scheme + "-free-run");
      std::cerr << "qparity validate: " << t.name << " " << scheme << " on " << gpu::device_name()
                << ": engine vs reference, layer-local " << golden::to_string(local.verdict)
                << "; free run " << golden::to_string(free.verdict) << ", mean KLD "
                << free.e2e.kld_mean.value << ", top-1 " << free.e2e.top1.value << " ("
                << seconds_since(te) << " s)\n";
      if (!o_.keep_work && scheme != "bf16") fs::remove_all(dir);
    } catch (const std::exception& e) {
      std::cerr << "qparity validate: " << t.name << " " << scheme
                << ": engine row ERROR: " << e.what() << "\n";
      failed.push_back(t.name + "/" + scheme + " engine: error: " + e.what());
    }
  }
#else
  (void)t, (void)in, (void)work, (void)stats, (void)failed;
#endif
}

// `--candidate FILE`: another engine's dump (python/qparity_dump, or any writer of the schema)
// of the checkpoint --model, judged as an engine row: the reference golden is made here from
// --model on the candidate's own tokens, the way the qparity engine's rows are made (emulate,
// the candidate's run dtype and dialect), and compared under the engine policy of the
// candidate's scheme for its device. True when no row failed.
bool run_candidates(const ValidateOptions& o, const fs::path& policies, const fs::path& work) {
  const std::string name = golden::model_name(o.model);
  // --model's hashes, once for all candidates (the tensor hash reads every weight).
  const std::string config_hash = golden::config_hash(o.model),
                    tensor_hash = golden::checkpoint_tensor_hash(o.model);
  // The scheme a candidate is judged by is the checkpoint's own (its quantization config), not
  // the label the candidate carries.
  const std::string model_scheme = golden::plan_scheme(build_quant_plan(
      load_model_config(fs::path(o.model) / "config.json"), o.model, std::nullopt));
  std::vector<std::string> failed;
  for (const auto& file : o.candidates) {
    const auto t0 = std::chrono::steady_clock::now();
    const auto cand = golden::GoldenReader::open(file);
    const golden::GoldenMeta& m = cand.meta();
    std::vector<std::string> notes;
    const auto check_hash = [&](const std::string& recorded, const std::string& actual,
                                const char* what) {
      if (recorded.empty()) {
        notes.push_back(std::string("the candidate records no ") + what +
                        ": not checked that it ran --model's checkpoint");
        return;
      }
      if (recorded != actual)
        throw Error(file, std::string(what) + " " + recorded.substr(0, 16) +
                              "... differs from --model " + o.model + "'s " + actual.substr(0, 16) +
                              "...: the candidate ran another checkpoint");
    };
    check_hash(m.model_config_hash, config_hash, "model_config_hash");
    check_hash(m.checkpoint_hash, tensor_hash, "checkpoint_hash");
    if (m.scheme != model_scheme)
      throw Error(file, "scheme '" + m.scheme + "' differs from the checkpoint's '" + model_scheme +
                            "' (" + o.model +
                            "'s quantization config): a candidate is judged by the scheme it "
                            "ran, which is the checkpoint's");
    parse_scheme_id(m.scheme);  // an unknown scheme id is an error
    const fs::path policy_file = policies / (m.scheme + ".json");
    const golden::Policy policy = golden::load_policy(policy_file);
    golden::TokenInputs in;
    in.sequences = cand.sequences();
    in.seq_len = cand.seq_len();
    in.tokens = cand.tokens();
    in.seed = m.seed;
    in.description = m.input_set;
    golden::ReferenceRunOptions er;
    er.point_precision = golden::PointPrecision::kF32;
    er.mode = reference::PrecisionMode::kEmulate;
    er.dialect = parse_dialect(m.dialect);
    if (!m.model_dtype.empty()) {
      const auto dt = dtype_from_name(m.model_dtype);
      if (!dt || (*dt != DType::kBF16 && *dt != DType::kF16 && *dt != DType::kF32))
        throw Error(file, "model_dtype '" + m.model_dtype + "' (BF16, F16 or F32)");
      er.run_dtype = *dt;
    }
    std::cerr << "qparity validate: " << m.producer << " " << m.producer_version << " on "
              << m.device << ": the reference of " << name << " (" << m.scheme << ", dialect "
              << m.dialect << ", emulate" << (m.model_dtype.empty() ? "" : ", " + m.model_dtype)
              << ") on the candidate's " << in.sequences << "x" << in.seq_len << " tokens\n";
    golden::Golden ref = golden::run_reference(o.model, in, er, nullptr);
    ref.meta.model = name;
    ref.meta.scheme = m.scheme;
    const fs::path rfile = work / (name + "." + m.scheme + ".candidate-golden.h5");
    write_golden(rfile, ref, OverwritePolicy::kReplace);
    golden::CompareOptions co;
    co.policy = &policy;
    golden::CompareReport r = golden::compare_goldens(golden::GoldenReader::open(rfile), cand, co);
    r.candidate.model = name;  // the row sits beside the qparity engine's rows of this model
    r.policy_source = "validate --candidate: " + policy_file.string();
    Json rep = golden::report_json(r, "engine");
    rep["summary"]["notes"].push_back("external engine " + m.producer + " " + m.producer_version +
                                      " (" + m.precision_mode + "), its dump " +
                                      fs::path(file).filename().string() +
                                      " against the reference made here from --model");
    if (!r.declared_absent.empty())
      rep["summary"]["notes"].push_back(
          std::to_string(r.declared_absent.size()) +
          " capture point(s) declared absent by the engine (not compared), first " +
          r.declared_absent.front().point + ": " + r.declared_absent.front().reason);
    // Where the engine's numbers first leave the point gates: in a free run (judged end to end)
    // that says where its end-to-end difference starts, not a verdict.
    if (r.first_failing >= 0) {
      const auto& p = r.points[static_cast<size_t>(r.first_failing)];
      rep["summary"]["notes"].push_back(
          "first capture point outside the policy's point gates" +
          std::string(r.point_gates_judge ? "" : " (shown, not judged, in a free run)") + ": " +
          p.name + (p.verdict.failures.empty() ? "" : " (" + p.verdict.failures.front() + ")"));
    }
    for (const auto& n : notes)
      rep["summary"]["notes"].push_back(n);
    const auto files = golden::write_report(rep, o.out);
    std::cerr << "qparity validate: " << name << " " << m.scheme << " " << m.producer << " on "
              << m.device << ": " << golden::to_string(r.verdict) << " (" << to_string(m.run_mode)
              << "), mean KLD " << r.e2e.kld_mean.value << ", top-1 " << r.e2e.top1.value << " ("
              << static_cast<int64_t>(seconds_since(t0)) << " s) -> " << files.md.string() << "\n";
    if (r.verdict == golden::Judgement::kFail) {
      failed.push_back(name + "/" + m.scheme + " " + m.producer + " on " + m.device + ": " +
                       r.failures.front());
      for (const auto& f : r.failures)
        std::cerr << "qparity validate:   " << f << "\n";
    }
  }
  golden::write_index(o.out);
  if (!o.junit.empty()) golden::write_junit(o.junit, o.out, "qparity validate");
  for (const auto& f : failed)
    std::cerr << "qparity validate: FAIL " << f << "\n";
  return failed.empty();
}

// The trained fixtures' defaults: their held-out texts, and 16 x 128 evaluation tokens (2,048
// positions: a mean KLD's 95% bound within about 10 % of the mean on these models).
ValidateOptions with_trained_defaults(ValidateOptions o, const fs::path& trained) {
  if (o.text.empty()) o.text = (trained / "eval.txt").string();
  if (o.calib_text.empty()) o.calib_text = (trained / "calib.txt").string();
  if (!o.sequences_given) o.sequences = 16;
  if (!o.seq_len_given) o.seq_len = 128;
  return o;
}

fs::path trained_fixture_dir() {
  const fs::path dir = installed_data_dir("fixtures/trained");
  if (dir.empty())
    throw Error("trained fixtures",
                "none installed beside this binary (looked in "
                "<bin>/../share/qparity/fixtures/trained and <bin>/fixtures/trained); give --model "
                "DIR or --fixtures random");
  return dir;
}

// True when no row failed.
bool run(const ValidateOptions& given) {
  const auto t0 = std::chrono::steady_clock::now();
  if (given.fixtures != "trained" && given.fixtures != "random")
    throw UsageError("--fixtures", "is trained or random, not " + given.fixtures);
  if (!given.model.empty() && given.fixtures != "trained")
    throw UsageError("--fixtures", "chooses the default model set; --model names the model");
  const bool trained_set = given.model.empty() && given.fixtures == "trained";
  const fs::path trained = trained_set ? trained_fixture_dir() : fs::path();
  const ValidateOptions o = trained_set ? with_trained_defaults(given, trained) : given;
  std::vector<std::string> wanted = o.schemes == "all" ? kAllSchemes : split(o.schemes);
  if (wanted.empty()) throw UsageError("--schemes", "names no scheme");
  // A preset name (compressed-tensors' W4A16, ...) is its point's canonical id from here on: the
  // row, its policy and its report carry that id.
  for (std::string& s : wanted)
    s = to_string(parse_scheme_id(s));
  if (!o.format.empty())
    for (const std::string& s : wanted) {
      const SchemeId id = parse_scheme_id(s);
      const bool modelopt = o.format == "modelopt", hf = o.format == "hf-fp8";
      const bool gpt_oss = o.format == "gpt-oss";
      const bool fp8 = id.kind == SchemeKind::kFp8Tensor || id.kind == SchemeKind::kFp8Block;
      const bool ok =
          gpt_oss    ? id.kind == SchemeKind::kMxfp4 && id.weight_only
          : hf       ? fp8 && !id.weight_only
          : modelopt ? !fixtures::modelopt_algo_of(id).empty() ||
                           (id.kind == SchemeKind::kKvFp8 && !id.kv_per_head)
                     : id.kind == SchemeKind::kPackedInt && id.int_inputs == IntWeightInputs::kNone;
      const char* why =
          gpt_oss    ? " is not gpt-oss's point (mxfp4a16)"
          : hf       ? " is not a quant_method fp8 point (fp8-block, fp8-tensor)"
          : modelopt ? " is not a ModelOpt point (fp8-tensor, fp8-channel, fp8-block-a16, mxfp8, "
                       "nvfp4, nvfp4a16, kv-fp8)"
                     : " is not an integer weight-only point; --format writes "
                       "GPTQ's / AWQ's layout of those";
      if (!ok)
        throw UsageError("validate --format " + o.format, s + why + " (name them with --schemes)");
    }
  if (o.stride != 0 && o.text.empty()) throw UsageError("validate", "--stride applies to --text");
  if (!o.text.empty() && o.text != "-" && !fs::is_regular_file(o.text))
    throw Error(o.text, "is not a readable text file (--text)");
  if (!o.calib_text.empty() && !fs::is_regular_file(o.calib_text))
    throw Error(o.calib_text, "is not a readable text file (--calib-text)");
  if (!o.candidates.empty() && o.schemes_given)
    throw UsageError("validate --candidate",
                     "takes the scheme from the checkpoint (--model's quantization config); "
                     "--schemes does not apply");
  if (!o.candidates.empty() && o.model.empty())
    throw UsageError("validate --candidate",
                     "needs --model DIR, the checkpoint the candidate ran: its hashes are checked "
                     "against the candidate's and the reference golden is made from it");
  // Everything that can be wrong with the command line or the policies, before any work.
  const fs::path policies = policy_dir(o.policies);
  if (o.candidates.empty())
    for (const auto& s : wanted) {
      parse_scheme_id(s);                             // an unknown id is an error up front
      golden::load_policy(policies / (s + ".json"));  // a missing or broken policy too
    }
  golden::load_policy(policies / "bf16.json");
  check_output_dir(o.out);
  if (!o.junit.empty()) golden::check_junit_target(o.junit);
  const fs::path work = fs::path(o.out) / ".work";
  fs::create_directories(work);
  // The work directory goes on every exit, Ctrl-C included, unless --keep-work.
  TempPathGuard work_guard(
      work, o.keep_work ? TempPathGuard::OnExit::kKeep : TempPathGuard::OnExit::kRemove);
  if (o.keep_work) work_guard.release();
  if (!o.candidates.empty()) return run_candidates(o, policies, work);
  std::vector<Target> targets;
  if (!o.model.empty()) {
    const ModelConfig cfg = load_model_config(fs::path(o.model) / "config.json");
    Target t{o.model, golden::model_name(o.model), {}};
    for (const auto& s : wanted) {
      if (s == "mxint4" && cfg.num_experts == 0) {
        golden::record_skipped(o.out, {t.name, s,
                                       "mxint4 quantizes MoE expert stacks only; "
                                       "this model has no experts"});
        continue;
      }
      t.schemes.push_back(s);
    }
    targets.push_back(t);
  } else if (trained_set) {
    for (const std::string name : {"llama", "qwen3", "qwen3-moe"}) {
      Target t{trained / name, name + "-trained", {}};
      for (const auto& s : wanted)
        if (s != "mxint4" || name == "qwen3-moe") t.schemes.push_back(s);
      targets.push_back(t);
    }
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
  int64_t total = 0;
  for (const auto& t : targets)
    total += static_cast<int64_t>(t.schemes.size());
  Validation v(o, policies, total);
  std::vector<std::string> failed;
  for (const auto& t : targets)
    for (auto& f : v.run_target(t, work))
      failed.push_back(std::move(f));
  golden::write_index(o.out);
  if (!o.junit.empty()) golden::write_junit(o.junit, o.out, "qparity validate");
  std::cerr << "qparity validate: reports in " << o.out << " (index.md, index.html), "
            << static_cast<int64_t>(seconds_since(t0)) << " s\n";
  for (const auto& f : failed)
    std::cerr << "qparity validate: FAIL " << f << "\n";
  return failed.empty();
}

}  // namespace

void add_validate_command(CLI::App& app, int& rc) {
  auto o = std::make_shared<ValidateOptions>();
  auto* cmd = app.add_subcommand(
      "validate", "The main job: every scheme against the unquantized reference, as reports");
  cmd->add_option("--model", o->model,
                  "checkpoint directory (default: the trained fixtures, or --fixtures random)");
  cmd->add_option("--fixtures", o->fixtures,
                  "without --model: trained (tiny trained Llama, Qwen3, Qwen3-MoE on their "
                  "held-out text) or random (generated fixtures, synthetic tokens)")
      ->capture_default_str();
  cmd->add_option("--schemes", o->schemes, "all, or a comma-separated list of scheme ids")
      ->capture_default_str()
      ->each([o](const std::string&) { o->schemes_given = true; });
  cmd->add_option("--format", o->format,
                  "write the integer weight-only points' checkpoints in GPTQ's (gptq, gptq_v2) "
                  "or AutoAWQ's (awq) layout, fp8-tensor / kv-fp8 in ModelOpt's (modelopt), "
                  "fp8-block / fp8-tensor as quant_method fp8 (hf-fp8), a gpt-oss model's "
                  "mxfp4a16 as quant_method mxfp4 (gpt-oss), instead of compressed-tensors'")
      ->check(CLI::IsMember({"gptq", "gptq_v2", "awq", "modelopt", "hf-fp8", "gpt-oss"}));
  cmd->add_option("--out", o->out, "report root")->capture_default_str();
  cmd->add_option("--policies", o->policies,
                  "tolerance policy directory (default: the policies installed with qparity)");
  cmd->add_option("--budget", o->budget,
                  "acceptance budget for every format row, kld=X,top1=Y,dln_ppl=Z (default: each "
                  "policy's own)")
      ->each([o](const std::string&) { o->budget_given = true; });
  cmd->add_option("--text", o->text,
                  "evaluate on this UTF-8 text, tokenized by the checkpoint's tokenizer.json, "
                  "instead of synthetic tokens (the first --sequences sequences of --seq-len)");
  cmd->add_option("--stride", o->stride,
                  "--text: a sequence starts every this many tokens (default --seq-len)")
      ->check(CLI::Range(int64_t{0}, int64_t{1} << 30));
  auto* sequences = cmd->add_option("--sequences", o->sequences,
                                    "sequences (synthetic, or of --text; the trained fixtures: 16)")
                        ->capture_default_str()
                        ->check(CLI::Range(int64_t{1}, int64_t{1} << 20));
  auto* seq_len =
      cmd->add_option("--seq-len", o->seq_len, "tokens per sequence (the trained fixtures: 128)")
          ->capture_default_str()
          ->check(CLI::Range(int64_t{2}, int64_t{1} << 20));
  cmd->add_option(
         "--calib-tokens", o->calib_tokens,
         "calibration tokens, synthetic or the first of --calib-text (static activation scales, "
         "smoothing factors, "
         "KV-cache ranges)")
      ->capture_default_str()
      ->check(CLI::Range(int64_t{1}, int64_t{1} << 24));
  cmd->add_option("--calib-text", o->calib_text,
                  "calibrate on the first --calib-tokens tokens of this UTF-8 text (the "
                  "checkpoint's tokenizer) instead of synthetic tokens (the trained fixtures: "
                  "their calib.txt)");
  cmd->add_option("--seed", o->seed, "seed of the synthetic tokens")
      ->check(seed_check())
      ->capture_default_str();
  add_memory_budget_option(cmd, o->memory_budget);
  cmd->add_flag("--keep-work", o->keep_work, "keep quantized checkpoints and goldens in .work/");
  cmd->add_option("--junit", o->junit,
                  "also write the report root's rows (this run's and any earlier ones there) as "
                  "JUnit XML to this file: FAIL rows are failures, NOT JUDGED and skipped schemes "
                  "skipped (replaces only a JUnit file qparity wrote)");
  cmd->add_flag("--no-engine", o->no_engine, "skip the engine-vs-reference rows on a GPU machine");
  cmd->add_option("--candidate", o->candidates,
                  "another engine's dump of --model (python -m qparity_dump ...): adds its engine "
                  "row to the report set instead of running the schemes (repeatable)");
  cmd->callback([o, sequences, seq_len, &rc] {
    o->sequences_given = sequences->count() > 0;
    o->seq_len_given = seq_len->count() > 0;
    // 3: a row failed its policy or budget (reports are written either way).
    rc = run(*o) ? 0 : 3;
  });
}

}  // namespace qparity::cli
