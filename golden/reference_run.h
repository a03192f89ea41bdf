#pragma once
// The reference as a golden producer: runs the fp64 reference over a set of token sequences
// (each from an empty KV cache) and collects everything schema v1 stores. Used by
// `qparity golden make`, `qparity validate` and the accuracy tests.
#include <cstdint>
#include <filesystem>
#include <iosfwd>
#include <optional>
#include <string>
#include <vector>

#include "golden/checkpoint_identity.h"
#include "golden/golden_file.h"
#include "golden/scores.h"
#include "reference_cpu/models/causal_lm.h"
#include "reference_cpu/models/image_input.h"
#include "reference_cpu/models/model_loader.h"

namespace qparity::golden {

// S sequences of T tokens, row-major, and where they came from.
struct TokenInputs {
  int64_t sequences = 0;
  int64_t seq_len = 0;
  std::vector<int64_t> tokens;
  uint64_t seed = 0;
  std::string description;  // recorded as the golden's input_set
  // Image-text prompts: the images of every sequence in prompt order (each sequence takes as
  // many as it has placeholder runs). Empty grids: text only.
  reference::PixelInput pixels;
};

// Deterministic synthetic tokens (uniform over the vocabulary, mt19937_64 from `seed`).
TokenInputs synthetic_inputs(int64_t sequences, int64_t seq_len, int64_t vocab, uint64_t seed);
// Token ids from a file ("-": standard input), whitespace / comma separated, cut into sequences
// of seq_len (a trailing partial sequence is an error naming the counts). seq_len 0: one
// sequence of all. text_inputs does the same for text in hand (`where` names it in errors).
TokenInputs file_inputs(const std::filesystem::path& file, int64_t seq_len);
// Text (UTF-8, "-": standard input) tokenized by the checkpoint's own tokenizer in model_dir
// (core/text/tokenizer.h, its special tokens once at the start / end of the stream), the stream
// cut into windows of seq_len tokens starting every `stride` tokens (0: stride = seq_len, no
// overlap; overlapping windows count their shared tokens in each sequence's NLL), the tail shorter
// than a window dropped (the description says how many tokens were used and dropped); seq_len 0:
// one sequence of the whole stream. max_sequences > 0 keeps the first that many windows.
TokenInputs tokenized_text_inputs(const std::filesystem::path& text_file,
                                  const std::filesystem::path& model_dir, int64_t seq_len,
                                  int64_t stride, int64_t max_sequences);
TokenInputs text_inputs(std::string text, int64_t seq_len, const std::string& where,
                        std::string description);

// The next token inside each sequence; -1 at a sequence's last position.
std::vector<int64_t> next_token_targets(const TokenInputs& in);

struct ReferenceRunOptions {
  std::optional<std::string> scheme;  // --scheme override; else the checkpoint's own plan
  Dialect dialect = Dialect::kIdeal;
  reference::PrecisionMode mode = reference::PrecisionMode::kExact;
  std::string capture = "*";  // capture-point glob(s)
  PointPrecision point_precision = PointPrecision::kF64;
  // The dtype the model runs its weights (and, in emulate mode, its stored activations) in, as
  // the engine being judged does: a golden for a bf16 engine running an fp32 checkpoint. Empty:
  // the checkpoint's own dtype. Recorded as the golden's model_dtype.
  std::optional<DType> run_dtype;
  // Whether the model is streamed one decoder layer at a time (reference::LayerStreaming), and
  // the memory budget (bytes; 0: what the machine has available) that kAuto compares the
  // checkpoint with and the run compares its captured points with.
  reference::LayerStreaming streaming = reference::LayerStreaming::kAuto;
  uint64_t memory_budget = 0;
  // The arithmetic of tensor parallelism tp at the row-parallel layers
  // (reference_cpu/models/tensor_parallel_emulation.h): the spec a TP engine is judged by. The
  // model is then held whole (no streaming); recorded in the golden's device.
  int tp = 1;
};

// Loads the model from `model_dir`, runs every sequence, returns the golden (progress lines on
// `progress` when given). Non-finite values anywhere are an error naming the point and row.
Golden run_reference(const std::filesystem::path& model_dir, const TokenInputs& inputs,
                     const ReferenceRunOptions& options, std::ostream* progress);

// The same for a model already loaded (its cache is reset per sequence). The sequences run one
// decoder layer at a time (each layer loaded once when the model streams), with the bits of one
// forward() per sequence. memory_budget > 0: after layer 0, the captured points' projected size
// (fp64, in memory) must fit it, else an Error suggesting a narrower --capture.
// images: the vision tower's features for inputs.pixels (image_golden_inputs), null for text.
Golden run_reference(reference::CausalLm& model, const TokenInputs& inputs,
                     const std::string& capture, std::ostream* progress, uint64_t memory_budget = 0,
                     const GoldenImages* images = nullptr);

// The golden's images for `inputs`: the pixels, each image's sequence (the sequences' placeholder
// runs in order take the grids in order; a count that disagrees is an error naming the sequence),
// and the tower's features (fp64).
GoldenImages image_golden_inputs(const reference::Qwen3VlVisionTower& tower, const ModelConfig& cfg,
                                 const TokenInputs& inputs);
// Sequence s's share of a golden's images as the decoder takes them.
reference::ImageFeatures sequence_image_features(const GoldenImages& images, int64_t sequence);


// Whether a stored activation code sits at its format's largest magnitude: int8 (lattice 1)
// -128/127, e4m3 (lattice 2^-9) +-448, e2m1 (lattice 0.5) +-6.
bool saturated_code(int64_t stored, double lattice);

// A dense linear's activation codes as the golden's points, where `trace` wants them:
// `<name>.x_values` (code x lattice, [T, K]) and `<name>.x_scales` (one row per token). Expert
// stacks and KV caches are not points (is_activation_code_point). A reference run records them
// through ForwardHooks::on_activation_codes, the golden's run and the layer re-runs alike.
void record_activation_codes(Trace& trace, const std::string& name,
                             const reference::QuantizedMatrix& q);



}  // namespace qparity::golden
