#include "golden/candidate_writer.h"

#include <fnmatch.h>

#include <algorithm>
#include <cmath>
#include <tuple>

#include "core/capture/capture_points.h"
#include "core/error.h"
#include "golden/checkpoint_identity.h"
#include "golden/scores.h"

namespace qparity::golden {

namespace fs = std::filesystem;

namespace {

bool glob_matches(const std::string& glob, const std::string& name) {
  return ::fnmatch(glob.c_str(), name.c_str(), 0) == 0;
}

// Execution order: embed, the layers in order (each in the catalog's suffix order, activation
// codes included), final_norm, logits.
std::tuple<int, int64_t, size_t> execution_rank(const std::string& name) {
  const auto& before = points_before_layers();
  const auto& after = points_after_layers();
  if (const auto it = std::find(before.begin(), before.end(), name); it != before.end())
    return {0, 0, static_cast<size_t>(it - before.begin())};
  if (const auto it = std::find(after.begin(), after.end(), name); it != after.end())
    return {2, 0, static_cast<size_t>(it - after.begin())};
  const auto& suffixes = all_layer_point_suffixes();
  const std::string sfx = point_suffix(name);
  return {1, point_layer(name),
          static_cast<size_t>(std::find(suffixes.begin(), suffixes.end(), sfx) - suffixes.begin())};
}

}  // namespace

CandidateWriter::CandidateWriter(const fs::path& model_dir, std::vector<int64_t> tokens,
                                 int64_t sequences, int64_t seq_len, CandidateInfo info)
    : config_(load_model_config(model_dir / "config.json")),
      model_points_(model_capture_points(config_, /*quantized_kv_cache=*/true)) {
  if (info.producer.empty())
    throw Error("candidate attribute producer", "name the engine (e.g. 'my-engine')");
  if (sequences < 1 || seq_len < 1 || tokens.size() != static_cast<size_t>(sequences * seq_len))
    throw Error("candidate inputs/tokens", "need [sequences, seq_len] ids with both >= 1 (got " +
                                               std::to_string(tokens.size()) + " ids for " +
                                               std::to_string(sequences) + " x " +
                                               std::to_string(seq_len) + ")");
  for (size_t i = 0; i < tokens.size(); ++i)
    if (tokens[i] < 0 || tokens[i] >= config_.vocab)
      throw Error("candidate inputs/tokens",
                  "id " + std::to_string(tokens[i]) + " at position " + std::to_string(i) +
                      " is outside the vocabulary of " + std::to_string(config_.vocab) + " (" +
                      (model_dir / "config.json").string() + ")");
  GoldenMeta& m = golden_.meta;
  m.producer = info.producer;
  m.producer_version = info.producer_version;
  m.model = model_name(model_dir);
  m.architecture = std::string(arch_name(config_.arch));
  m.model_config_hash = config_hash(model_dir);
  m.checkpoint_hash = checkpoint_tensor_hash(model_dir);
  m.scheme = info.scheme.empty() ? checkpoint_scheme(model_dir) : info.scheme;
  m.dialect = info.dialect;
  m.precision_mode = info.precision_mode.empty() ? info.producer : info.precision_mode;
  m.seed = info.seed;
  m.input_set = info.input_set.empty()
                    ? "file:" + std::to_string(sequences) + "x" + std::to_string(seq_len)
                    : info.input_set;
  m.device = info.device;
  m.point_precision = info.point_precision;
  m.run_mode = info.run;
  m.model_dtype = info.model_dtype;
  golden_.sequences = sequences;
  golden_.seq_len = seq_len;
  golden_.tokens = std::move(tokens);
  golden_.targets = next_token_targets(golden_.tokens, sequences, seq_len);
}

Array2D CandidateWriter::checked_rows(const std::string& name, size_t values, int64_t width) const {
  const std::string where = "candidate points/" + name;
  const bool known =
      std::find(model_points_.begin(), model_points_.end(), name) != model_points_.end();
  const bool code = is_activation_code_point(name) && point_layer(name) >= 0 &&
                    point_layer(name) < config_.num_layers;
  if (!known && !code)
    throw Error(where, "is not a capture point of this " + std::string(arch_name(config_.arch)) +
                           " model (" + std::to_string(config_.num_layers) +
                           " layers; golden/SCHEMA.md lists the catalog)");
  if (std::any_of(golden_.points.begin(), golden_.points.end(),
                  [&](const CapturePoint& p) { return p.name == name; }))
    throw Error(where, "given twice");
  for (const auto& a : golden_.meta.absent_points)
    if (glob_matches(a.glob, name)) throw Error(where, "is declared absent by '" + a.glob + "'");
  if (width < 1 || values != static_cast<size_t>(rows() * width))
    throw Error(where, std::to_string(values) + " values for width " + std::to_string(width) +
                           ": expected [S*T = " + std::to_string(rows()) +
                           ", width] (rows sequence-major: s*T + t)");
  const int64_t expected = capture_point_width(config_, name);
  if (expected > 0 && expected != width)
    throw Error(where,
                "width " + std::to_string(width) + ", the model's is " + std::to_string(expected));
  return Array2D{rows(), width, {}};
}

void CandidateWriter::add_point(const std::string& name, std::span<const double> values,
                                int64_t width) {
  Array2D a = checked_rows(name, values.size(), width);
  a.data.assign(values.begin(), values.end());
  golden_.points.push_back({name, std::move(a)});
}

void CandidateWriter::add_point(const std::string& name, std::span<const float> values,
                                int64_t width) {
  Array2D a = checked_rows(name, values.size(), width);
  a.data.assign(values.begin(), values.end());  // exact: every float is a double
  golden_.points.push_back({name, std::move(a)});
}

void CandidateWriter::declare_absent(const std::string& glob, const std::string& reason) {
  // The schema's rules for an entry (no empty glob, no '/'), the reason on one line.
  std::string r = reason;
  std::replace(r.begin(), r.end(), '\n', ' ');
  AbsentPoint a = parse_absent_point(r.empty() ? glob : glob + ": " + r, "candidate absent_points");
  for (const auto& p : golden_.points)
    if (glob_matches(a.glob, p.name))
      throw Error("candidate absent_points '" + a.glob + "'",
                  "names points/" + p.name + ", which is in the dump");
  if (!glob_names_a_capture_point(a.glob))
    throw Error("candidate absent_points '" + a.glob + "'", "names no capture point");
  golden_.meta.absent_points.push_back(std::move(a));
}

void CandidateWriter::set_logits(std::span<const double> logits) {
  if (logits.size() != static_cast<size_t>(rows() * config_.vocab))
    throw Error("candidate outputs/logits",
                std::to_string(logits.size()) + " values: expected [S*T = " +
                    std::to_string(rows()) + ", vocab = " + std::to_string(config_.vocab) + "]");
  golden_.logits = Array2D{rows(), config_.vocab, {logits.begin(), logits.end()}};
  has_logits_ = true;
}

void CandidateWriter::set_logits(std::span<const float> logits) {
  const std::vector<double> wide(logits.begin(), logits.end());
  set_logits(std::span<const double>(wide));
}

void CandidateWriter::write(const fs::path& path, OverwritePolicy policy) const {
  if (!has_logits_) throw Error(path.string(), "outputs/logits not set (set_logits)");
  if (golden_.points.empty())
    throw Error(path.string(), "no capture point (compare needs at least one)");
  Golden g = golden_;
  // The logits are a capture point too (the golden holds points/logits beside outputs/logits):
  // the outputs' values unless the engine gave its own or declared them absent.
  const std::string logits(point::kLogits);
  if (std::none_of(g.points.begin(), g.points.end(),
                   [&](const CapturePoint& p) { return p.name == logits; }) &&
      !declared_absent(g.meta, logits))
    g.points.push_back({logits, g.logits});
  std::stable_sort(g.points.begin(), g.points.end(),
                   [](const CapturePoint& a, const CapturePoint& b) {
                     return execution_rank(a.name) < execution_rank(b.name);
                   });
  fill_scores(g);
  write_golden(path, g, policy);
}

}  // namespace qparity::golden
