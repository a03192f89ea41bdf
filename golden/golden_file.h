#pragma once
// Golden datasets, schema v1 (golden/SCHEMA.md is the contract; this is its C++ reader and
// writer). One HDF5 file per (model, scheme, input set): the token inputs and targets, every
// capture point for every token, full-precision logits, the targets' log-probabilities, per-
// sequence NLL and perplexity, and the metadata that says what produced them. The reference
// writes them; any engine that dumps the same layout can be compared against them.
//
// Writing builds the file in memory (HDF5's core driver) and lands it with write_file_atomic
// (temp file + fsync + rename), so a reader never sees half a file and an existing golden is
// never replaced unless the caller says so. Reading checks the schema version and the required
// datasets, and reads one capture point without touching the others (each is its own chunked,
// compressed dataset).
#include <cstdint>
#include <filesystem>
#include <memory>
#include <string>
#include <vector>

#include "core/safetensors/safetensors_writer.h"  // OverwritePolicy

namespace qparity::golden {

inline constexpr int kSchemaVersion = 1;

// A row-major float64 array [rows, cols]: capture points are [tokens, width], logits
// [tokens, vocab].
struct Array2D {
  int64_t rows = 0;
  int64_t cols = 0;
  std::vector<double> data;
};

// How capture points are stored: float64 (default, lossless for the reference) or float32
// (half the size; recorded in the file, and compare reads either as float64).
enum class PointPrecision { kF64, kF32 };
const char* to_string(PointPrecision p);

// How a dump was made: a free run (every sequence through the whole model from its tokens; each
// point then carries every upstream error, amplified layer after layer) or layer-local (every
// layer run on the golden's own input to it; each point carries that layer's own error). Stored
// as the root attribute `run` ("free-run" | "layer-local"); a file without it is a free run,
// unless its input_set starts with "layer-local:" (how earlier engine dumps said so).
enum class RunMode { kFree, kLayerLocal };
const char* to_string(RunMode m);

// A capture point a candidate's engine cannot expose (a glob over point names), and why: compare
// lists the golden's points it names as declared absent instead of failing them. Stored in the
// optional root attribute `absent_points`, a 1-D array of strings "GLOB" or "GLOB: reason".
struct AbsentPoint {
  std::string glob;    // "layers.*.attn.rope_q"
  std::string reason;  // "rotary applied inside the fused attention kernel"
};
// "GLOB: reason" -> {GLOB, reason}; an error (naming `where`) for an empty glob or one with '/'.
AbsentPoint parse_absent_point(const std::string& entry, const std::string& where);

struct GoldenMeta {
  std::string producer = "qparity-reference";
  std::string producer_version;
  std::string model;              // a name for the model (checkpoint directory name)
  std::string architecture;       // "llama", "qwen3", "qwen3-moe"
  std::string model_config_hash;  // sha256 of config.json's bytes
  std::string checkpoint_hash;    // see checkpoint_tensor_hash()
  std::string scheme;             // scheme id: "bf16", "w8a16-ch", ...
  std::string dialect;            // "ideal", "vllm", ...
  std::string precision_mode;     // "exact" | "emulate" (reference); engines name theirs
  uint64_t seed = 0;              // seed of the synthetic inputs (0 when from a file)
  std::string input_set;          // "synthetic:4x32:seed=1" or the token file's name
  std::string device;             // "cpu-reference" or the GPU's name and SM ("NVIDIA H100 sm90")
  std::string created;            // ISO 8601 UTC, set by write_golden when empty
  PointPrecision point_precision = PointPrecision::kF64;
  RunMode run_mode = RunMode::kFree;
  // The checkpoint's model dtype ("F32", "BF16", "F16"; optional attribute `model_dtype`, empty
  // when a writer does not say): "bf16" as a scheme id means "unquantized", whatever it holds.
  std::string model_dtype;
  // A shard of a larger run (golden make --shard I/N): sequences I, I+N, I+2N, ... of a run of
  // shard_total sequences (optional attributes `shard` = "I/N" and `shard_sequences`);
  // shard_count 0: a whole run. golden merge assembles the shards (golden/shard.h).
  int64_t shard_index = 0, shard_count = 0, shard_total = 0;
  // Points the producer declares it cannot expose (optional attribute `absent_points`).
  std::vector<AbsentPoint> absent_points;
};
// The declaration naming `point` (the first whose glob matches it), or null.
const AbsentPoint* declared_absent(const GoldenMeta& meta, const std::string& point);

// The string attributes of schema v1 and the GoldenMeta field each one holds, in SCHEMA.md's
// order (point_dtype and the integer attributes are written separately).
struct MetaStringField {
  const char* name;
  std::string GoldenMeta::*field;
};
const std::vector<MetaStringField>& meta_string_fields();

struct CapturePoint {
  std::string name;  // ARCHITECTURE.md's names: "layers.0.attn.qkv"
  Array2D values;    // [sequences * seq_len, width]
};

// Activation quantization of one engine layer over the whole run: how many codes its GEMM was
// fed, how many sat at the format's largest magnitude (int8 -128/127, e4m3 +-448, e2m1 +-6), how
// many scales it used and how many of those were zero (an all-zero row or group).
struct ActivationCodeStats {
  std::string name;  // "layers.0.attn.qkv_proj", "layers.1.moe.experts.w13"
  int64_t codes = 0;
  int64_t saturated = 0;
  int64_t scales = 0;
  int64_t zero_scales = 0;
};

// An image-text golden's images (optional group `images/`, SCHEMA.md): the pixel patches of every
// sequence's images, their grids, the sequence each belongs to, and the vision tower's features
// the decoder took in fp64 (the tower is unquantized and runs in fp64) — what an engine without
// a vision tower feeds its decoder, and what bisect re-runs a layer with. Images are in prompt
// order, sequence by sequence; image i gives t·h·w / merge² feature rows.
struct GoldenImages {
  Array2D pixels;                  // [patches, C·T·P·P]
  std::vector<int64_t> grid_thw;   // [n, 3]
  std::vector<int64_t> sequence;   // [n], non-decreasing
  int64_t merge = 0;               // the tower's spatial_merge_size
  Array2D embeds;                  // [Σ image tokens, hidden]: the merger's output
  std::vector<Array2D> deepstack;  // each [Σ image tokens, hidden]
  bool empty() const { return grid_thw.empty(); }
  int64_t images() const { return static_cast<int64_t>(sequence.size()); }
  // Image i's feature rows t·h·w / merge².
  int64_t tokens_of(int64_t image) const;
};
// Shapes, grids, order and finiteness; errors name `where` and the dataset. sequences: the
// golden's sequence count.
void check_golden_images(const GoldenImages& im, int64_t sequences, const std::string& where);

struct Golden {
  GoldenMeta meta;
  int64_t sequences = 0;
  int64_t seq_len = 0;
  std::vector<int64_t> tokens;          // [S, T]
  std::vector<int64_t> targets;         // [S, T]: the next token, -1 at a sequence's end
  std::vector<CapturePoint> points;     // in execution order
  Array2D logits;                       // [S*T, vocab]
  std::vector<double> target_logprobs;  // [S*T], log_softmax(logits)[target]; NaN where none
  std::vector<double> sequence_nll;     // [S], mean NLL over the sequence's scored positions
  std::vector<double> sequence_ppl;     // [S], exp(sequence_nll)
  std::vector<ActivationCodeStats> activation_stats;  // optional (quant_stats/), execution order
  GoldenImages images;                                // optional (images/): image-text prompts
};

// Checks shapes (every point and the logits have S*T rows, targets match tokens...) and writes.
// Errors name the file and the offending dataset.
void write_golden(const std::filesystem::path& path, const Golden& g, OverwritePolicy policy);

// Reads a golden file lazily: metadata and inputs at open, each dataset on request.
class GoldenReader {
 public:
  static GoldenReader open(const std::filesystem::path& path);
  GoldenReader(GoldenReader&&) noexcept;
  GoldenReader& operator=(GoldenReader&&) noexcept;
  ~GoldenReader();

