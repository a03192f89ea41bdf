// `qparity engine run --model DIR (--tokens FILE | --text FILE | --synthetic N --seq-len T)
//   [--dump FILE]`:
//   the GPU engine over token sequences (each from an empty cache; as many per forward as fit),
//   teacher-forced: per-sequence NLL / perplexity on stdout, and with --dump every capture point
//   in the golden schema, so compare / bisect / report read it like any golden.
//   --pixels FILE (image-text checkpoints): the prompts' images, their features from the
//   reference's vision tower fed in (the engine has none).
//   With --local GOLDEN: a layer-local dump (every layer on the golden's own inputs), what the
//   per-point gates of a policy judge; a free run is judged end to end.
// `qparity engine layer --model DIR --golden FILE --layer N [--policy P]`: re-runs one layer on
//   the golden's own inputs (embed or layers.<N-1>.residual) and judges that layer's points:
//   exit 3 when the layer fails on clean inputs (its own error), 0 when it passes (an error seen
//   downstream in a full run was inherited).
// `qparity engine tp-report --model DIR --tp N (--golden FILE | token inputs [--reference])`:
//   the TP-numerics report (golden/tp_report.h): the engine at TP = N against itself at TP = 1
//   on the same tokens, point by point and end to end, and both against the reference golden
//   (--golden, whose tokens are then run; or --reference: the fp64 reference run here, at TP = 1
//   and, for dense models, with TP = N's arithmetic: golden make --tp N).
// `run` and `layer` take --tp N too (tensor parallelism over GPUs 0..N-1, dumps gathered whole).
// `qparity engine generate --model DIR --prompts FILE --max-new N [--temperature --top-p --seed]`:
//   continuous batching: every prompt (one per line, token ids) prefilled, then all live
//   sequences decode together, one token each per step, through CUDA graphs (dense models); a
//   finished sequence frees its slot and cache blocks for the next prompt.
#include <chrono>
#include <fstream>
#include <iostream>
#include <sstream>

#include "commands.h"
#include "core/capture/capture_points.h"
#include "core/capture/trace.h"
#include "core/error.h"
#include "core/input_file.h"
#include "golden/compare.h"
#include "golden/engine_golden.h"
#include "golden/reference_run.h"
#include "gpu_engine/device_info.h"
#include "gpu_engine/engine.h"
#include "gpu_engine/model_loader.h"
#include "gpu_engine/sampler.h"
#ifdef QPARITY_HAS_TP
#include "gpu_engine/tensor_parallel.h"
#endif
#include "core/safetensors/safetensors_writer.h"
#include "golden/tp_report.h"
#include "reference_cpu/models/image_input.h"
#include "tools/qparity/cli_support.h"

