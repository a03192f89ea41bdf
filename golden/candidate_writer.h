#pragma once
// A candidate dump from a C++ engine (TensorRT-LLM-style, no Python): the engine adds capture
// points and logits as it runs and writes a file in the golden schema (SCHEMA.md) that compare,
// bisect, report and `validate --candidate` take. The same rules as python/qparity_dump's
// writer, checked against the checkpoint's own config instead of the catalog alone:
//   * names are the catalog's and exist in this model (layers < num_hidden_layers, q/k-norm
//     points only where the model has them, MoE points only in MoE layers, activation codes of
//     the four linears); each given once, never one that is declared absent;
//   * every point has S*T rows (sequence-major: row s*T + t) and, where the catalog fixes it,
//     the model's width; logits are [S*T, vocab];
//   * NaN/Inf are written as they are (compare fails them: an engine's NaN is a finding, not a
//     writer error);
//   * the checkpoint's directory name and its config and tensor sha256 are recorded, so qparity
//     can check that the candidate ran the golden's checkpoint; the scores (target
//     log-probabilities, NLL, PPL) are computed here in fp64 from the logits;
//   * the file lands through write_golden (temporary file, fsync, link), never over an existing
//     file unless asked.
#include <cstdint>
#include <filesystem>
#include <span>
#include <string>
#include <vector>

#include "core/config/model_config.h"
#include "golden/golden_file.h"

namespace qparity::golden {

// What the engine says of itself; model, architecture and the hashes come from the checkpoint.
struct CandidateInfo {
  std::string producer;           // required: the engine's name ("my-engine")
  std::string producer_version;   // its version or commit
  std::string scheme;             // the scheme id it ran; default: the checkpoint's own (its
                                  // quantization config), which validate judges it by
  std::string dialect = "ideal";  // whose activation-quantization arithmetic it reproduces
  std::string precision_mode;     // how it computes ("bf16-cublas"; default: the producer)
  std::string device;             // "NVIDIA H100 80GB HBM3 sm90" (the policy's device key: smNN)
  std::string model_dtype;        // "BF16", "F16", "F32": what its weights ran in
  std::string input_set;          // default "file:<S>x<T>"
  uint64_t seed = 0;
  RunMode run = RunMode::kFree;  // kLayerLocal: every layer ran on the golden's own input
  PointPrecision point_precision = PointPrecision::kF32;
};

class CandidateWriter {
 public:
  // tokens: [sequences, seq_len] row-major, every sequence run from an empty KV cache.
  CandidateWriter(const std::filesystem::path& model_dir, std::vector<int64_t> tokens,
                  int64_t sequences, int64_t seq_len, CandidateInfo info);

  // A capture point, [S*T, width] row-major (sequence-major rows). Errors name the point.
  void add_point(const std::string& name, std::span<const double> values, int64_t width);
  void add_point(const std::string& name, std::span<const float> values, int64_t width);
  // A point (or glob of points) the engine cannot expose, and why: compare lists the golden's
  // points it names instead of failing them.
  void declare_absent(const std::string& glob, const std::string& reason);
  // The full logits [S*T, vocab], in fp32 or wider (bf16 / fp16 logits are exact in fp32);
  // also written as the capture point `logits` unless add_point gave that or it is declared
  // absent.
  void set_logits(std::span<const float> logits);
  void set_logits(std::span<const double> logits);

  const ModelConfig& config() const { return config_; }
  int64_t rows() const { return golden_.sequences * golden_.seq_len; }
  // Writes the candidate; under kRefuse an existing file is an error and stays as it is.
  void write(const std::filesystem::path& path,
             OverwritePolicy policy = OverwritePolicy::kRefuse) const;

 private:
  Array2D checked_rows(const std::string& name, size_t values, int64_t width) const;
  ModelConfig config_;
  std::vector<std::string> model_points_;  // this model's points in execution order
  Golden golden_;
  bool has_logits_ = false;
};

}  // namespace qparity::golden
