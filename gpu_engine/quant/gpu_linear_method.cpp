#include "gpu_engine/quant/gpu_linear_method.h"

#include "core/error.h"
#include "gpu_engine/quant/fp8_linear.h"
#include "gpu_engine/quant/fp8_weight_only.h"
#include "gpu_engine/quant/mx_linear.h"
#include "gpu_engine/quant/nvfp4_linear.h"
#include "gpu_engine/quant/packed_int_a8.h"
#include "gpu_engine/quant/w8a8_int8.h"
#include "gpu_engine/quant/w8a8_static.h"
#include "gpu_engine/quant/weight_only_int.h"
#include "schemes/fp8/fp8_common.h"
#include "schemes/method/linear_method.h"

namespace qparity::gpu {

namespace {

// The points of compressed-tensors' integer weight space the GPU takes: int4 and int8 codes, in
// column order or act order (the inputs gathered first), with bf16 inputs (weight_only_int.h) or
// 8-bit per-token ones (packed_int_a8.h). The K-multiple rules (32 for int4, 16 for int8) are
// checked per layer when the method is built.
bool packed_int_runs(const SchemeId& s, std::string* why) {
  const IntWeightPoint& p = s.int_weights;
  if (p.bits != 4 && p.bits != 8) {
    if (why)
      *why = "int" + std::to_string(p.bits) +
             " weights: the GPU's integer-weight kernels take 4 or 8 bits";
    return false;
  }
  return true;
}

}  // namespace

bool gpu_supports_linear_scheme(const SchemeId& s, std::string* why) {
  const auto no = [&](const std::string& w) {
    if (why) *why = w;
    return false;
  };
  switch (s.kind) {
    case SchemeKind::kBf16:  // the engine's own bf16 paths (no GpuLinearMethod)
    case SchemeKind::kW8A16Channel:
    case SchemeKind::kW8A16Group:
    case SchemeKind::kW8A8Static:
    case SchemeKind::kW8A8S:
    case SchemeKind::kW4A8Dyn:  // int4 codes widened to int8 (quant/w8a8_int8.h)
    case SchemeKind::kMxfp4:
    case SchemeKind::kNvfp4:  // Hopper emulation (quant/nvfp4_linear.h)
      return true;
    case SchemeKind::kFp8Tensor:  // weight-only: quant/fp8_weight_only.h
    case SchemeKind::kFp8Channel:
    case SchemeKind::kFp8Block:
    case SchemeKind::kMxfp8:  // Hopper emulation (quant/mx_linear.h; MXFP8A16 weight-only)
      return true;
    case SchemeKind::kW8A8Int8:  // static inputs: vllm, sglang (quant/w8a8_int8.h)
      return true;
    case SchemeKind::kPackedInt:
      return packed_int_runs(s, why);
    case SchemeKind::kMxint4:
      return no("mxint4 is an expert-stack format (a dense linear in it is w4a16-g32)");
    case SchemeKind::kKvBf16:
    case SchemeKind::kKvInt8:
    case SchemeKind::kKvFp8:
    case SchemeKind::kSmoothQuant:
      return no("not a linear weight scheme");
  }
  return no("unknown scheme");
}

bool gpu_supports_expert_scheme(const SchemeId& s, std::string* why) {
  switch (s.kind) {
    case SchemeKind::kPackedInt:
      return packed_int_runs(s, why);
    case SchemeKind::kW8A16Channel:
    case SchemeKind::kW8A16Group:
    case SchemeKind::kMxint4:   // compressed-tensors int4 group-32 experts, bf16 scales
    case SchemeKind::kW4A8Dyn:  // on the host path, one int8 GEMM per expert
    case SchemeKind::kMxfp4:
    case SchemeKind::kNvfp4:
      return true;
    case SchemeKind::kFp8Tensor:
    case SchemeKind::kFp8Channel:
    case SchemeKind::kFp8Block:
    case SchemeKind::kMxfp8:
      return true;
    case SchemeKind::kW8A8Int8:
      return gpu_supports_linear_scheme(s, why);
    case SchemeKind::kW8A8Static:
    case SchemeKind::kW8A8S:
      if (why) *why = "static-activation int8 MoE experts are not on the GPU yet";
      return false;
    default: {
      std::string w;
      if (!gpu_supports_linear_scheme(s, &w)) {
        if (why) *why = w;
        return false;
      }
      if (why) *why = "the GPU has no expert method for this scheme";
      return false;
    }
  }
}

std::unique_ptr<GpuLinearMethod> make_gpu_linear_method(const reference::LinearMethod& host,
                                                        const GpuMethodOptions& options,
                                                        int64_t expert) {
  const SchemeId& s = host.config().scheme;
  std::string why;
  if (expert >= 0 ? !gpu_supports_expert_scheme(s, &why) : !gpu_supports_linear_scheme(s, &why))
    throw Error(host.shape().prefix, "scheme " + to_string(s) + ": " + why);
  if (!host.processed())
    throw Error(host.shape().prefix, "the reference method was not processed before the upload");
  switch (s.kind) {
    case SchemeKind::kPackedInt:
      if (s.int_inputs != IntWeightInputs::kNone)
        return std::make_unique<PackedIntA8Method>(host, expert);
      return std::make_unique<WeightOnlyIntMethod>(host, options, expert);
    case SchemeKind::kW8A16Channel:
    case SchemeKind::kW8A16Group:
    case SchemeKind::kMxint4:
      return std::make_unique<WeightOnlyIntMethod>(host, options, expert);
    case SchemeKind::kW8A8Static:
    case SchemeKind::kW8A8S:
      return std::make_unique<W8A8StaticMethod>(host);
    case SchemeKind::kW8A8Int8:
    case SchemeKind::kW4A8Dyn:
      return std::make_unique<W8A8Int8Method>(host, expert);
    case SchemeKind::kFp8Tensor:
    case SchemeKind::kFp8Channel:
    case SchemeKind::kFp8Block: {
      // By what the host method quantizes, not by the id: a dialect may quantize the inputs of
      // a weight-only id (vLLM on ModelOpt's FP8_PB_WO).
      const auto* f = dynamic_cast<const reference::Fp8LinearBase*>(&host);
      if (f ? f->activation_mode() == reference::Fp8Act::kNone : s.weight_only)
        return std::make_unique<Fp8WeightOnlyMethod>(host, expert);
      return std::make_unique<Fp8LinearMethod>(host, expert, options.fp8_tensor_cores);
    }
    case SchemeKind::kMxfp8:
      if (s.weight_only) return std::make_unique<Fp8WeightOnlyMethod>(host, expert);
      return std::make_unique<MxLinearMethod>(host, expert);
    case SchemeKind::kMxfp4:
      return std::make_unique<MxLinearMethod>(host, expert);
    case SchemeKind::kNvfp4:
      return std::make_unique<Nvfp4LinearMethod>(host, expert);
    case SchemeKind::kBf16:
      throw Error(host.shape().prefix, "bf16 layers run on the engine's own bf16 weights");
    case SchemeKind::kKvBf16:
    case SchemeKind::kKvInt8:
    case SchemeKind::kKvFp8:
    case SchemeKind::kSmoothQuant:
      break;
  }
  throw Error(host.shape().prefix, "scheme " + to_string(s) + " has no GPU method");
}

}  // namespace qparity::gpu