namespace qparity::cli {
namespace {

namespace fs = std::filesystem;

// A clear line instead of a raw CUDA error from deep inside the first allocation.
void require_gpu() {
  std::string why;
  if (!gpu::query_device(0, &why))
    throw Error("engine", "no usable GPU: " + why +
                              " (the engine needs an NVIDIA GPU with a working driver)");
}

std::unique_ptr<gpu::Engine> make_engine(const std::string& model, int64_t max_tokens,
                                         int64_t max_seqs, int64_t max_context,
                                         const std::string& dialect = "vllm", int tp = 1) {
  gpu::GpuLoadOptions lo;
  lo.dialect = parse_dialect(dialect);
  gpu::EngineOptions eo;
  eo.max_tokens = max_tokens;
  eo.max_seqs = max_seqs;
  eo.max_context = max_context;
  if (tp == 1) return std::make_unique<gpu::Engine>(gpu::load_gpu_model(model, &std::cerr, lo), eo);
#ifdef QPARITY_HAS_TP
  return gpu::load_tp_engine(model, tp, lo, eo, &std::cerr);
#else
  throw Error("engine",
              "--tp " + std::to_string(tp) +
                  ": this qparity was built without NCCL, which tensor parallelism needs");
#endif
}

struct RunOptions {
  TextInput text;
  std::string model, tokens, token_ids, dump, capture = "*", local, dialect = "vllm", pixels;
  int64_t synthetic = 0, seq_len = 0, max_tokens = 2048;
  uint64_t seed = 1;
  int tp = 1;
  bool force = false, f32 = false;
};

void run(const RunOptions& o) {
  if (!o.local.empty() &&
      (!o.tokens.empty() || !o.token_ids.empty() || !o.text.file.empty() || o.synthetic > 0))
    throw UsageError("engine run", "--local GOLDEN runs that golden's tokens: give no other input");
  if (!o.local.empty() && o.dump.empty())
    throw UsageError("engine run", "--local needs --dump FILE");
  if (!o.local.empty() && !o.pixels.empty())
    throw UsageError("engine run", "--local GOLDEN runs that golden's images: give no --pixels");
  if (!o.dump.empty()) check_output_file(o.dump, o.force);  // before the run, not after it
  const ModelConfig cfg = load_model_config(fs::path(o.model) / "config.json");
  check_capture_globs(o.capture,
                      model_capture_points(cfg, true));  // a quantized cache adds its points
  std::optional<golden::TokenInputs> in;
  if (o.local.empty())
    in = token_inputs("engine run", o.tokens, o.token_ids, o.synthetic, o.seq_len, cfg.vocab,
                      o.seed, {o.text.file, o.model, o.text.stride});
  if (!o.pixels.empty()) {  // as golden make --pixels: the placeholder runs take them in order
    if (!cfg.image_text)
      throw Error("--pixels", cfg.arch_name + " takes no images (an image-text checkpoint does)");
    in->pixels = reference::read_pixel_file(o.pixels);
  }
  require_gpu();
  auto e = make_engine(o.model, o.max_tokens, 8, 4096, o.dialect, o.tp);
  if (!o.local.empty()) {
    const auto ref = golden::GoldenReader::open(o.local);
    golden::Golden g = gpu::engine_golden_local(*e, ref, o.capture, &std::cerr);
    g.meta.producer_version = QPARITY_VERSION;
    g.meta.point_precision = o.f32 ? golden::PointPrecision::kF32 : golden::PointPrecision::kF64;
    golden::write_golden(o.dump, g, o.force ? OverwritePolicy::kReplace : OverwritePolicy::kRefuse);
    std::cerr << "qparity engine: layer-local dump, " << g.points.size() << " capture points -> "
              << o.dump << "\n";
    return;
  }
  golden::Golden g = gpu::engine_golden(*e, *in, o.capture, !o.dump.empty(), &std::cerr);
  for (int64_t s = 0; s < g.sequences; ++s)
    std::cout << "sequence " << s << ": NLL " << g.sequence_nll[static_cast<size_t>(s)] << ", PPL "
              << g.sequence_ppl[static_cast<size_t>(s)] << "\n";
  if (o.dump.empty()) return;
  g.meta.producer_version = QPARITY_VERSION;
  g.meta.point_precision = o.f32 ? golden::PointPrecision::kF32 : golden::PointPrecision::kF64;
  golden::write_golden(o.dump, g, o.force ? OverwritePolicy::kReplace : OverwritePolicy::kRefuse);
  std::cerr << "qparity engine: " << g.points.size() << " capture points -> " << o.dump << "\n";
}

struct LayerOptions {
  std::string model, golden, policy;
  int64_t layer = 0;
  int tp = 1;
  bool json = false;
};

int layer(const LayerOptions& o) {
  const auto gr = golden::GoldenReader::open(o.golden);
  require_gpu();
  // The golden's dialect: the codes the engine must reproduce are that dialect's.
  const std::string dialect = gr.meta().dialect == "sglang" ? "sglang" : "vllm";
  auto e = make_engine(o.model, std::max<int64_t>(gr.seq_len(), 1) * 4, 8, 4096, dialect, o.tp);
  const std::vector<gpu::LayerPointStats> points = gpu::engine_rerun_layer(*e, gr, o.layer);
  const std::string input = layer_input_point(o.layer);
  // The engine re-runs the golden's own scheme: --policy, else the installed policy of it.
  golden::GoldenMeta engine_meta = gr.meta();
  engine_meta.producer = "qparity-gpu-engine";
  const ChosenPolicy chosen = choose_policy(o.policy, "engine", gr.meta(), engine_meta);
  const golden::PolicySection* section =
      chosen.policy ? &golden::policy_section(*chosen.policy, golden::PolicyRole::kEngine,
                                              golden::device_key(gpu::device_name()))
                    : nullptr;
  if (!section) std::cerr << "qparity engine layer: not judged: " << chosen.source << "\n";
  bool pass = true;
  Json out = Json::array();
  for (const auto& [name, st] : points) {
    golden::Verdict v;
    if (section) v = golden::judge_point(*section, name, st);
    pass = pass && v.pass;
    out.push_back({{"point", name},
                   {"rel_l2", golden::json_number(st.rel_l2)},
                   {"max_abs", golden::json_number(st.max_abs)},
                   {"pass", v.pass},
                   {"failures", v.failures}});
    if (!o.json) {
      std::cout << name << ": rel_l2 " << st.rel_l2 << ", max_abs " << st.max_abs
                << (section ? (v.pass ? "  ok" : "  FAIL") : "");
      for (const auto& f : v.failures)
        std::cout << "  " << f;
      std::cout << "\n";
    }
  }
  if (o.json)
    std::cout << Json{{"layer", o.layer},
                      {"input", input},
                      {"points", out},
                      {"verdict", !section ? "not judged"
                                  : pass   ? "clean"
                                           : "local"}}
                     .dump(2)
              << "\n";
  else
    std::cout << "layer " << o.layer << " on the golden's inputs: "
              << (!section ? "NOT JUDGED (no policy; the numbers above are not a verdict)"
                  : pass   ? "within policy (an error downstream of here is inherited)"
                           : "FAILS on clean inputs: the error is LOCAL to this layer")
              << "\n";
  return pass ? 0 : 3;
}

struct GenerateOptions {
  std::string model, prompts;
  int64_t max_new = 32, max_seqs = 8;
  double temperature = 0, top_p = 1;
  uint64_t seed = 0;
};

void generate(const GenerateOptions& o) {
  std::istringstream f(read_input_file(o.prompts, "prompt file"));
  std::vector<std::vector<int32_t>> prompts;
  for (std::string line; std::getline(f, line);) {
    std::istringstream ls(line);
    std::vector<int32_t> p;
    for (int64_t id; ls >> id;)
      p.push_back(static_cast<int32_t>(id));
    if (!p.empty()) prompts.push_back(p);
  }
  if (prompts.empty()) throw Error(o.prompts, "holds no prompt (one line of token ids each)");
  require_gpu();
  auto e = make_engine(o.model, 4096, o.max_seqs, 4096);
  struct Live {
    size_t prompt;
    int32_t slot;
    int32_t pos;
    int32_t next;
    std::vector<int32_t> out;
    gpu::Sampler sampler;
  };
  std::vector<Live> live;
  std::vector<std::vector<int32_t>> results(prompts.size());
  std::vector<int32_t> free_slots;
  for (int64_t s = o.max_seqs - 1; s >= 0; --s)
    free_slots.push_back(static_cast<int32_t>(s));
  size_t next_prompt = 0;
  const auto t0 = std::chrono::steady_clock::now();
  int64_t decoded = 0;
  while (next_prompt < prompts.size() || !live.empty()) {
    // Admit waiting prompts into free slots: prefill each (one forward per prompt).
    while (next_prompt < prompts.size() && !free_slots.empty()) {
      const auto& p = prompts[next_prompt];
      gpu::Batch b;
      const int32_t slot = free_slots.back();
      free_slots.pop_back();
      for (size_t i = 0; i < p.size(); ++i) {
        b.tokens.push_back(p[i]);
        b.slots.push_back(slot);
        b.positions.push_back(static_cast<int32_t>(i));
      }
      e->forward(b);
      gpu::SamplingParams sp{o.temperature, o.top_p, o.seed + next_prompt};
      Live l{next_prompt, slot, static_cast<int32_t>(p.size()), 0, {}, gpu::Sampler(sp)};
      const std::vector<float> logits = e->logits_host(b.size());
      l.next = l.sampler.next(std::span<const float>(logits).subspan(
          (p.size() - 1) * static_cast<size_t>(e->config().vocab),
          static_cast<size_t>(e->config().vocab)));
      live.push_back(std::move(l));
      ++next_prompt;
    }
    // One decode step for every live sequence.
    gpu::Batch b;
    for (auto& l : live) {
      l.out.push_back(l.next);
      b.tokens.push_back(l.next);
      b.slots.push_back(l.slot);
      b.positions.push_back(l.pos++);
    }
    std::vector<bool> done(live.size());
    for (size_t i = 0; i < live.size(); ++i)
      done[i] = static_cast<int64_t>(live[i].out.size()) >= o.max_new;
    bool any_live = false;
    for (bool d : done)
      any_live = any_live || !d;
    if (any_live) {
      e->forward_graph(b);
      decoded += b.size();
      if (o.temperature == 0) {
        const std::vector<int32_t> g = e->greedy(b.size());
        for (size_t i = 0; i < live.size(); ++i)
          live[i].next = g[i];
      } else {
        const std::vector<float> logits = e->logits_host(b.size());
        const size_t v = static_cast<size_t>(e->config().vocab);
        for (size_t i = 0; i < live.size(); ++i)
          live[i].next = live[i].sampler.next(std::span<const float>(logits).subspan(i * v, v));
      }
    }
    std::vector<Live> still;
    for (size_t i = 0; i < live.size(); ++i) {
      if (done[i]) {
        results[live[i].prompt] = live[i].out;
        e->release(live[i].slot);
        free_slots.push_back(live[i].slot);
      } else {
        still.push_back(std::move(live[i]));
      }
    }
    live = std::move(still);
  }
  const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  for (size_t i = 0; i < results.size(); ++i) {
    std::cout << "prompt " << i << ":";
    for (int32_t t : results[i])
      std::cout << " " << t;
    std::cout << "\n";
  }
  std::cerr << "qparity engine: " << decoded << " decode tokens in " << secs << " s\n";
}

}  // namespace

struct TpReportOptions {
  TextInput text;
  std::string model, tokens, token_ids, golden, json, dialect = "vllm";
  int64_t synthetic = 0, seq_len = 0, max_tokens = 2048;
  uint64_t seed = 1;
  int tp = 2;
  bool reference = false;
};

int tp_report(const TpReportOptions& o) {
  if (o.tp < 2) throw UsageError("engine tp-report", "--tp must be at least 2");
  const ModelConfig cfg = load_model_config(fs::path(o.model) / "config.json");
  std::optional<golden::Golden> ref, ref_tp;
  golden::TokenInputs in;
  if (!o.golden.empty()) {
    if (!o.tokens.empty() || !o.token_ids.empty() || !o.text.file.empty() || o.synthetic > 0 ||
        o.reference)
      throw UsageError("engine tp-report",
                       "--golden runs that golden's tokens: give no other input");
    ref = golden::GoldenReader::open(o.golden).read_all();
    in.sequences = ref->sequences;
    in.seq_len = ref->seq_len;
    in.tokens = ref->tokens;
    in.description = "golden:" + fs::path(o.golden).filename().string();
  } else {
    in = token_inputs("engine tp-report", o.tokens, o.token_ids, o.synthetic, o.seq_len, cfg.vocab,
                      o.seed, {o.text.file, o.model, o.text.stride});
    if (o.reference) {
      golden::ReferenceRunOptions ro;
      ro.mode = reference::PrecisionMode::kEmulate;  // the engine's bf16 storage, in fp64
      ro.dialect = parse_dialect(o.dialect);
      std::cerr << "qparity engine: the fp64 reference (emulate mode) on the same tokens\n";
      ref = golden::run_reference(o.model, in, ro, &std::cerr);
      if (!cfg.is_moe()) {  // the reference emulates TP inside dense layers only
        std::cerr << "qparity engine: the reference with TP = " << o.tp << "'s arithmetic\n";
        ro.tp = o.tp;
        ref_tp = golden::run_reference(o.model, in, ro, &std::cerr);
      }
    }
  }
  require_gpu();
  golden::Golden g1, gn;
  {
    auto e = make_engine(o.model, o.max_tokens, 8, 4096, o.dialect, 1);
    g1 = gpu::engine_golden(*e, in, "*", true, &std::cerr);
  }
  {
    auto e = make_engine(o.model, o.max_tokens, 8, 4096, o.dialect, o.tp);
    gn = gpu::engine_golden(*e, in, "*", true, &std::cerr);
  }
  const golden::TpReport r =
      golden::tp_numerics_report(g1, gn, ref ? &*ref : nullptr, o.tp, ref_tp ? &*ref_tp : nullptr);
  std::cout << golden::to_text(r);
  if (!o.json.empty()) {
    const std::string text = golden::to_json(r).dump(2) + "\n";
    write_file_atomic(
        o.json,
        std::span<const uint8_t>(reinterpret_cast<const uint8_t*>(text.data()), text.size()),
        OverwritePolicy::kReplace);
  }
  return 0;
}

void add_engine_command(CLI::App& app, int& rc) {
  auto* eng = app.add_subcommand("engine", "The GPU engine: run (dumps), layer (bisect), generate");
  eng->require_subcommand(1);
  auto ro = std::make_shared<RunOptions>();
  auto* r = eng->add_subcommand(
      "run", "Teacher-forced run over token sequences; --dump writes a golden-schema file");
  r->add_option("--model", ro->model, "checkpoint directory")->required();
  add_token_options(r, ro->tokens, ro->token_ids, ro->text);
  r->add_option("--synthetic", ro->synthetic, "N synthetic sequences")
      ->check(CLI::Range(int64_t{1}, int64_t{1} << 24));
  r->add_option("--seq-len", ro->seq_len, "tokens per sequence")
      ->check(CLI::Range(int64_t{1}, int64_t{1} << 24));
  r->add_option("--seed", ro->seed, "seed of synthetic tokens")
      ->check(seed_check())
      ->capture_default_str();
  r->add_option("--dump", ro->dump, "golden-schema output file");
  r->add_option("--local", ro->local,
                "layer-local run: every layer on this golden's own inputs (its tokens too)");
  r->add_option("--pixels", ro->pixels,
                "image-text checkpoints: a pixel file (pixel_values, image_grid_thw) whose images "
                "the sequences' placeholder runs take in order; the reference's vision tower "
                "computes their features, fed to the engine");
  r->add_option("--capture", ro->capture, "capture-point globs")->capture_default_str();
  r->add_option("--dialect", ro->dialect,
                "the engine the GPU methods imitate bit for bit: vllm | sglang")
      ->check(CLI::IsMember({"vllm", "sglang"}))
      ->capture_default_str();
  r->add_option("--max-tokens", ro->max_tokens, "tokens per forward")->capture_default_str();
  r->add_option("--tp", ro->tp, "tensor parallelism over GPUs 0..N-1 (dumps gathered whole)")
      ->check(CLI::Range(1, 8))
      ->capture_default_str();
  r->add_flag("--f32", ro->f32, "store points as float32");
  r->add_flag("--force", ro->force, "replace an existing dump");
  r->callback([ro, &rc] {
    run(*ro);
    rc = 0;
  });
  auto lo = std::make_shared<LayerOptions>();
  auto* l = eng->add_subcommand("layer", "Re-run one layer on a golden's inputs and judge it");
  l->add_option("--model", lo->model, "checkpoint directory")->required();
  l->add_option("--golden", lo->golden, "golden file (reference of the same scheme)")->required();
  l->add_option("--layer", lo->layer, "layer index")->required();
  l->add_option("--policy", lo->policy, "tolerance policy (engine role)");
  l->add_option("--tp", lo->tp, "tensor parallelism over GPUs 0..N-1")
      ->check(CLI::Range(1, 8))
      ->capture_default_str();
  l->add_flag("--json", lo->json, "JSON output");
  l->callback([lo, &rc] { rc = layer(*lo); });
  auto to = std::make_shared<TpReportOptions>();
  auto* t = eng->add_subcommand(
      "tp-report", "What tensor parallelism changes: the engine at TP = N against TP = 1");
  t->add_option("--model", to->model, "checkpoint directory")->required();
  t->add_option("--tp", to->tp, "tensor parallelism to study (GPUs 0..N-1)")
      ->check(CLI::Range(2, 8))
      ->required();
  t->add_option("--golden", to->golden, "reference golden: its tokens are run, and it judges both");
  t->add_flag("--reference", to->reference,
              "run the fp64 reference (emulate mode) on the tokens and judge both against it");
  add_token_options(t, to->tokens, to->token_ids, to->text);
  t->add_option("--synthetic", to->synthetic, "N synthetic sequences")
      ->check(CLI::Range(int64_t{1}, int64_t{1} << 24));
  t->add_option("--seq-len", to->seq_len, "tokens per sequence")
      ->check(CLI::Range(int64_t{1}, int64_t{1} << 24));
  t->add_option("--seed", to->seed, "seed of synthetic tokens")
      ->check(seed_check())
      ->capture_default_str();
  t->add_option("--dialect", to->dialect, "vllm | sglang")
      ->check(CLI::IsMember({"vllm", "sglang"}))
      ->capture_default_str();
  t->add_option("--max-tokens", to->max_tokens, "tokens per forward")->capture_default_str();
  t->add_option("--json", to->json, "also write the report as JSON");
  t->callback([to, &rc] { rc = tp_report(*to); });
  auto go = std::make_shared<GenerateOptions>();
  auto* g = eng->add_subcommand("generate", "Continuous-batching generation from prompt token ids");
  g->add_option("--model", go->model, "checkpoint directory")->required();
  g->add_option("--prompts", go->prompts, "file: one prompt per line, token ids")->required();
  g->add_option("--max-new", go->max_new, "tokens to generate per prompt")->capture_default_str();
  g->add_option("--max-seqs", go->max_seqs, "sequences decoding together")->capture_default_str();
  g->add_option("--temperature", go->temperature, "0: greedy")->capture_default_str();
  g->add_option("--top-p", go->top_p, "nucleus mass")->capture_default_str();
  g->add_option("--seed", go->seed, "sampling seed (per prompt: seed + index)")
      ->capture_default_str()
      ->check(seed_check());
  g->callback([go, &rc] {
    generate(*go);
    rc = 0;
  });
}

}  // namespace qparity::cli
