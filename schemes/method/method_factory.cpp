#include "schemes/method/method_factory.h"

#include "core/error.h"
#include "schemes/fp4/mxfp4.h"
#include "schemes/fp4/nvfp4.h"
#include "schemes/fp8/fp8_block.h"
#include "schemes/fp8/fp8_channel.h"
#include "schemes/fp8/fp8_common.h"
#include "schemes/fp8/fp8_tensor.h"
#include "schemes/fp8/mxfp8.h"
#include "schemes/int/mxint4.h"
#include "schemes/int/pack_quantized_int.h"
#include "schemes/int/w4a8_dynamic.h"
#include "schemes/int/w8a16.h"
#include "schemes/int/w8a8_int8_dynamic.h"
#include "schemes/int/w8a8_static.h"
#include "schemes/kv/kv_fp8.h"
#include "schemes/kv/kv_int8.h"
#include "schemes/method/unquantized.h"

namespace qparity::reference {

namespace {

std::string default_format(SchemeKind k) {
  switch (k) {
    case SchemeKind::kBf16:
    case SchemeKind::kKvBf16:
    case SchemeKind::kSmoothQuant:
      return "dense";
    case SchemeKind::kW8A16Channel:
    case SchemeKind::kW8A16Group:
    case SchemeKind::kW8A8Static:
    case SchemeKind::kW8A8S:
    case SchemeKind::kW4A8Dyn:
    case SchemeKind::kKvInt8:
      return "msmodelslim";
    case SchemeKind::kW8A8Int8:
      return "int-quantized";
    case SchemeKind::kPackedInt:
    case SchemeKind::kMxint4:
      return "pack-quantized";
    case SchemeKind::kFp8Tensor:
    case SchemeKind::kFp8Channel:
    case SchemeKind::kFp8Block:
    case SchemeKind::kKvFp8:
      return "float-quantized";
    case SchemeKind::kNvfp4:
      return "nvfp4-pack-quantized";
    case SchemeKind::kMxfp4:
      return "mxfp4-pack-quantized";
    case SchemeKind::kMxfp8:
      return "mxfp8-quantized";
  }
  return "dense";
}

}  // namespace

MethodConfig method_config(const PlanEntry& entry, Dialect dialect) {
  MethodConfig c;
  c.scheme = entry.scheme.value_or(SchemeId{});
  c.dialect = dialect;
  c.weights = entry.weights;
  c.input_activations = entry.input_activations;
  c.format = entry.format;
  c.source_type = entry.source_type;
  if (entry.role == ModuleRole::kKvCache) c.weights = entry.kv_cache;
  // An override (--scheme) has no checkpoint of its own: the files are the ones this dialect's
  // producer would write (quantize_linear), so their layout is the scheme's default for it.
  if (entry.format == "override" && entry.scheme)
    c.format = method_config(*entry.scheme, dialect).format;
  return c;
}

MethodConfig method_config(const SchemeId& scheme, Dialect dialect) {
  const ImpliedArgs a = implied_args(scheme);
  MethodConfig c;
  c.scheme = scheme;
  c.dialect = dialect;
  c.weights = scheme_family(scheme.kind) == SchemeFamily::kKvCache ? a.kv_cache : a.weights;
  c.input_activations = a.input_activations;
  c.format = default_format(scheme.kind);
  // WnA8 with int8 inputs: compressed-tensors infers int-quantized (its IntQuantizationCompressor
  // matches before pack-quantized). W4AFP8 stays pack-quantized, as llm-compressor's W4AFP8
  // example saves it "for vLLM compatibility" (CompressedTensorsW4A8Fp8 reads weight_packed).
  if (scheme.kind == SchemeKind::kPackedInt && scheme.int_inputs == IntWeightInputs::kInt8Token)
    c.format = "int-quantized";
  // A producer dialect also picks that producer's file layout where it has one (msModelSlim
  // W8A8_DYNAMIC and WFP8AFP8_DYNAMIC use msModelSlim names), as quantize_<scheme> does.
  if (dialect == Dialect::kMsModelSlim)
    for (Producer p : scheme_info(scheme.kind).producers)
      if (p == Producer::kMsModelSlim) c.format = "msmodelslim";
  return c;
}

std::unique_ptr<LinearMethod> make_linear_method(LinearShape shape, MethodConfig config) {
  switch (config.scheme.kind) {
    case SchemeKind::kBf16:
      return std::make_unique<UnquantizedLinearMethod>(std::move(shape), std::move(config));
    case SchemeKind::kW8A16Channel:
    case SchemeKind::kW8A16Group:
      return make_w8a16_method(std::move(shape), std::move(config));
    case SchemeKind::kW8A8Static:
    case SchemeKind::kW8A8S:
      return make_w8a8_static_method(std::move(shape), std::move(config));
    case SchemeKind::kW8A8Int8:
      return make_w8a8_int8_dynamic_method(std::move(shape), std::move(config));
    case SchemeKind::kW4A8Dyn:
      return make_w4a8_dynamic_method(std::move(shape), std::move(config));
    case SchemeKind::kPackedInt:
      return make_pack_quantized_method(std::move(shape), std::move(config));
    case SchemeKind::kMxint4:
      return make_mxint4_method(std::move(shape), std::move(config));
    case SchemeKind::kFp8Tensor:
      return make_fp8_tensor_method(std::move(shape), std::move(config));
    case SchemeKind::kFp8Channel:
      return make_fp8_channel_method(std::move(shape), std::move(config));
    case SchemeKind::kFp8Block:
      return make_fp8_block_method(std::move(shape), std::move(config));
    case SchemeKind::kNvfp4:
      return make_nvfp4_method(std::move(shape), std::move(config));
    case SchemeKind::kMxfp4:
      return make_mxfp4_method(std::move(shape), std::move(config));
    case SchemeKind::kMxfp8:
      return make_mxfp8_method(std::move(shape), std::move(config));
    case SchemeKind::kKvBf16:
    case SchemeKind::kKvInt8:
    case SchemeKind::kKvFp8:
    case SchemeKind::kSmoothQuant:
      break;
  }
  throw Error(shape.prefix, "scheme " + to_string(config.scheme) +
                                " is not a linear-layer scheme (it applies to " +
                                std::string(to_string(scheme_family(config.scheme.kind))) + ")");
}

std::unique_ptr<KvCacheMethod> make_kv_cache_method(KvShape shape, MethodConfig config) {
  switch (config.scheme.kind) {
    case SchemeKind::kKvBf16:
      return std::make_unique<UnquantizedKvCacheMethod>(std::move(shape), std::move(config));
    case SchemeKind::kKvInt8:
      return make_kv_int8_method(std::move(shape), std::move(config));
    case SchemeKind::kKvFp8:
      return make_kv_fp8_method(std::move(shape), std::move(config));
    case SchemeKind::kBf16:
    case SchemeKind::kW8A16Channel:
    case SchemeKind::kW8A16Group:
    case SchemeKind::kW8A8Static:
    case SchemeKind::kW8A8S:
    case SchemeKind::kW8A8Int8:
    case SchemeKind::kW4A8Dyn:
    case SchemeKind::kPackedInt:
    case SchemeKind::kMxint4:
    case SchemeKind::kFp8Tensor:
    case SchemeKind::kFp8Channel:
    case SchemeKind::kFp8Block:
    case SchemeKind::kNvfp4:
    case SchemeKind::kMxfp4:
    case SchemeKind::kMxfp8:
    case SchemeKind::kSmoothQuant:
      break;
  }
  throw Error(shape.prefix, "scheme " + to_string(config.scheme) + " is not a KV-cache scheme");
}

TensorMap quantize_linear(const SchemeId& scheme, QuantizeRequest request) {
  const MethodConfig defaults = method_config(scheme, request.dialect);
  if (!request.weights) request.weights = defaults.weights;
  if (!request.input_activations) request.input_activations = defaults.input_activations;
  // A weight-only point has no input scale, whatever statistics came with the request (fp8-tensor's
  // writer would otherwise take them for static inputs).
  if (scheme.weight_only) request.activations.reset();
  if (scheme.kind == SchemeKind::kW8A16Group && request.group_size == 0)
    request.group_size = scheme.group_size;
  if ((scheme.kind == SchemeKind::kFp8Tensor || scheme.kind == SchemeKind::kFp8Block) &&
      request.format == "fp8" && !scheme.weight_only) {
    // quant_method fp8 (HF FineGrainedFP8 / vLLM Fp8Config): F32 scales, weight_scale_inv for
    // the 128x128 blocks.
    request.format.clear();
    return scheme.kind == SchemeKind::kFp8Block
               ? quantize_fp8_block(request, {Fp8File::kFp8Config})
               : quantize_fp8_tensor(request, {Fp8File::kFp8Config});
  }
  if (scheme.kind == SchemeKind::kNvfp4 && request.format == "modelopt") {
    request.format.clear();
    return quantize_nvfp4_modelopt(request);
  }
  if (scheme.kind == SchemeKind::kFp8Tensor && request.format == "modelopt") {
    // ModelOpt's FP8: the tensors and F32 scales of quant_method fp8's per-tensor layout, the
    // scales 0-dim (torch.tensor(amax / 448)).
    request.format.clear();
    TensorMap t = quantize_fp8_tensor(request, {Fp8File::kFp8Config});
    for (const char* n : {"weight_scale", "input_scale"})
      if (auto it = t.find(n); it != t.end()) it->second.shape = {};
    return t;
  }
  if (scheme.kind == SchemeKind::kFp8Block && request.format == "modelopt" && scheme.weight_only) {
    // ModelOpt's FP8_PB_WO: F32 weight_scale [N/128, 1, K/128, 1] per 128x128 tile (the F32
    // tile scales of quant_method fp8's layout, under ModelOpt's name and shape).
    request.format.clear();
    TensorMap t = quantize_fp8_block(request, {Fp8File::kFp8Config});
    HostTensor sc = std::move(t.at("weight_scale_inv"));
    t.erase("weight_scale_inv");
    sc.shape = {sc.shape.at(0), 1, sc.shape.at(1), 1};
    t["weight_scale"] = std::move(sc);
    return t;
  }
  if (scheme.kind == SchemeKind::kMxfp8 && request.format == "modelopt" && !scheme.weight_only) {
    // ModelOpt's MXFP8: the same e4m3 weight and U8 E8M0 weight_scale [N, K/32].
    request.format.clear();
    return quantize_linear(scheme, std::move(request));
  }
  if (scheme.kind == SchemeKind::kFp8Channel && request.format == "modelopt" &&
      !scheme.weight_only) {
    // ModelOpt's FP8_PER_CHANNEL_PER_TOKEN: F32 weight_scale [N] (the F32 [N, 1] scales of the
    // msModelSlim file, its all-zero weight_offset dropped).
    request.format.clear();
    TensorMap t = quantize_fp8_channel(request, {Fp8File::kMsModelSlim});
    t.erase("weight_offset");
    t.erase("bias");  // in the model dtype, as ModelOpt exports it (msModelSlim's is F32)
    add_bias(t, request, request.model_dtype);
    HostTensor& s = t.at("weight_scale");
    s.shape = {s.shape.at(0)};
    return t;
  }
  if (!request.format.empty() && request.format != defaults.format &&
      scheme.kind != SchemeKind::kPackedInt)
    throw Error(request.where, "scheme " + to_string(scheme) + " is written as " + defaults.format +
                                   ", not " + request.format);
  if (!request.format.empty() &&
      int_storage_format(int_code_storage(request.format)) != request.format &&
      request.format != "naive-quantized")
    throw Error(request.where, "'" + request.format +
                                   "' is not an integer weight layout (pack-quantized, "
                                   "int-quantized, naive-quantized, gptq, gptq_v2, awq)");
  switch (scheme.kind) {
    case SchemeKind::kBf16:
      return quantize_unquantized(request.weight, request.model_dtype,
                                  request.bias ? &*request.bias : nullptr);
    case SchemeKind::kW8A16Channel:
    case SchemeKind::kW8A16Group:
      return quantize_w8a16(request);
    case SchemeKind::kW8A8Static:
    case SchemeKind::kW8A8S:
      return quantize_w8a8_static(request);
    case SchemeKind::kW8A8Int8:
      return quantize_w8a8_int8_dynamic(request);
    case SchemeKind::kW4A8Dyn:
      return quantize_w4a8_dynamic(request);
    case SchemeKind::kPackedInt:
      return quantize_pack_quantized(
          request, codec::CtPackLayout::kDenseStream,
          int_code_storage(request.format.empty() ? defaults.format : request.format));
    case SchemeKind::kMxint4:
      return quantize_mxint4(request);
    case SchemeKind::kFp8Tensor:
      return quantize_fp8_tensor(request, {fp8_file_of(defaults)});
    case SchemeKind::kFp8Channel:
      return quantize_fp8_channel(request, {fp8_file_of(defaults)});
    case SchemeKind::kFp8Block:
      return quantize_fp8_block(request, {fp8_file_of(defaults)});
    case SchemeKind::kNvfp4:
      return quantize_nvfp4(request);
    case SchemeKind::kMxfp4:
      return quantize_mxfp4(request);
    case SchemeKind::kMxfp8:
      return quantize_mxfp8(request);
    case SchemeKind::kKvBf16:
    case SchemeKind::kKvInt8:
    case SchemeKind::kKvFp8:
    case SchemeKind::kSmoothQuant:
      break;
  }
  throw Error(request.where, "scheme " + to_string(scheme) +
                                 " does not quantize a linear weight (it applies to " +
                                 std::string(to_string(scheme_family(scheme.kind))) + ")");
}

Matrix dequantize_linear(const MethodConfig& config, const TensorMap& tensors, int64_t out_features,
                         int64_t in_features, DType model_dtype) {
  auto m = make_linear_method(
      LinearShape::dense("", out_features, in_features, model_dtype, tensors.count("bias") > 0),
      config);
  m->load_all(tensors);
  m->process_weights_after_loading();
  return m->dequantized_weight();
}

}  // namespace qparity::reference
