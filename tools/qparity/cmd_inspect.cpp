// `qparity inspect PATH [--json] [--stats] [--scheme ID]`: what a safetensors file or a
// checkpoint directory holds: tensors (dtype, shape, bytes, and with --stats the finite range and
// any NaN / Inf), the normalized ModelConfig, and the QuantPlan module by module with the source
// that decided each entry. Malformed input ends in one error line and exit status 1 (main.cpp).
#include <filesystem>
#include <iomanip>
#include <iostream>
#include <sstream>

#include "core/config/model_config.h"
#include "core/safetensors/checkpoint.h"
#include "schemes/description/quant_plan.h"
#include "schemes/method/tensor_decode.h"
#include "tools/qparity/commands.h"

namespace qparity::cli {

namespace fs = std::filesystem;

namespace {

struct InspectOptions {
  std::string path;
  bool json = false;
  bool stats = false;
  std::string scheme;
};

std::string shape_string(const std::vector<uint64_t>& shape) {
  std::string s = "[";
  for (size_t i = 0; i < shape.size(); ++i)
    s += (i ? ", " : "") + std::to_string(shape[i]);
  return s + "]";
}

std::string human_bytes(uint64_t b) {
  const char* units[] = {"B", "KiB", "MiB", "GiB", "TiB"};
  double v = static_cast<double>(b);
  int u = 0;
  while (v >= 1024 && u < 4) {
    v /= 1024;
    ++u;
  }
  std::ostringstream os;
  os << std::setprecision(u ? 3 : 0) << std::fixed << v << " " << units[u];
  return os.str();
}

Json stats_json(const reference::TensorStats& s) {
  Json j = {{"min", s.min}, {"max", s.max},       {"absmax", s.absmax}, {"mean", s.mean},
            {"rms", s.rms}, {"nan", s.nan_count}, {"inf", s.inf_count}};
  if (s.first_nonfinite >= 0) j["first_nonfinite_index"] = s.first_nonfinite;
  return j;
}

// Stats need a numeric decoding; dtypes without one (F6, C64) are listed without stats.
std::optional<reference::TensorStats> maybe_stats(const TensorRef& t) {
  const DType d = t.info->dtype;
  if (d == DType::kF6E2M3 || d == DType::kF6E3M2 || d == DType::kC64) return std::nullopt;
  return reference::tensor_stats(d, t.bytes(), t.info->numel(),
                                 t.file->path().string() + ": tensor '" + t.info->name + "'");
}

void run_inspect(const InspectOptions& opt) {
  const fs::path path(opt.path);
  const Checkpoint ckpt = Checkpoint::open(path);

  Json out;
  out["path"] = path.string();
  uint64_t total = 0;
  for (const auto& f : ckpt.files()) {
    Json fj = {{"file", f.path().filename().string()},
               {"bytes", f.file_size()},
               {"tensors", f.tensors().size()}};
    if (!f.metadata().empty()) fj["metadata"] = f.metadata();
    out["files"].push_back(fj);
  }
  if (!ckpt.index_path().empty()) out["index"] = ckpt.index_path().filename().string();
  Json tensors = Json::array();
  for (const auto& [name, ref] : ckpt.tensors()) {
    total += ref.info->nbytes();
    Json tj = {{"name", name},
               {"dtype", dtype_name(ref.info->dtype)},
               {"shape", ref.info->shape},
               {"bytes", ref.info->nbytes()},
               {"file", ref.file->path().filename().string()}};
    if (opt.stats) {
      if (auto s = maybe_stats(ref)) tj["stats"] = stats_json(*s);
    }
    tensors.push_back(tj);
  }
  out["tensors"] = tensors;
  out["tensor_bytes"] = total;

  std::optional<ModelConfig> cfg;
  std::optional<QuantPlan> plan;
  if (ckpt.is_directory() && fs::exists(path / "config.json")) {
    cfg = load_model_config(path / "config.json");
    out["model_config"] = to_json(*cfg);
    const std::optional<std::string> override_scheme =
        opt.scheme.empty() ? std::nullopt : std::optional<std::string>(opt.scheme);
    plan = build_quant_plan(*cfg, path, override_scheme);
    out["quant_plan"] = plan->to_json();
  }

  if (opt.json) {
    std::cout << out.dump(2) << "\n";
    return;
  }
  std::cout << "checkpoint " << path.string() << ": " << ckpt.files().size() << " file(s), "
            << ckpt.tensors().size() << " tensors, " << human_bytes(total) << " of tensor data";
  if (!ckpt.index_path().empty())
    std::cout << " (index " << ckpt.index_path().filename().string() << ")";
  std::cout << "\n\ntensors:\n";
  for (const auto& t : out["tensors"]) {
    std::cout << "  " << std::left << std::setw(60) << t["name"].get<std::string>() << " "
              << std::setw(8) << t["dtype"].get<std::string>() << " " << std::setw(18)
              << shape_string(t["shape"].get<std::vector<uint64_t>>()) << " "
              << human_bytes(t["bytes"].get<uint64_t>());
    if (t.contains("stats")) {
      const auto& s = t["stats"];
      std::cout << "  absmax " << s["absmax"].get<double>() << " rms " << s["rms"].get<double>();
      if (s["nan"].get<uint64_t>() || s["inf"].get<uint64_t>())
        std::cout << "  NON-FINITE: " << s["nan"] << " NaN, " << s["inf"] << " Inf (first at "
                  << s["first_nonfinite_index"] << ")";
    }
    std::cout << "\n";
  }
  if (!cfg) {
    if (ckpt.is_directory())
      std::cout << "\n(no config.json: no model config or quantization plan)\n";
    return;
  }
  std::cout << "\nmodel config:\n";
  for (auto it = out["model_config"].begin(); it != out["model_config"].end(); ++it)
    std::cout << "  " << std::left << std::setw(26) << it.key() << " " << it.value().dump() << "\n";
  std::cout << "\nquantization plan (source: " << to_string(plan->source());
  if (!plan->source_file().empty()) std::cout << ", " << plan->source_file();
  std::cout << "):\n";
  for (const auto& r : plan->rules())
    std::cout << "  rule: " << r << "\n";
  for (const PlanEntry& e : *plan) {
    std::cout << "  " << std::left << std::setw(52) << e.prefix << " " << std::setw(12)
              << to_string(e.role) << " " << std::setw(14) << e.scheme_string();
    if (e.format != "dense") std::cout << " format=" << e.format;
    if (!e.sparsity.empty()) std::cout << " sparsity=" << e.sparsity;
    // Online rotations: "rotate=input:v(random-hadamard,128)" (the group, its type and order;
    // "^T" for an inverse).
    for (const OnlineTransform& t : e.transforms)
      std::cout << " rotate=" << to_string(t.location) << ":" << t.group << "(" << to_string(t.type)
                << "," << t.size << ")" << (t.inverse ? "^T" : "");
    if (!e.why.group.empty()) std::cout << " group=" << e.why.group;
    if (!e.why.target.empty()) std::cout << " target=" << e.why.target;
    if (!e.why.key.empty()) std::cout << " key=" << e.why.key;
    if (!e.why.note.empty()) std::cout << " (" << e.why.note << ")";
    std::cout << "\n";
  }
  std::cout << "  summary:";
  for (const auto& [scheme, n] : plan->summary())
    std::cout << " " << scheme << " x" << n;
  std::cout << "\n";
  for (const auto& w : plan->warnings())
    std::cout << "  warning: " << w << "\n";
}

}  // namespace

void add_inspect_command(CLI::App& app, int& rc) {
  auto opt = std::make_shared<InspectOptions>();
  auto* cmd =
      app.add_subcommand("inspect",
                         "Show a safetensors file or checkpoint directory: tensors, model config, "
                         "quantization plan");
  cmd->add_option("path", opt->path, "A .safetensors file or a checkpoint directory")->required();
  cmd->add_flag("--json", opt->json, "Print JSON instead of text");
  cmd->add_flag("--stats", opt->stats,
                "Decode every tensor and report finite min/max/absmax/rms and NaN/Inf counts");
  cmd->add_option("--scheme", opt->scheme,
                  "Override the checkpoint's quantization (a scheme id, see `qparity schemes`)");
  cmd->callback([opt, &rc] {
    run_inspect(*opt);
    rc = 0;
  });
}

}  // namespace qparity::cli
