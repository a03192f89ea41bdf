// `qparity trace --model DIR (--tokens 1,2,3 | --tokens-file F | --synthetic N) --out FILE`:
// runs the fp64 reference model on a token sequence and writes every selected capture point
// (ARCHITECTURE.md names: embed, layers.<i>.*, final_norm, logits) as an F64 [T, ...] tensor,
// plus `tokens` (I64) and metadata (scheme plan source, dialect, mode, model dir). The precursor
// of the HDF5 golden file: same capture-point names. --decode runs the tokens one decode step at a
// time over the KV cache instead of one prefill (the two must agree; see the integration tests).
#include <fstream>
#include <iostream>
#include <random>
#include <sstream>

#include "core/error.h"
#include "core/safetensors/safetensors_writer.h"
#include "reference_cpu/models/model_loader.h"
#include "reference_cpu/quant/host_tensor.h"
#include "tools/qparity/commands.h"

namespace qparity::cli {

namespace {

using namespace qparity::reference;

struct TraceOptions {
  std::string model;
  std::string tokens;
  std::string tokens_file;
  int64_t synthetic = 0;
  uint64_t seed = 0;
  std::string scheme;
  std::string dialect = "ideal";
  std::string mode = "exact";
  std::string capture = "*";
  std::string out;
  bool decode = false;
  bool force = false;
};

std::vector<int64_t> parse_token_list(const std::string& text, const std::string& where) {
  std::vector<int64_t> out;
  std::string item;
  std::stringstream ss(text);
  while (std::getline(ss, item, ',')) {
    size_t a = item.find_first_not_of(" \t\r\n"), b = item.find_last_not_of(" \t\r\n");
    if (a == std::string::npos) continue;
    item = item.substr(a, b - a + 1);
    size_t used = 0;
    int64_t v = 0;
    try {
      v = std::stoll(item, &used);
    } catch (const std::exception&) {
      used = 0;
    }
    if (used != item.size()) throw Error(where, "'" + item + "' is not a token id");
    out.push_back(v);
  }
  if (out.empty()) throw Error(where, "no tokens");
  return out;
}

void run(const TraceOptions& o) {
  LoadOptions lo;
  if (!o.scheme.empty()) lo.override_scheme = o.scheme;
  lo.dialect = parse_dialect(o.dialect);
  lo.mode = parse_precision_mode(o.mode);
  auto model = load_model(o.model, lo);
  std::vector<int64_t> tokens;
  const int given = !o.tokens.empty() + !o.tokens_file.empty() + (o.synthetic > 0);
  if (given != 1) throw Error("trace", "give exactly one of --tokens, --tokens-file, --synthetic");
  if (!o.tokens.empty()) tokens = parse_token_list(o.tokens, "--tokens");
  if (!o.tokens_file.empty()) {
    std::ifstream in(o.tokens_file);
    if (!in) throw Error(o.tokens_file, "cannot read");
    std::stringstream s;
    s << in.rdbuf();
    std::string text = s.str();
    for (char& c : text)
      if (c == '\n' || c == ' ') c = ',';
    tokens = parse_token_list(text, o.tokens_file);
  }
  if (o.synthetic > 0) {
    std::mt19937_64 rng(o.seed);
    for (int64_t i = 0; i < o.synthetic; ++i)
      tokens.push_back(static_cast<int64_t>(rng() % static_cast<uint64_t>(model->config().vocab)));
  }
  Trace trace(o.capture);
  ForwardHooks hooks;
  hooks.trace = &trace;
  if (o.decode) {
    for (size_t i = 0; i < tokens.size(); ++i) {
      model->forward(std::span<const int64_t>(tokens).subspan(i, 1), hooks);
      std::cerr << "\rqparity trace: token " << (i + 1) << "/" << tokens.size() << std::flush;
    }
    std::cerr << "\n";
  } else {
    model->forward(tokens, hooks);
  }
  std::vector<HostTensor> keep;
  keep.reserve(trace.points().size() + 1);
  std::vector<TensorToWrite> out;
  keep.push_back(encode_ints(DType::kI64, {static_cast<int64_t>(tokens.size())}, tokens, "tokens"));
  out.push_back({"tokens", DType::kI64, {tokens.size()}, keep.back().bytes});
  for (const auto& [name, m] : trace.points()) {
    keep.push_back(encode(DType::kF64, {m.rows, m.cols}, m.data, Encoding::kExact, name));
    out.push_back({name,
                   DType::kF64,
                   {static_cast<uint64_t>(m.rows), static_cast<uint64_t>(m.cols)},
                   keep.back().bytes});
  }
  const std::map<std::string, std::string> meta = {
      {"producer", "qparity trace"},
      {"model", o.model},
      {"arch", std::string(arch_name(model->config().arch))},
      {"scheme_source", std::string(to_string(model->plan().source()))},
      {"scheme_override", o.scheme},
      {"dialect", std::string(to_string(lo.dialect))},
      {"mode", std::string(to_string(lo.mode))},
      {"steps", o.decode ? "decode" : "prefill"}};
  write_safetensors(o.out, std::move(out), meta,
                    o.force ? OverwritePolicy::kReplace : OverwritePolicy::kRefuse);
  std::cerr << "qparity trace: " << tokens.size() << " tokens, " << trace.points().size()
            << " capture points -> " << o.out << "\n";
}

}  // namespace

void add_trace_command(CLI::App& app, int& rc) {
  auto o = std::make_shared<TraceOptions>();
  auto* cmd = app.add_subcommand(
      "trace", "Run the fp64 reference model on tokens and write every capture point (F64)");
  cmd->add_option("--model", o->model, "Hugging Face checkpoint directory")->required();
  cmd->add_option("--tokens", o->tokens, "comma-separated token ids");
  cmd->add_option("--tokens-file", o->tokens_file, "file of token ids (comma / space / newline)");
  cmd->add_option("--synthetic", o->synthetic, "N random tokens (with --seed)");
  cmd->add_option("--seed", o->seed, "seed for --synthetic")->capture_default_str();
  cmd->add_option("--scheme", o->scheme, "override the checkpoint's quantization (scheme id)");
  cmd->add_option("--dialect", o->dialect,
                  "ideal | compressed-tensors | vllm | sglang | msmodelslim")
      ->capture_default_str();
  cmd->add_option("--mode", o->mode, "exact | emulate (bf16 activations between ops)")
      ->capture_default_str();
  cmd->add_option("--capture", o->capture, "capture-point globs, comma-separated")
      ->capture_default_str();
  cmd->add_flag("--decode", o->decode, "one decode step per token instead of one prefill");
  cmd->add_option("--out", o->out, "safetensors file to write")->required();
  cmd->add_flag("--force", o->force, "replace an existing output file");
  cmd->callback([o, &rc] {
    run(*o);
    rc = 0;
  });
}

}  // namespace qparity::cli
