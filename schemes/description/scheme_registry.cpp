#include "schemes/description/scheme_registry.h"
#include "schemes/description/scheme_bits.h"

#include <algorithm>
#include <cctype>
#include <iterator>
#include <optional>

#include "core/error.h"

namespace qparity {

// Every SchemeKind in the table (kSmoothQuant is the last enumerator): a new family fails here
// until it has its place in kAllSchemeKinds, and so a row in every table built from it.
static_assert(std::size(kAllSchemeKinds) == static_cast<size_t>(SchemeKind::kSmoothQuant) + 1);

namespace {

constexpr std::string_view kW8A16GroupPrefix = "w8a16-g";
// Larger groups than this are not a format anyone writes; the cap keeps parsing overflow-free.
constexpr int64_t kMaxGroupSize = int64_t{1} << 20;

const char* const kMsm = "msModelSlim";
const char* const kCt = "compressed-tensors";
const char* const kFp8 = "fp8";
const char* const kEng = "engine";

const char* const kBiasNote = "JSON type FLOAT; only when the layer has a bias";

SchemeInfo make_info(SchemeKind k) {
  SchemeInfo s{k, std::string(scheme_pattern(k)), scheme_family(k), {}, {}, {}, {}, {}, {}};
  switch (k) {
    case SchemeKind::kBf16:
      s.producers = {Producer::kNone};
      s.description =
          "Unquantized linear: weights and activations in the model dtype (bf16, fp16 or fp32 as "
          "stored); the reference computes it in fp64.";
      s.constraints = {"any linear; the plan's default for modules no quantization config names"};
      s.tensors = {{"weight", "model dtype", "[N, K]", "", ""},
                   {"bias", "model dtype (msModelSlim: F32)", "[N]", "",
                    "only with attention_bias / mlp_bias"}};
      s.spec = "FORMATS.md §0 (conventions)";
      break;
    case SchemeKind::kW8A16Channel:
      s.producers = {Producer::kMsModelSlim};
      s.description =
          "INT8 weights with one fp32 scale and offset per output channel; activations in the "
          "model dtype (msModelSlim W8A16, group_size 0).";
      s.constraints = {
          "quant_model_description.json type W8A16 with global group_size 0",
          "weights int8 in [-128, 127], symmetric or asymmetric (offset all zeros when symmetric)",
          "dequantize w = (q - offset) * scale (NPU kernels add the loader-negated offset)"};
      s.tensors = {{"weight", "I8", "[N, K]", "", ""},
                   {"weight_scale", "F32", "[N, 1]", "", "older files: [N]"},
                   {"weight_offset", "F32", "[N, 1]", "", "zeros when symmetric"},
                   {"bias", "F32", "[N]", "", kBiasNote}};
      s.spec = "FORMATS.md §5.2, §5.3; card C11";
      break;
    case SchemeKind::kW8A16Group:
      s.producers = {Producer::kMsModelSlim};
      s.description =
          "INT8 weights with one fp32 scale and offset per output channel and group of G inputs; "
          "activations in the model dtype (msModelSlim W8A16 with group_size G).";
      s.parameters = {
          {"group_size", "<N>", "inputs per scale along K: the JSON's global group_size"}};
      s.constraints = {
          "quant_model_description.json type W8A16 with global group_size G > 0",
          "K % G == 0; groups run along K in row-major order",
          "dequantize w = (q - offset) * scale per group (offset all zeros when symmetric)"};
      s.tensors = {{"weight", "I8", "[N, K]", "", ""},
                   {"weight_scale", "F32", "[N, K/G]", "", ""},
                   {"weight_offset", "F32", "[N, K/G]", "", "zeros when symmetric"},
                   {"bias", "F32", "[N]", "", kBiasNote}};
      s.spec = "FORMATS.md §5.2, §5.3; card C11";
      break;
    case SchemeKind::kW8A8Static:
      s.producers = {Producer::kMsModelSlim};
      s.description =
          "msModelSlim W8A8: symmetric per-channel INT8 weights, static asymmetric per-tensor INT8 "
          "activations, int32 GEMM plus quant_bias, rescaled by deq_scale.";
      s.constraints = {
          "x_q = clamp(round(x / input_scale + input_offset), -128, 127)",
          "y = (x_q * q_w^T + quant_bias) * deq_scale with deq_scale = input_scale * weight_scale",
          "input_offset is integral and in [-128, 127]",
          "deq_scale is I64 carrying the fp32 bit pattern in its low 32 bits for fp16 models, F32 "
          "for bf16 models"};
      s.tensors = {{"weight", "I8", "[N, K]", "", "symmetric per channel, scale amax/127"},
                   {"input_scale", "F32", "[1]", "", "older docs: fp16/bf16"},
                   {"input_offset", "F32", "[1]", "", "integral value"},
                   {"deq_scale", "I64 or F32", "[N]", "", "I64 (fp32 bits) for fp16 models"},
                   {"quant_bias", "I32", "[N]", "",
                    "round(bias / deq_scale - input_offset * sum_k q_w[n, k])"},
                   {"weight_scale", "F32", "[N, 1]", "", "v0 files only"},
                   {"weight_offset", "F32", "[N, 1]", "", "v0 files only (zeros)"},
                   {"bias", "F32", "[N]", "", kBiasNote}};
      s.spec = "FORMATS.md §5.4; card C12";
      break;
    case SchemeKind::kW8A8S:
      s.producers = {Producer::kMsModelSlim};
      s.description =
          "msModelSlim W8A8S (sparse): the W8A8 tensors and math on a weight produced by the "
          "sparse quantizer (many zeros); the reference computes it as w8a8-static.";
      s.constraints = {"same formulas and checks as w8a8-static",
                       "W8A8SC (the compressed form) is rejected: its weight stream is produced by "
                       "a closed native tool and cannot be reproduced"};
      s.tensors = {{"weight", "I8", "[N, K]", "", "sparse: many zeros"},
                   {"input_scale", "F32", "[1]", "", ""},
                   {"input_offset", "F32", "[1]", "", "integral value"},
                   {"deq_scale", "I64 or F32", "[N]", "", "I64 (fp32 bits) for fp16 models"},
                   {"quant_bias", "I32", "[N]", "", ""},
                   {"bias", "F32", "[N]", "", kBiasNote}};
      s.spec = "FORMATS.md §5.6; card C12";
      break;
    case SchemeKind::kW8A8Int8:
      s.producers = {Producer::kCompressedTensors, Producer::kMsModelSlim};
      s.description =
          "INT8 weights (per channel; per tensor also in compressed-tensors) with INT8 activations "
          "quantized per token at run time (compressed-tensors int-quantized INT8_W8A8; "
          "msModelSlim W8A8_DYNAMIC), or with a static per-tensor input scale (and zero point) "
          "from calibration: the points ct-w8a8-int8[-wtensor]-<dyn|static>[-asym].";
      s.parameters = {{"activation scale", "amax_t / 127 per token",
                       "computed by the engine; its rounding is a dialect choice"},
                      {"static input scale", "calibrated range / 255 (asym), amax / 127.5 (sym)",
                       "compressed-tensors calculate_qparams; stored as input_scale [1]"}};
      s.constraints = {
          "weights int 8-bit, strategy channel or tensor, symmetric, static",
          "inputs int 8-bit: strategy token, dynamic, symmetric; or strategy tensor, static, "
          "symmetric or asymmetric",
          "compressed-tensors format int-quantized (or naive-quantized)",
          "msModelSlim: global group_size 0 (per-group W8A8_DYNAMIC weights are not implemented)"};
      s.tensors = {{"weight", "I8", "[N, K]", kCt, ""},
                   {"weight_scale", "model dtype", "[N, 1]", kCt, "[1] for strategy tensor"},
                   {"input_scale", "model dtype", "[1]", kCt, "static inputs only"},
                   {"input_zero_point", "I8", "[1]", kCt, "static asymmetric inputs only"},
                   {"weight", "I8", "[N, K]", kMsm, ""},
                   {"weight_scale", "F32", "[N, 1]", kMsm, ""},
                   {"weight_offset", "F32", "[N, 1]", kMsm, "zeros"},
                   {"bias", "F32", "[N]", kMsm, kBiasNote}};
      s.spec = "FORMATS.md §2.6(a), §4.5, §5.5; cards C2, C7, C13";
      break;
    case SchemeKind::kW4A8Dyn:
      s.producers = {Producer::kMsModelSlim};
      s.description =
          "msModelSlim W4A8_DYNAMIC (v1, per channel): symmetric INT4 weights with one fp32 scale "
          "per output channel, packed two per byte along N; INT8 activations quantized per token "
          "at run time; integer GEMM. Current vllm-ascend registers W4A8_DYNAMIC for MoE layers "
          "only (the dense layers of such checkpoints are W8A8_DYNAMIC); the reference also runs "
          "it on dense linears.";
      s.parameters = {{"activation scale", "amax_t / 127 per token",
                       "npu_dynamic_quant: codes RINT(x * (127 / amax)), scale 1 / (127 / amax)"},
                      {"group_size", "0",
                       "per channel; the per-group two-level layout is not "
                       "implemented"}};
      s.constraints = {
          "quant_model_description.json type W4A8_DYNAMIC with global group_size 0",
          "weights int4 in [-8, 7], s = amax / 7 (fp32), symmetric (weight_offset all zeros)",
          "N % 2 == 0: two int4 per byte along the output dim, element 2j in the low nibble",
          "scale_bias = 8 * sum_k q[n, k] * s[n] (the NPU kernel's int8 split correction); "
          "down_proj / o_proj: 16 chunks of K / 16 columns each (K % 16 == 0)",
          "y = a_s[t] * s[n] * sum_k x_q[t, k] * q[n, k] (+ bias)",
          "tensor parallelism is not implemented"};
      s.tensors = {{"weight", "I8", "[N/2, K]", "", "two int4 a byte along N (low nibble: even n)"},
                   {"weight_scale", "F32", "[N, 1]", "", ""},
                   {"weight_offset", "F32", "[N, 1]", "", "zeros"},
                   {"scale_bias", "F32", "[N, 1]", "", "gate/up/q/k/v_proj: 8 * sum_k q * s"},
                   {"scale_bias", "F32", "[N, 16]", "",
                    "down_proj / o_proj: column c sums k in [c K/16, (c+1) K/16)"},
                   {"bias", "F32", "[N]", "", kBiasNote}};
      s.spec = "FORMATS.md §5.1, §5.10 (msModelSlim ascendv1.py on_w4a8_dynamic; no card yet)";
      break;
    case SchemeKind::kPackedInt:
      // GPTQ's and AutoAWQ's layouts of the same points (docs/GPTQ-AWQ.md).
      s.producers = {Producer::kCompressedTensors, Producer::kGptq, Producer::kAwq};
      s.description =
          "Integer weights of 2..8 bits, one scale (and with asym one zero point) per group of "
          "inputs, per output channel or per tensor; activations in the model dtype "
          "(compressed-tensors pack-quantized W<b>A16). A point of the space; w4a16-g32 is int4, "
          "group 32, symmetric; compressed-tensors' W4A16 / W4A16_ASYM / W8A16 presets are "
          "ct-w4a16-g128 / ct-w4a16-g128-asym / ct-w8a16-g128 (W8A16 was per channel, "
          "ct-w8a16-ch, up to compressed-tensors 0.15). With per-token 8-bit inputs the same "
          "weights are compressed-tensors' W<b>A8 (int8 inputs: ct-w<b>a8-..., W4A8 is "
          "ct-w4a8-g128) and W4AFP8 (fp8 e4m3 inputs: ct-w4afp8-g128).";
      s.parameters = {
          {"num_bits", "<b>", "2..8"},
          {"strategy", "group(<N>) | channel | tensor", "inputs per scale along K"},
          {"symmetric", "true | false", "false: weight_zero_point"},
          {"actorder", "none | group | weight", "group: weight_g_idx stored"},
          {"inputs", "a16 | a8 | afp8", "none, or int8 / fp8 symmetric dynamic per token"}};
      s.constraints = {
          "weights int, static; format pack-quantized (codes packed) or, with a8 / "
          "afp8 inputs, int-quantized / naive-quantized (one I8 code per element)",
          "a8 / afp8: input_activations symmetric, dynamic, strategy token, 8 bits",
          "group: K % group_size == 0", "stored u = q + 2^(b-1), packed into int32 words along K",
          "on MoE expert stacks int4 group 32 symmetric without actorder is mxint4"};
      // Shapes are read by the TP sharding rules (schemes/parallel/quant_sharding.cpp): one row per
      // strategy's shape, b = num_bits.
      s.tensors = {
          {"weight_packed", "I32", "[N, ceil(K*b/32)]", "", "dense int32 stream along K"},
          {"weight", "I8", "[N, K]", "",
           "int-quantized (a8 / afp8 points) instead of weight_packed and weight_shape"},
          {"weight_zero_point", "I8", "[N, K/G]", "", "int-quantized asymmetric group: unpacked"},
          {"weight_scale", "model dtype", "[N, K/G]", "", "strategy group"},
          {"weight_scale", "model dtype", "[N, 1]", "", "strategy channel"},
          {"weight_scale", "model dtype", "[1]", "", "strategy tensor"},
          {"weight_zero_point", "I32", "[ceil(N*b/32), K/G]", "",
           "asymmetric group: packed along N like the codes"},
          {"weight_zero_point", "I32", "[ceil(N*b/32), 1]", "", "asymmetric channel"},
          {"weight_zero_point", "I8", "[1]", "", "asymmetric tensor"},
          {"weight_shape", "I64", "[2]", "", "holds [N, K]"},
          {"weight_g_idx", "I32", "[K]", "", "only with actorder 'group'"}};
      s.spec = "FORMATS.md §2.2-2.6(b); card C1";
      break;
    case SchemeKind::kFp8Tensor:
      s.producers = {Producer::kCompressedTensors, Producer::kFp8Config, Producer::kModelOpt};
      s.description =
          "FP8 E4M3 weights with one scale per tensor; FP8 activations with a static per-tensor "
          "scale, dynamic, or unquantized (compressed-tensors FP8 preset; quant_method fp8 without "
          "weight_block_size). Unquantized inputs are the point fp8-tensor-a16.";
      s.parameters = {{"activations", "static tensor | dynamic | none",
                       "from input_activations / activation_scheme"}};
      s.constraints = {
          "weights float 8-bit, strategy tensor, symmetric, static",
          "inputs float 8-bit: static per tensor, dynamic per token or tensor, or none",
          "fused q/k/v and gate/up layers reconcile per-tensor scales with their max "
          "(requantization)"};
      s.tensors = {{"weight", "F8_E4M3", "[N, K]", "", ""},
                   {"weight_scale", "model dtype", "[1]", kCt, ""},
                   {"input_scale", "model dtype", "[1]", kCt, "static activations only"},
                   {"weight_scale", "F32", "[1]", kFp8, ""},
                   {"input_scale", "F32", "[1]", kFp8, "activation_scheme static only"}};
      s.spec = "FORMATS.md §2.6(a), §3.6; cards C3, C6";
      break;
    case SchemeKind::kFp8Channel:
      s.producers = {Producer::kCompressedTensors, Producer::kMsModelSlim, Producer::kModelOpt};
      s.description =
          "FP8 E4M3 weights with one scale per output channel; FP8 activations quantized per token "
          "at run time, or unquantized (compressed-tensors FP8_DYNAMIC; msModelSlim "
          "WFP8AFP8_DYNAMIC). Unquantized inputs are the point fp8-channel-a16.";
      s.parameters = {{"activations", "dynamic token | none", "from input_activations"}};
      s.constraints = {"weights float 8-bit, strategy channel, symmetric, static",
                       "inputs float 8-bit dynamic per token, or none (static activations are "
                       "rejected with channel weights)"};
      s.tensors = {{"weight", "F8_E4M3", "[N, K]", kCt, ""},
                   {"weight_scale", "model dtype", "[N, 1]", kCt, ""},
                   {"weight", "F8_E4M3", "[N, K]", kMsm, ""},
                   {"weight_scale", "F32", "[N, 1]", kMsm, ""},
                   {"weight_offset", "F32", "[N, 1]", kMsm, "zeros"},
                   {"bias", "F32", "[N]", kMsm, kBiasNote}};
      s.spec = "FORMATS.md §2.6(a), §5.5; cards C3, C6, C13";
      break;
    case SchemeKind::kFp8Block:
      s.producers = {Producer::kCompressedTensors, Producer::kFp8Config};
      s.description =
          "FP8 E4M3 weights with one scale per 128x128 tile; FP8 activations per token and "
          "128-column group at run time (compressed-tensors FP8_BLOCK; quant_method fp8 with "
          "weight_block_size [128, 128], DeepSeek-V3 style). Unquantized inputs (vLLM's "
          "W8A16Fp8) are the point fp8-block-a16.";
      s.parameters = {{"block_structure", "[128, 128]", "weight tile [rows, cols]"},
                      {"activation group", "128", "per-token-group activation scale (1x128)"}};
      s.constraints = {
          "weights float 8-bit, strategy block, block_structure [128, 128], symmetric, static",
          "inputs float 8-bit dynamic, strategy group, group_size 128 (quant_method fp8: "
          "activation_scheme dynamic)",
          "N and K may be ragged: edge tiles are partial, their scale from the amax of the "
          "partial tile (compressed-tensors pads with zeros, then crops)",
          "dynamic 1x128 activation groups: K % 128 == 0 under the vllm, sglang and "
          "compressed-tensors dialects (their group kernels / QDQ assert it); ideal runs a "
          "ragged last group"};
      s.tensors = {{"weight", "F8_E4M3", "[N, K]", "", ""},
                   {"weight_scale", "model dtype", "[ceil(N/128), ceil(K/128)]", kCt, ""},
                   {"weight_scale_inv", "F32", "[ceil(N/128), ceil(K/128)]", kFp8,
                    "a multiplier despite its name: w = q * weight_scale_inv"}};
      s.spec = "FORMATS.md §2.6(a), §3.2; cards C3, C6";
      break;
    case SchemeKind::kNvfp4:
      s.producers = {Producer::kCompressedTensors, Producer::kModelOpt};
      s.description =
          "NVFP4: FP4 E2M1 weights with an FP8 E4M3 scale per 16 inputs and an fp32 global scale; "
          "FP4 activations the same way with a calibrated global scale (NVFP4) or unquantized "
          "(NVFP4A16).";
      s.parameters = {{"group_size", "16", "inputs per FP8 scale"},
                      {"activations", "fp4 tensor_group local | none", "NVFP4 vs NVFP4A16"}};
      s.constraints = {
          "weight-only (no input activations, compressed-tensors' NVFP4A16): the point nvfp4a16",

          "weights float 4-bit, strategy tensor_group, group_size 16, symmetric, static",
          "inputs float 4-bit, strategy tensor_group, group_size 16, dynamic \"local\", or none",
          "format nvfp4-pack-quantized; K % 16 == 0",
          "global scales are divisors: x' = e2m1(q) * s / global_scale",
          "two codes per byte, low nibble = even element"};
      s.tensors = {{"weight_packed", "U8", "[N, K/2]", "", ""},
                   {"weight_scale", "F8_E4M3", "[N, K/16]", "", "already times the global scale"},
                   {"weight_global_scale", "F32", "[1]", "", ""},
                   {"input_global_scale", "F32", "[1]", "", "NVFP4 (W4A4) only"}};
      s.spec = "FORMATS.md §2.7, §3.4, §4.2; cards C4, C9";
      break;
    case SchemeKind::kMxint4:
      s.producers = {Producer::kCompressedTensors};
      s.description =
          "INT4 weights with a bf16 scale per 32 inputs on MoE expert stacks (SGLang "
          "CompressedTensorsMxInt4MoE): the w4a16-g32 checkpoint format run as one [E, ...] stack.";
      s.parameters = {{"num_bits", "4", ""}, {"group_size", "32", "inputs per scale along K"}};
      s.constraints = {
          "MoE expert stacks only (a plain linear in this format is w4a16-g32)",
          "weights int 4-bit, strategy group, group_size 32, symmetric, static, no actorder",
          "no input_activations; format pack-quantized; model dtype bf16",
          "every expert and w1/w3/w2 shard of a stack resolves to the same scheme",
          "dequantize (u - 8) * scale; nothing checks that the scales are powers of two"};
      s.tensors = {
          {"weight_packed", "I32", "[N, K/8]", kCt, "per expert linear experts.<e>.*_proj"},
          {"weight_scale", "BF16", "[N, K/32]", kCt, "per expert linear"},
          {"weight_shape", "I64", "[2]", kCt, "per expert linear"},
          {"w13_weight_packed", "I32", "[E, 2I, H/8]", kEng, "SGLang stack after loading"},
          {"w2_weight_packed", "I32", "[E, H, I/8]", kEng, "SGLang stack after loading"},
          {"w13_weight_scale", "BF16", "[E, 2I, H/32]", kEng, "SGLang stack after loading"},
          {"w2_weight_scale", "BF16", "[E, H, I/32]", kEng, "SGLang stack after loading"}};
      s.spec = "FORMATS.md §4.3; card C10";
      break;
    case SchemeKind::kMxfp4:
      s.producers = {Producer::kCompressedTensors};
      s.description =
          "MXFP4: FP4 E2M1 weights with a power-of-two (E8M0) scale per 32 inputs; MXFP4 "
          "activations at run time (MXFP4) or unquantized (MXFP4A16).";
      s.parameters = {{"group_size", "32", "inputs per E8M0 scale"},
                      {"activations", "fp4 group(32) dynamic | none", "MXFP4 vs MXFP4A16"}};
      s.constraints = {
          "weight-only (no input activations, compressed-tensors' MXFP4A16): the point mxfp4a16",

          "weights float 4-bit, strategy group, group_size 32, scale_dtype torch.uint8, "
          "symmetric, static",
          "inputs float 4-bit, strategy group, group_size 32, dynamic, or none",
          "format mxfp4-pack-quantized; K % 32 == 0",
          "scale byte e means 2^(e - 127); 0xFF is invalid"};
      s.tensors = {{"weight_packed", "U8", "[N, K/2]", "", "low nibble = even element"},
                   {"weight_scale", "U8", "[N, K/32]", "", "E8M0 exponent byte"}};
      s.spec = "FORMATS.md §2.6(d), §2.8; card C5";
      break;
    case SchemeKind::kMxfp8:
      s.producers = {Producer::kCompressedTensors};
      s.description =
          "MXFP8: FP8 E4M3 weights with a power-of-two (E8M0) scale per 32 inputs; MXFP8 "
          "activations at run time (MXFP8) or unquantized (MXFP8A16).";
      s.parameters = {{"group_size", "32", "inputs per E8M0 scale"},
                      {"activations", "fp8 group(32) dynamic | none", "MXFP8 vs MXFP8A16"}};
      s.constraints = {
          "weight-only (no input activations, compressed-tensors' MXFP8A16): the point mxfp8a16",

          "weights float 8-bit, strategy group, group_size 32, scale_dtype torch.uint8, "
          "symmetric, static",
          "inputs float 8-bit, strategy group, group_size 32, dynamic, or none",
          "format mxfp8-quantized; K % 32 == 0", "scale byte e means 2^(e - 127); 0xFF is invalid"};
      s.tensors = {{"weight", "F8_E4M3", "[N, K]", "", ""},
                   {"weight_scale", "U8", "[N, K/32]", "", "E8M0 exponent byte"}};
      s.spec = "FORMATS.md §2.6(e), §2.8; card C5";
      break;
    case SchemeKind::kKvBf16:
      s.producers = {Producer::kNone};
      s.description = "Unquantized KV cache in the model dtype.";
      s.constraints = {"the plan's default for every attention layer"};
      s.spec = "";
      break;
    case SchemeKind::kKvInt8:
      s.producers = {Producer::kMsModelSlim};
      s.description =
          "msModelSlim C8: INT8 KV cache with a calibrated scale and offset per channel "
          "(num_kv_heads * head_dim channels, index head * head_dim + d).";
      s.constraints = {
          "JSON kv_cache_type (or kv_quant_type) C8 and type C8 entries for every attention layer",
          "c_q = clamp(round(c / scale + offset), -128, 127); c = (c_q - offset) * scale",
          "asymmetric offsets are UNCONFIRMED on real files (FORMATS.md §5.8)"};
      s.tensors = {{"k_proj.kv_cache_scale", "F32", "[Hkv*D]", "", "docs: fp32 or fp16"},
                   {"k_proj.kv_cache_offset", "F32", "[Hkv*D]", "",
                    "zeros when symmetric; the IR docstring says int32"},
                   {"v_proj.kv_cache_scale", "F32", "[Hkv*D]", "", ""},
                   {"v_proj.kv_cache_offset", "F32", "[Hkv*D]", "", ""}};
      s.spec = "FORMATS.md §5.8; card C15";
      break;
    case SchemeKind::kKvFp8:
      s.producers = {Producer::kCompressedTensors, Producer::kModelOpt, Producer::kEngine};
      s.description =
          "FP8 E4M3 KV cache with one scale per tensor for K and for V (compressed-tensors "
          "kv_cache_scheme; an engine flag such as --kv-cache-dtype fp8 uses scale 1.0 when the "
          "checkpoint has none), or one per KV head: the point kv-fp8-head (strategy "
          "attn_head).";
      s.parameters = {{"per head", "kv-fp8-head",
                       "strategy attn_head: k_scale / v_scale [Hkv, 1, 1], head h's channels "
                       "h*D..h*D+D-1 use scale h"}};
      s.constraints = {
          "kv_cache_scheme: float 8-bit, strategy tensor or attn_head, symmetric, "
          "static",
          "store e4m3(clamp(k / k_scale)), read k_q * k_scale (engine semantics "
          "UNCONFIRMED, FORMATS.md §7)"};
      s.tensors = {{"k_scale", "model dtype or scale_dtype", "[1]", kCt,
                    "kv-fp8-head: [Hkv, 1, 1] (or [Hkv])"},
                   {"v_scale", "model dtype or scale_dtype", "[1]", kCt,
                    "kv-fp8-head: [Hkv, 1, 1] (or [Hkv])"},
                   {"k_proj.output_scale", "model dtype", "[1]", kCt,
                    "older llm-compressor files; engines rename it to k_scale"},
                   {"v_proj.output_scale", "model dtype", "[1]", kCt,
                    "older llm-compressor files; engines rename it to v_scale"}};
      s.spec = "FORMATS.md §2.9; card C17";
      break;
    case SchemeKind::kSmoothQuant:
      s.producers = {Producer::kMsModelSlim};
      s.description =
          "msModelSlim anti-outlier (SmoothQuant-style) folding: the norm before a quantized "
          "linear carries a scaled weight and a new bias, so RMSNorm becomes rmsnorm(x) * w + b.";
      s.constraints = {
          "`<norm>.bias` (new files) or `<norm>.module.weight` + `<norm>.module.bias` (old files) "
          "in quant_model_description.json",
          "non-fusable smoothing (`<layer>.div.mul_scale`) is not implemented"};
      s.tensors = {{"weight", "model dtype", "[H]", "", "the scaled norm weight"},
                   {"bias", "model dtype", "[H]", "", "new files"},
                   {"module.weight", "model dtype", "[H]", "",
                    "old files; `<norm>.weight` then keeps the original"},
                   {"module.bias", "model dtype", "[H]", "", "old files"}};
      s.spec = "FORMATS.md §5.7; card C16";
      break;
  }
  return s;
}

std::string lower(std::string_view s) {
  std::string out(s);
  std::transform(out.begin(), out.end(), out.begin(),
                 [](unsigned char ch) { return static_cast<char>(std::tolower(ch)); });
  return out;
}

}  // namespace

std::string_view to_string(SchemeFamily f) {
  switch (f) {
    case SchemeFamily::kWeight:
      return "weight";
    case SchemeFamily::kKvCache:
      return "kv-cache";
    case SchemeFamily::kTransform:
      return "transform";
  }
  return "?";
}

std::string_view to_string(Producer p) {
  switch (p) {
    case Producer::kNone:
      return "none";
    case Producer::kMsModelSlim:
      return "msModelSlim";
    case Producer::kCompressedTensors:
      return "compressed-tensors";
    case Producer::kFp8Config:
      return "fp8";
    case Producer::kEngine:
      return "engine";
    case Producer::kGptq:
      return "gptq";
    case Producer::kAwq:
      return "awq";
    case Producer::kModelOpt:
      return "modelopt";
  }
  return "?";
}

std::string_view scheme_pattern(SchemeKind k) {
  switch (k) {
    case SchemeKind::kBf16:
      return "bf16";
    case SchemeKind::kW8A16Channel:
      return "w8a16-ch";
    case SchemeKind::kW8A16Group:
      return "w8a16-g<N>";
    case SchemeKind::kW8A8Static:
      return "w8a8-static";
    case SchemeKind::kW8A8S:
      return "w8a8s";
    case SchemeKind::kW8A8Int8:
      return "w8a8-int8-dyn";
    case SchemeKind::kW4A8Dyn:
      return "w4a8-dyn";
    case SchemeKind::kPackedInt:
      return "ct-w<b><a16|a8|afp8>-<g<N>|ch|tensor>[-asym][-actorder]";
    case SchemeKind::kFp8Tensor:
      return "fp8-tensor";
    case SchemeKind::kFp8Channel:
      return "fp8-channel";
    case SchemeKind::kFp8Block:
      return "fp8-block";
    case SchemeKind::kNvfp4:
      return "nvfp4";
    case SchemeKind::kMxint4:
      return "mxint4";
    case SchemeKind::kMxfp4:
      return "mxfp4";
    case SchemeKind::kMxfp8:
      return "mxfp8";
    case SchemeKind::kKvBf16:
      return "kv-bf16";
    case SchemeKind::kKvInt8:
      return "kv-int8";
    case SchemeKind::kKvFp8:
      return "kv-fp8";
    case SchemeKind::kSmoothQuant:
      return "smoothquant";
  }
  return "?";
}

SchemeFamily scheme_family(SchemeKind k) {
  switch (k) {
    case SchemeKind::kBf16:
    case SchemeKind::kW8A16Channel:
    case SchemeKind::kW8A16Group:
    case SchemeKind::kW8A8Static:
    case SchemeKind::kW8A8S:
    case SchemeKind::kW8A8Int8:
    case SchemeKind::kW4A8Dyn:
    case SchemeKind::kPackedInt:
    case SchemeKind::kFp8Tensor:
    case SchemeKind::kFp8Channel:
    case SchemeKind::kFp8Block:
    case SchemeKind::kNvfp4:
    case SchemeKind::kMxint4:
    case SchemeKind::kMxfp4:
    case SchemeKind::kMxfp8:
      return SchemeFamily::kWeight;
    case SchemeKind::kKvBf16:
    case SchemeKind::kKvInt8:
    case SchemeKind::kKvFp8:
      return SchemeFamily::kKvCache;
    case SchemeKind::kSmoothQuant:
      return SchemeFamily::kTransform;
  }
  return SchemeFamily::kWeight;
}

double weight_bits_per_element(const SchemeId& s) {
  switch (s.kind) {
    case SchemeKind::kBf16:
    case SchemeKind::kKvBf16:
    case SchemeKind::kKvInt8:
    case SchemeKind::kKvFp8:
      return 16.0;  // weights as a bf16 checkpoint stores them
    case SchemeKind::kW8A16Channel:
    case SchemeKind::kW8A8Static:
    case SchemeKind::kW8A8S:
    case SchemeKind::kW8A8Int8:
    case SchemeKind::kSmoothQuant:
    case SchemeKind::kFp8Tensor:
    case SchemeKind::kFp8Channel:
      return 8.0;
    case SchemeKind::kW4A8Dyn:
      return 4.0;
    case SchemeKind::kW8A16Group:
      return 8.0 + 16.0 / static_cast<double>(s.group_size);
    case SchemeKind::kPackedInt: {
      const IntWeightPoint& p = s.int_weights;
      const double bits = p.bits;
      if (p.group <= 0) return bits;
      return bits + (16.0 + (p.symmetric ? 0.0 : bits)) / static_cast<double>(p.group);
    }
    case SchemeKind::kFp8Block:
      return 8.0 + 32.0 / (128.0 * 128.0);
    case SchemeKind::kNvfp4:
      return 4.0 + 8.0 / 16.0;
    case SchemeKind::kMxint4:
    case SchemeKind::kMxfp4:
      return 4.0 + 8.0 / 32.0;
    case SchemeKind::kMxfp8:
      return 8.0 + 8.0 / 32.0;
  }
  return 16.0;
}

int64_t effective_group_size(const SchemeId& s) {
  switch (s.kind) {
    case SchemeKind::kW8A16Group:
      return s.group_size;
    case SchemeKind::kPackedInt:
      return s.int_weights.group > 0 ? s.int_weights.group : 0;
    case SchemeKind::kMxint4:
    case SchemeKind::kMxfp4:
    case SchemeKind::kMxfp8:
      return 32;
    case SchemeKind::kNvfp4:
      return 16;
    case SchemeKind::kFp8Block:
      return 128;
    case SchemeKind::kBf16:
    case SchemeKind::kW8A16Channel:
    case SchemeKind::kW8A8Static:
    case SchemeKind::kW8A8S:
    case SchemeKind::kW8A8Int8:
    case SchemeKind::kW4A8Dyn:
    case SchemeKind::kFp8Tensor:
    case SchemeKind::kFp8Channel:
    case SchemeKind::kKvBf16:
    case SchemeKind::kKvInt8:
    case SchemeKind::kKvFp8:
    case SchemeKind::kSmoothQuant:
      return 0;
  }
  return 0;
}

int64_t required_k_multiple(const SchemeId& s) {
  return s.kind == SchemeKind::kFp8Block ? 0 : effective_group_size(s);
}

std::string valid_scheme_ids() {
  std::string out;
  for (SchemeKind k : kAllSchemeKinds) {
    if (!out.empty()) out += ", ";
    if (k == SchemeKind::kPackedInt) out += "w4a16-g32, ";
    out += scheme_pattern(k);
    if (k == SchemeKind::kW8A8Int8) out += ", ct-w8a8-int8[-wtensor]-<dyn|static>[-asym]";
    if (k == SchemeKind::kNvfp4 || k == SchemeKind::kMxfp4 || k == SchemeKind::kMxfp8)
      out += ", " + std::string(scheme_pattern(k)) + "a16";
    if (k == SchemeKind::kFp8Tensor || k == SchemeKind::kFp8Channel || k == SchemeKind::kFp8Block)
      out += ", " + std::string(scheme_pattern(k)) + "-a16";
    if (k == SchemeKind::kKvFp8) out += ", kv-fp8-head";
  }
  out += "; presets: ";
  bool first = true;
  for (const SchemePreset& p : scheme_presets()) {
    if (!p.scheme) continue;
    out += first ? "" : ", ";
    out += p.name;
    first = false;
  }
  return out;
}

namespace {

constexpr std::string_view kPackedIntPrefix = "ct-w";
const IntWeightPoint kW4A16G32Point{};

bool all_digits(const std::string& d, size_t max_len) {
  return !d.empty() && d.size() <= max_len && d[0] != '0' &&
         std::all_of(d.begin(), d.end(), [](unsigned char ch) { return std::isdigit(ch); });
}

// "ct-w<b><a16|a8|afp8>-<g<N>|ch|tensor>[-asym][-actorder]" (already lower-cased).
std::optional<SchemeId> parse_packed_int(const std::string& s, std::string_view id) {
  if (s.rfind(kPackedIntPrefix, 0) != 0) return std::nullopt;
  const std::string where = "scheme '" + std::string(id) + "'";
  const std::string usage =
      "expected ct-w<b><a16|a8|afp8>-<g<N>|ch|tensor>[-asym][-actorder] with b in 2..8 and N in "
      "[1, " +
      std::to_string(kMaxGroupSize) + "]";
  std::vector<std::string> parts;
  size_t start = kPackedIntPrefix.size() - 1;  // at the 'w'
  while (start <= s.size()) {
    const size_t dash = std::min(s.find('-', start), s.size());
    parts.push_back(s.substr(start, dash - start));
    start = dash + 1;
  }
  if (parts.size() < 2 || parts.size() > 4) throw Error(where, usage);
  const std::string& wa = parts[0];
  IntWeightInputs inputs = IntWeightInputs::kNone;
  const std::string act = wa.size() >= 2 ? wa.substr(2) : "";
  if (act == "a8")
    inputs = IntWeightInputs::kInt8Token;
  else if (act == "afp8")
    inputs = IntWeightInputs::kFp8Token;
  else if (act != "a16")
    throw Error(where, "'" + wa + "': " + usage);
  if (wa[0] != 'w' || wa[1] < '2' || wa[1] > '8') throw Error(where, "'" + wa + "': " + usage);
  IntWeightPoint p;
  p.bits = wa[1] - '0';
  const std::string& g = parts[1];
  if (g == "ch") {
    p.group = IntWeightPoint::kChannel;
  } else if (g == "tensor") {
    p.group = IntWeightPoint::kTensor;
  } else if (g.size() > 1 && g[0] == 'g' && all_digits(g.substr(1), 7) &&
             std::stoll(g.substr(1)) <= kMaxGroupSize) {
    p.group = std::stoll(g.substr(1));
  } else {
    throw Error(where, "'" + g + "': " + usage);
  }
  size_t i = 2;
  if (i < parts.size() && parts[i] == "asym") {
    p.symmetric = false;
    ++i;
  }
  if (i < parts.size() && parts[i] == "actorder") {
    p.actorder = true;
    ++i;
  }
  if (i != parts.size()) throw Error(where, "'" + parts[i] + "': " + usage);
  if (p.actorder && p.group <= 0)
    throw Error(where,
                "actorder group needs strategy group (g<N>), as compressed-tensors requires");
  return SchemeId{SchemeKind::kPackedInt, 0, p, inputs};
}

}  // namespace

std::optional<QuantArgs> int_weight_input_args(IntWeightInputs in) {
  switch (in) {
    case IntWeightInputs::kNone:
      return std::nullopt;
    case IntWeightInputs::kInt8Token:
      return parse_quant_args(
          Json::parse(
              R"({"num_bits":8,"type":"int","strategy":"token","symmetric":true,"dynamic":true})"),
          "int8 per-token inputs");
    case IntWeightInputs::kFp8Token:
      return parse_quant_args(
          Json::parse(
              R"({"num_bits":8,"type":"float","strategy":"token","symmetric":true,"dynamic":true})"),
          "fp8 per-token inputs");
  }
  return std::nullopt;
}

IntWeightInputs int_weight_inputs_of(const QuantArgs& a, const std::string& where) {
  // vLLM's CompressedTensorsW4A8Int / W4A8Fp8 and SGLang read symmetric dynamic per-token 8-bit
  // inputs only; static or asymmetric ones have no engine kernel to compare against.
  if (a.num_bits != 8 || a.strategy != QuantStrategy::kToken ||
      a.dynamic != DynamicMode::kDynamic || !a.symmetric)
    throw Error(where,
                "integer weights with input activations need symmetric dynamic per-token "
                "8-bit inputs (compressed-tensors W4A8 / W4AFP8), got " +
                    describe(a));
  return a.type == QuantType::kInt ? IntWeightInputs::kInt8Token : IntWeightInputs::kFp8Token;
}

SchemeId packed_int_scheme(const QuantArgs& w, const std::string& where) {
  if (w.type != QuantType::kInt)
    throw Error(where, "pack-quantized integer weights need type int, got " + describe(w));
  if (w.num_bits < 2 || w.num_bits > 8)
    throw Error(where, "pack-quantized integer weights need num_bits 2..8, got " +
                           std::to_string(w.num_bits));
  if (w.is_dynamic()) throw Error(where, "dynamic weight quantization is not a checkpoint format");
  IntWeightPoint p;
  p.bits = w.num_bits;
  p.symmetric = w.symmetric;
  switch (w.strategy) {
    case QuantStrategy::kGroup:
      p.group = w.effective_group_size();
      if (p.group <= 0 || p.group > kMaxGroupSize)
        throw Error(where, "group_size must be in [1, " + std::to_string(kMaxGroupSize) +
                               "], got " + std::to_string(p.group));
      break;
    case QuantStrategy::kChannel:
      p.group = IntWeightPoint::kChannel;
      break;
    case QuantStrategy::kTensor:
      p.group = IntWeightPoint::kTensor;
      break;
    case QuantStrategy::kBlock:
    case QuantStrategy::kToken:
    case QuantStrategy::kTensorGroup:
    case QuantStrategy::kAttnHead:
      throw Error(where,
                  "pack-quantized integer weights need strategy group, channel or tensor, "
                  "got " +
                      std::string(to_string(w.strategy)));
  }
  p.actorder = w.actorder == ActOrder::kGroup;
  if (p.actorder && w.strategy != QuantStrategy::kGroup)
    throw Error(where,
                "actorder 'group' needs strategy group, got " + std::string(to_string(w.strategy)));
  return SchemeId{SchemeKind::kPackedInt, 0, p};
}

QuantArgs packed_int_args(const IntWeightPoint& p) {
  Json j = {{"num_bits", p.bits}, {"type", "int"}, {"symmetric", p.symmetric}, {"dynamic", false}};
  if (p.group > 0) {
    j["strategy"] = "group";
    j["group_size"] = p.group;
  } else {
    j["strategy"] = p.group == IntWeightPoint::kChannel ? "channel" : "tensor";
  }
  if (p.actorder) j["actorder"] = "group";
  return parse_quant_args(j, "the weights of " + to_string(SchemeId{SchemeKind::kPackedInt, 0, p}));
}

SchemeId w8a8_int8_scheme(const QuantArgs& w, const QuantArgs& a, const std::string& where) {
  if (w.type != QuantType::kInt || w.num_bits != 8 || a.type != QuantType::kInt || a.num_bits != 8)
    throw Error(where, "INT8 W8A8 needs int 8-bit weights and inputs, got weights " + describe(w) +
                           ", inputs " + describe(a));
  if (w.is_dynamic()) throw Error(where, "dynamic weight quantization is not a checkpoint format");
  if (!w.symmetric)
    throw Error(where,
                "INT8 W8A8 needs symmetric weights (no engine reads int8 weight zero "
                "points), got " +
                    describe(w));
  Int8ActPoint p;
  if (w.strategy == QuantStrategy::kTensor)
    p.tensor_weights = true;
  else if (w.strategy != QuantStrategy::kChannel)
    throw Error(where, "INT8 W8A8 needs channel or tensor weight scales, got " +
                           std::string(to_string(w.strategy)));
  if (a.strategy == QuantStrategy::kToken && a.dynamic == DynamicMode::kDynamic) {
    if (!a.symmetric)
      throw Error(where,
                  "INT8 W8A8 with asymmetric dynamic per-token inputs is not implemented "
                  "(compressed-tensors' presets and vLLM's kernels are symmetric there)");
  } else if (a.strategy == QuantStrategy::kTensor && !a.is_dynamic()) {
    p.static_inputs = true;
    p.symmetric_inputs = a.symmetric;
  } else {
    throw Error(
        where, "INT8 W8A8 needs dynamic per-token or static per-tensor inputs, got " + describe(a));
  }
  return SchemeId{.kind = SchemeKind::kW8A8Int8, .int8_act = p};
}

QuantArgs w8a8_int8_weight_args(const Int8ActPoint& p) {
  return parse_quant_args(
      Json{{"num_bits", 8},
           {"type", "int"},
           {"symmetric", true},
           {"dynamic", false},
           {"strategy", p.tensor_weights ? "tensor" : "channel"}},
      "the weights of " + to_string(SchemeId{.kind = SchemeKind::kW8A8Int8, .int8_act = p}));
}

QuantArgs w8a8_int8_input_args(const Int8ActPoint& p) {
  Json j = {{"num_bits", 8}, {"type", "int"}};
  if (p.static_inputs) {
    j["strategy"] = "tensor";
    j["dynamic"] = false;
    j["symmetric"] = p.symmetric_inputs;
  } else {
    j["strategy"] = "token";
    j["dynamic"] = true;
    j["symmetric"] = true;
  }
  return parse_quant_args(
      j, "the inputs of " + to_string(SchemeId{.kind = SchemeKind::kW8A8Int8, .int8_act = p}));
}

namespace {

// "ct-w8a8-int8[-wtensor]-<dyn|static>[-asym]" (already lower-cased).
std::optional<SchemeId> parse_w8a8_int8(const std::string& s, std::string_view id) {
  constexpr std::string_view kPrefix = "ct-w8a8-int8-";
  if (s.rfind(kPrefix, 0) != 0) return std::nullopt;
  const std::string usage =
      "expected ct-w8a8-int8[-wtensor]-<dyn|static>[-asym] (asym: static only)";
  std::string rest = s.substr(kPrefix.size());
  Int8ActPoint p;
  if (rest.rfind("wtensor-", 0) == 0) {
    p.tensor_weights = true;
    rest = rest.substr(8);
  }
  if (rest == "dyn") {
  } else if (rest == "static") {
    p.static_inputs = true;
  } else if (rest == "static-asym") {
    p.static_inputs = true;
    p.symmetric_inputs = false;
  } else {
    throw Error("scheme '" + std::string(id) + "'", usage);
  }
  return SchemeId{.kind = SchemeKind::kW8A8Int8, .int8_act = p};
}

}  // namespace

SchemeId parse_scheme_id(std::string_view id) {
  const std::string s = lower(id);
  if (s == "w4a16-g32") return SchemeId{SchemeKind::kPackedInt, 0, kW4A16G32Point};
  if (auto p = parse_w8a8_int8(s, id)) return *p;
  if (s == "kv-fp8-head") return SchemeId{.kind = SchemeKind::kKvFp8, .kv_per_head = true};
  for (SchemeKind k : {SchemeKind::kNvfp4, SchemeKind::kMxfp4, SchemeKind::kMxfp8})
    if (s == std::string(scheme_pattern(k)) + "a16")
      return SchemeId{.kind = k, .weight_only = true};
  for (SchemeKind k : {SchemeKind::kFp8Tensor, SchemeKind::kFp8Channel, SchemeKind::kFp8Block})
    if (s == std::string(scheme_pattern(k)) + "-a16")
      return SchemeId{.kind = k, .weight_only = true};
  if (auto p = parse_packed_int(s, id)) return *p;
  for (const SchemePreset& p : scheme_presets())
    if (lower(p.name) == s) {
      if (!p.scheme)
        throw Error("scheme '" + std::string(id) + "'",
                    p.producer + " preset " + p.name + " (" + p.args + "): " + p.why);
      return *p.scheme;
    }
  for (SchemeKind k : kAllSchemeKinds)
    if (k != SchemeKind::kW8A16Group && k != SchemeKind::kPackedInt && scheme_pattern(k) == s)
      return SchemeId{k, 0};
  if (s.rfind(kW8A16GroupPrefix, 0) == 0) {
    const std::string digits = s.substr(kW8A16GroupPrefix.size());
    if (all_digits(digits, 7)) {
      const int64_t g = std::stoll(digits);
      if (g <= kMaxGroupSize) return SchemeId{SchemeKind::kW8A16Group, g};
    }
    throw Error("scheme '" + std::string(id) + "'", "w8a16-g<N> needs a group size N in [1, " +
                                                        std::to_string(kMaxGroupSize) +
                                                        "] without leading zeros");
  }
  // compressed-tensors' int weight-only points are spelled with the producer first (w8a16-ch is
  // msModelSlim's): say so for the spelling without it.
  std::string hint;
  if (s.size() > 5 && s[0] == 'w' && s.compare(2, 3, "a16") == 0) try {
      hint = "; compressed-tensors integer weights are spelled " +
             to_string(*parse_packed_int("ct-" + s, "ct-" + s));
    } catch (const Error&) {
    }
  throw Error("scheme '" + std::string(id) + "'",
              "unknown scheme id (valid: " + valid_scheme_ids() + ")" + hint);
}

std::string to_string(const SchemeId& s) {
  if (s.kind == SchemeKind::kW8A16Group) return "w8a16-g" + std::to_string(s.group_size);
  if (s.kind == SchemeKind::kPackedInt) {
    const IntWeightPoint& p = s.int_weights;
    if (p == kW4A16G32Point && s.int_inputs == IntWeightInputs::kNone) return "w4a16-g32";
    const char* act = s.int_inputs == IntWeightInputs::kInt8Token  ? "a8-"
                      : s.int_inputs == IntWeightInputs::kFp8Token ? "afp8-"
                                                                   : "a16-";
    std::string out = "ct-w" + std::to_string(p.bits) + act;
    out += p.group > 0 ? "g" + std::to_string(p.group)
                       : (p.group == IntWeightPoint::kChannel ? "ch" : "tensor");
    if (!p.symmetric) out += "-asym";
    if (p.actorder) out += "-actorder";
    return out;
  }
  if (s.kind == SchemeKind::kW8A8Int8 && s.int8_act != Int8ActPoint{}) {
    const Int8ActPoint& p = s.int8_act;
    std::string out = "ct-w8a8-int8";
    if (p.tensor_weights) out += "-wtensor";
    out += p.static_inputs ? "-static" : "-dyn";
    if (p.static_inputs && !p.symmetric_inputs) out += "-asym";
    return out;
  }
  // fp8-channel-a16 (a dash: "fp8-channela16" would read as one word); nvfp4a16 as
  // compressed-tensors spells NVFP4A16.
  if (s.weight_only && (s.kind == SchemeKind::kFp8Tensor || s.kind == SchemeKind::kFp8Channel ||
                        s.kind == SchemeKind::kFp8Block))
    return std::string(scheme_pattern(s.kind)) + "-a16";
  if (s.weight_only) return std::string(scheme_pattern(s.kind)) + "a16";
  if (s.kv_per_head) return "kv-fp8-head";
  return std::string(scheme_pattern(s.kind));
}

const std::vector<SchemeInfo>& all_schemes() {
  static const std::vector<SchemeInfo> table = [] {
    std::vector<SchemeInfo> t;
    for (SchemeKind k : kAllSchemeKinds)
      t.push_back(make_info(k));
    return t;
  }();
  return table;
}

const SchemeInfo& scheme_info(SchemeKind k) {
  for (const SchemeInfo& s : all_schemes())
    if (s.kind == k) return s;
  throw Error("scheme registry", "no entry for " + std::string(scheme_pattern(k)));
}

Json to_json(const SchemeInfo& s) {
  Json producers = Json::array();
  for (Producer p : s.producers)
    producers.push_back(std::string(to_string(p)));
  Json params = Json::array();
  for (const auto& p : s.parameters)
    params.push_back({{"name", p.name}, {"value", p.value}, {"description", p.description}});
  Json tensors = Json::array();
  for (const auto& t : s.tensors) {
    Json tj = {{"name", t.name}, {"dtype", t.dtype}, {"shape", t.shape}};
    if (!t.producer.empty()) tj["producer"] = t.producer;
    if (!t.note.empty()) tj["note"] = t.note;
    tensors.push_back(std::move(tj));
  }
  return {{"id", s.id},
          {"family", std::string(to_string(s.family))},
          {"producers", producers},
          {"description", s.description},
          {"parameters", params},
          {"constraints", s.constraints},
          {"tensors", tensors},
          {"spec", s.spec}};
}

}  // namespace qparity
