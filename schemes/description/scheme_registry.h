#pragma once
// The scheme ids every engine, report and tolerance key shares (ARCHITECTURE.md, "Names shared by
// every engine"), as a registry: what each scheme is, who produces it, its parameters and
// constraints, and the checkpoint tensors it stores per linear (spec/FORMATS.md §2, §5 and the §8
// format cards). `qparity schemes` prints this table, so it is the user-facing support matrix.
// Switches over SchemeKind have no `default`: a new scheme is a compile error wherever it is not
// handled yet.
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "core/json_util.h"
#include "schemes/description/quant_args.h"

namespace qparity {

enum class SchemeKind : uint8_t {
  kBf16,
  kW8A16Channel,
  kW8A16Group,
  kW8A8Static,
  kW8A8S,
  kW8A8Int8,
  kW4A8Dyn,
  kPackedInt,  // compressed-tensors pack-quantized integer weights: the point in IntWeightPoint
  kFp8Tensor,
  kFp8Channel,
  kFp8Block,
  kNvfp4,
  kMxint4,
  kMxfp4,
  kMxfp8,
  kKvBf16,
  kKvInt8,
  kKvFp8,
  kSmoothQuant,
};

inline constexpr SchemeKind kAllSchemeKinds[] = {
    SchemeKind::kBf16,       SchemeKind::kW8A16Channel, SchemeKind::kW8A16Group,
    SchemeKind::kW8A8Static, SchemeKind::kW8A8S,        SchemeKind::kW8A8Int8,
    SchemeKind::kW4A8Dyn,    SchemeKind::kPackedInt,    SchemeKind::kFp8Tensor,
    SchemeKind::kFp8Channel, SchemeKind::kFp8Block,     SchemeKind::kNvfp4,
    SchemeKind::kMxint4,     SchemeKind::kMxfp4,        SchemeKind::kMxfp8,
    SchemeKind::kKvBf16,     SchemeKind::kKvInt8,       SchemeKind::kKvFp8,
    SchemeKind::kSmoothQuant};

// What a scheme applies to: a linear's weights (and its activations), the KV cache of an
// attention layer, or a transform folded into a norm.
enum class SchemeFamily : uint8_t { kWeight, kKvCache, kTransform };

enum class Producer : uint8_t {
  kNone,               // unquantized: any checkpoint
  kMsModelSlim,        // Ascend msModelSlim quant_model_description.json
  kCompressedTensors,  // llm-compressor / compressed-tensors quantization_config
  kFp8Config,          // config.json quant_method "fp8" (HF FineGrainedFP8 / vLLM Fp8Config)
  kEngine,             // chosen by an engine flag with no checkpoint tensors
  kGptq,               // AutoGPTQ / GPTQModel quant_method "gptq" (qweight / qzeros / g_idx)
  kAwq,                // AutoAWQ quant_method "awq" (GEMM layout)
  kModelOpt,           // NVIDIA ModelOpt hf_quant_config.json / quant_method "modelopt"
};

std::string_view to_string(SchemeFamily f);
std::string_view to_string(Producer p);

// A point of compressed-tensors' integer weight-only space (`pack-quantized`, FORMATS.md §2.2,
// card C1): the QuantizationArgs fields that change what the checkpoint holds. actorder "weight"
// (alias "static") changes only the calibration order, so it is not part of the point.
struct IntWeightPoint {
  static constexpr int64_t kChannel = 0;  // strategy channel: one scale per output row
  static constexpr int64_t kTensor = -1;  // strategy tensor: one scale per weight
  int bits = 4;                           // num_bits, 2..8
  int64_t group = 32;                     // strategy group: inputs per scale; or kChannel / kTensor
  bool symmetric = true;                  // false: weight_zero_point stored
  bool actorder = false;                  // actorder "group": weight_g_idx stored
  friend bool operator==(const IntWeightPoint&, const IntWeightPoint&) = default;
};

// The input activations beside kPackedInt integer weights: none (WnA16), or quantized per token
// at run time to int8 (compressed-tensors W4A8 and its WnA8 kin: int8 symmetric dynamic token)
// or to fp8 e4m3 (W4AFP8: float 8-bit symmetric dynamic token).
enum class IntWeightInputs : uint8_t { kNone, kInt8Token, kFp8Token };

// A point of compressed-tensors' INT8 W8A8 space (`int-quantized` / `naive-quantized`, FORMATS.md
// §2.3, §4.5): int8 symmetric static weights per channel or per tensor, int8 inputs either
// dynamic per token (symmetric) or static per tensor (input_scale, and input_zero_point when
// asymmetric). The default point is compressed-tensors' INT8 / W8A8 preset (w8a8-int8-dyn).
struct Int8ActPoint {
  bool tensor_weights = false;   // weights strategy tensor (default: channel)
  bool static_inputs = false;    // static per-tensor input_scale (default: dynamic per token)
  bool symmetric_inputs = true;  // static only: false stores input_zero_point
  friend bool operator==(const Int8ActPoint&, const Int8ActPoint&) = default;
};

// A parsed scheme id. group_size is set only for kW8A16Group (the N of "w8a16-g<N>"); int_weights
// only for kPackedInt (default: the w4a16-g32 point); int8_act only for kW8A8Int8 (default: the
// w8a8-int8-dyn point); schemes whose group is fixed by the format report it through
// effective_group_size().
struct SchemeId {
  SchemeKind kind = SchemeKind::kBf16;
  int64_t group_size = 0;
  IntWeightPoint int_weights{};
  IntWeightInputs int_inputs = IntWeightInputs::kNone;  // kPackedInt only
  Int8ActPoint int8_act{};
  // kNvfp4, kMxfp4, kMxfp8, kFp8Tensor, kFp8Channel, kFp8Block only: no input activations
  // (compressed-tensors' NVFP4A16, MXFP4A16, MXFP8A16 presets, FP8 weights without inputs; ids
  // nvfp4a16, mxfp4a16, mxfp8a16, fp8-tensor-a16, fp8-channel-a16, fp8-block-a16).
  bool weight_only = false;
  // kKvFp8 only: one k/v scale per KV head (compressed-tensors kv_cache_scheme strategy
  // attn_head; id kv-fp8-head) instead of one per tensor.
  bool kv_per_head = false;
  friend bool operator==(const SchemeId&, const SchemeId&) = default;
};

// "w8a16-g128" -> {kW8A16Group, 128}; "ct-w4a16-g128-asym" -> {kPackedInt, {4, 128, asym}}; a
// preset name (scheme_presets(): compressed-tensors' "W4A16", ...) -> the point it names.
// Case-insensitive. Unknown ids throw an Error that lists the valid ones.
SchemeId parse_scheme_id(std::string_view id);
// The canonical id: the pattern, w8a16-g<N>, for kPackedInt "w4a16-g32" at that point and
// "ct-w<b><a16|a8|afp8>-<g<N>|ch|tensor>[-asym][-actorder]" elsewhere (a8 / afp8: int8 / fp8
// per-token inputs), for kW8A8Int8 "w8a8-int8-dyn" at
// its default point and "ct-w8a8-int8[-wtensor]-<dyn|static>[-asym]" elsewhere, and the
// weight-only points of the fp4 / MX families as "nvfp4a16", "mxfp4a16", "mxfp8a16", and the
// per-head KV point as "kv-fp8-head".
std::string to_string(const SchemeId& s);
// The kPackedInt scheme of a compressed-tensors weights QuantizationArgs (int, static, strategy
// group / channel / tensor); an Error naming `where` and the field otherwise.
SchemeId packed_int_scheme(const QuantArgs& weights, const std::string& where);
// The weights QuantizationArgs of a kPackedInt point (what llm-compressor writes for it).
QuantArgs packed_int_args(const IntWeightPoint& p);
// The input QuantizationArgs of kPackedInt inputs (nullopt for kNone); the inputs of
// compressed-tensors args (int8 / fp8 symmetric dynamic per token), else an Error naming
// `where` and the field.
std::optional<QuantArgs> int_weight_input_args(IntWeightInputs in);
IntWeightInputs int_weight_inputs_of(const QuantArgs& inputs, const std::string& where);
// The kW8A8Int8 scheme of compressed-tensors int8 weights and input activations; an Error naming
// `where` and the field for anything outside the space above.
SchemeId w8a8_int8_scheme(const QuantArgs& weights, const QuantArgs& inputs,
                          const std::string& where);
// The weights and input QuantizationArgs of a kW8A8Int8 point.
QuantArgs w8a8_int8_weight_args(const Int8ActPoint& p);
QuantArgs w8a8_int8_input_args(const Int8ActPoint& p);

// A producer's preset name (compressed-tensors' "W4A16", ...) and the point it names, or why
// qparity has no scheme for it yet. Defined beside the producer's config reader
// (compressed_tensors_config.cpp), which resolves the preset's args with the one resolver.
struct SchemePreset {
  std::string name;      // as the producer spells it ("W4A16")
  std::string producer;  // "compressed-tensors"
  std::optional<SchemeId> scheme;
  std::string args;  // "weights int4 group(128) sym static; no input activations"
  std::string why;   // when scheme is unset: the resolver's refusal
};
const std::vector<SchemePreset>& scheme_presets();
// The group along K that the format fixes (32 for w4a16-g32 / mxint4 / mxfp4 / mxfp8, 16 for
// nvfp4, 128 for fp8-block's 128x128 tiles, N for w8a16-g<N>), else 0.
int64_t effective_group_size(const SchemeId& s);
// The multiple of K (in_features) the format itself needs in every dialect: the group of the
// group schemes (a group may not straddle rows), 0 when any K is legal. fp8-block gives 0: its
// 128x128 tiles may be ragged at the edges (scale grid ceil(N/128) x ceil(K/128)); engines that
// need K % 128 for their 1x128 activation groups say so as dialect rules in the reference.
int64_t required_k_multiple(const SchemeId& s);
SchemeFamily scheme_family(SchemeKind k);
// The id, or the id pattern for parametrized schemes ("w8a16-g<N>").
std::string_view scheme_pattern(SchemeKind k);

struct SchemeParam {
  std::string name;
  std::string value;  // fixed value, or "<N>" style placeholder
  std::string description;
};

// One checkpoint tensor of the scheme, named relative to the module it belongs to (a linear
// prefix for weight schemes, `<attn>` for KV caches, `<norm>` for transforms). Shapes use
// N = out_features, K = in_features, G = group size, Hkv·D = num_kv_heads·head_dim, H = hidden;
// "model dtype" is the checkpoint's torch_dtype (bf16 for bf16 models).
struct TensorSpec {
  std::string name;
  std::string dtype;
  std::string shape;
  std::string producer;  // the producer whose files carry it ("" = all of the scheme's producers)
  std::string note;      // when it is present, or how it is encoded
};

struct SchemeInfo {
  SchemeKind kind;
  std::string id;  // pattern for parametrized schemes
  SchemeFamily family;
  std::vector<Producer> producers;
  std::string description;
  std::vector<SchemeParam> parameters;
  std::vector<std::string> constraints;
  std::vector<TensorSpec> tensors;
  std::string spec;  // where spec/FORMATS.md defines it
};

// Every scheme, in kAllSchemeKinds order.
const std::vector<SchemeInfo>& all_schemes();
const SchemeInfo& scheme_info(SchemeKind k);
Json to_json(const SchemeInfo& s);
// Comma-separated list of the valid ids (patterns), for error messages.
std::string valid_scheme_ids();

}  // namespace qparity