  const std::filesystem::path& path() const { return path_; }
  const GoldenMeta& meta() const { return meta_; }
  int64_t sequences() const { return sequences_; }
  int64_t seq_len() const { return seq_len_; }
  int64_t rows() const { return sequences_ * seq_len_; }
  const std::vector<int64_t>& tokens() const { return tokens_; }
  const std::vector<int64_t>& targets() const { return targets_; }
  // Capture point names in execution order.
  const std::vector<std::string>& point_names() const { return point_names_; }
  bool has_point(const std::string& name) const;
  Array2D point(const std::string& name) const;
  Array2D logits() const;
  std::vector<double> target_logprobs() const;
  std::vector<double> sequence_nll() const;
  std::vector<double> sequence_ppl() const;
  // Empty when the file has no quant_stats group (unquantized runs, engines that do not dump it).
  std::vector<ActivationCodeStats> activation_stats() const;
  // Whether the file has an images group (image prompts), and its contents, checked.
  bool has_images() const;
  GoldenImages images() const;
  Golden read_all() const;

 private:
  GoldenReader() = default;
  struct Handle;
  std::unique_ptr<Handle> h_;
  std::filesystem::path path_;
  GoldenMeta meta_;
  int64_t sequences_ = 0;
  int64_t seq_len_ = 0;
  std::vector<int64_t> tokens_, targets_;
  std::vector<std::string> point_names_;
};

// "2026-11-21T10:00:00Z"
std::string utc_now_iso8601();

}  // namespace qparity::golden
