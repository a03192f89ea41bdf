#include "gpu_engine/quant/mx_linear.h"

#include "core/error.h"
#include "gpu_engine/quant/upload_util.h"
#include "schemes/math/mx_scale.h"

namespace qparity::gpu {

MxLinearMethod::MxLinearMethod(const reference::LinearMethod& host, int64_t expert)
    : Fp8RuntimeMethod(method_prefix(host, expert), host.config().scheme,
                       host.shape().out_features(), host.shape().in_features) {
  const auto* m = dynamic_cast<const reference::MxLinearMethodBase*>(&host);
  const std::string& where = prefix();
  if (!m) throw Error(where, "not an MX linear layer");
  const int64_t e = method_expert(host, expert);
  const bool e2m1 = m->element() == reference::MxElem::kE2M1;
  if (!m->quantizes_activations() && !e2m1)
    throw Error(where, "MXFP8A16 (weight-only) is not on the GPU yet");
  const reference::MxScaleRules& r = m->rules();
  if (m->quantizes_activations() &&
      (r.exponent != reference::MxExponentRule::kBump || r.byte_min != 0 || r.byte_max != 254 ||
       r.element_round != reference::IntRound::kHalfEven ||
       (r.amax_arith != reference::Arith::kBf16 && r.amax_arith != reference::Arith::kFp32)))
    throw Error(where,
                to_string(scheme()) + " in dialect " +
                    std::string(qparity::to_string(host.config().dialect)) +
                    ": the GPU's MX activation rule is vllm / sglang's (the >= 1.75 bump, "
                    "bytes [0, 254], half-even elements); run with --dialect vllm or sglang");
  if (in_features() % 32 != 0)
    throw Error(where,
                "in_features " + std::to_string(in_features()) + " must be a multiple of 32");
  rt_.quant.mode = Fp8ActMode::kDynamicGroup;
  rt_.quant.group = 32;
  rt_.quant.mx_bump = true;
  rt_.quant.mx_e2m1 = e2m1;
  // Weight: element values (e4m3fn, or e2m1 on the 0.5 lattice: a subset of e4m3fn) -> e4m3fn
  // bytes; block scales 2^E as fp32.
  const reference::QuantizedMatrix& w = m->processed_weight(e);
  if (w.block_rows != 1 || w.block_cols != 32)
    throw Error(where, "processed MX weight is not in [1, 32] blocks");
  // e2m1 weights stay packed, two a byte, with their E8M0 bytes (kernels/fp4_gemm.h).
  rt_.packed = e2m1;
  rt_.weight_only = !m->quantizes_activations();  // MXFP4A16: bf16 inputs
  rt_.packed_scale = Fp4BlockScale::kE8m0Group32;
  rt_.upload(w, m->processed_bias(e), out_features(), in_features(), where);
}

}  // namespace qparity::gpu
