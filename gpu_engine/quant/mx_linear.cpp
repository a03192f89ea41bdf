#include "gpu_engine/quant/mx_linear.h"

#include <algorithm>

#include "core/codecs/float_format.h"
#include "core/error.h"
#include "gpu_engine/quant/upload_util.h"
#include "reference_cpu/quant/mx_scale.h"

namespace qparity::gpu {

MxLinearMethod::MxLinearMethod(const reference::LinearMethod& host, int64_t expert)
    : GpuLinearMethod(method_prefix(host, expert), host.config().scheme,
                      host.shape().out_features(), host.shape().in_features) {
  const auto* m = dynamic_cast<const reference::MxLinearMethodBase*>(&host);
  const std::string& where = prefix();
  if (!m) throw Error(where, "not an MX linear layer");
  const int64_t e = method_expert(host, expert);
  if (!m->quantizes_activations())
    throw Error(where, "MX weight-only (MXFP8A16 / MXFP4A16) is not on the GPU yet");
  const reference::MxScaleRules& r = m->rules();
  if (r.exponent != reference::MxExponentRule::kBump || r.byte_min != 0 || r.byte_max != 254 ||
      r.element_round != reference::IntRound::kHalfEven ||
      (r.amax_arith != reference::Arith::kBf16 && r.amax_arith != reference::Arith::kFp32))
    throw Error(where, to_string(scheme()) + " in dialect " +
                           std::string(qparity::to_string(host.config().dialect)) +
                           ": the GPU's MX activation rule is vllm / sglang's (the >= 1.75 bump, "
                           "bytes [0, 254], half-even elements); run with --dialect vllm or sglang");
  if (in_features() % 32 != 0)
    throw Error(where, "in_features " + std::to_string(in_features()) + " must be a multiple of 32");
  ws_.k = in_features();
  ws_.n = out_features();
  ws_.scale_cols = in_features() / 32;
  ws_.extra_bytes = sizeof(float);
  quant_.mode = Fp8ActMode::kDynamicGroup;
  quant_.group = 32;
  quant_.mx_bump = true;
  quant_.mx_e2m1 = m->element() == reference::MxElem::kE2M1;
  // Weight: element values (e4m3fn, or e2m1 on the 0.5 lattice: a subset of e4m3fn) -> e4m3fn
  // bytes; block scales 2^E as fp32.
  const reference::QuantizedMatrix& w = m->processed_weight(e);
  if (w.rows != out_features() || w.cols != in_features() || w.block_rows != 1 ||
      w.block_cols != 32)
    throw Error(where, "processed MX weight is not [N, K] in [1, 32] blocks");
  std::vector<uint8_t> bytes(static_cast<size_t>(w.rows * w.cols));
  for (int64_t r2 = 0; r2 < w.rows; ++r2)
    for (int64_t c = 0; c < w.cols; ++c) {
      const double v = static_cast<double>(w.code(r2, c)) * w.lattice;
      const uint8_t b = codec::double_to_e4m3fn(v, codec::Overflow::kSaturate);
      if (codec::e4m3fn_to_double(b) != v)
        throw Error(where, "weight element (" + std::to_string(r2) + ", " + std::to_string(c) +
                               ") is not an e4m3fn value");
      bytes[static_cast<size_t>(r2 * w.cols + c)] = b;
    }
  codes_ = DeviceBuffer<uint8_t>(bytes);
  scales_ = DeviceBuffer<float>(exact_f32(w.scales.data, where + ".weight_scale"));
  const std::vector<double>& b = m->processed_bias(e);
  if (std::any_of(b.begin(), b.end(), [](double v) { return v != 0.0; }))
    bias_ = DeviceBuffer<float>(exact_f32(b, where + ".bias"));
}

size_t MxLinearMethod::workspace_bytes(int64_t max_tokens) const {
  return ws_.bytes(max_tokens);
}

void MxLinearMethod::apply(const __nv_bfloat16* x, __nv_bfloat16* y, int64_t t,
                           cudaStream_t stream, void* workspace) const {
  if (!workspace) throw Error(prefix(), "MX linears need the engine's workspace");
  auto* base = static_cast<uint8_t*>(workspace);
  QuantizeFp8Params q = quant_;
  q.x = x;
  q.q = base;
  q.scales = ActivationWorkspace::at<float>(workspace, ws_.scales_offset(t));
  q.tensor_amax = ActivationWorkspace::at<float>(workspace, ws_.extra_offset(t));
  q.m = t;
  q.k = in_features();
  launch_quantize_fp8(q, stream);
  Fp8GemmParams g;
  g.a = base;
  g.a_scales = q.scales;
  g.a_group = 32;
  g.b = codes_.get();
  g.b_scales = scales_.get();
  g.b_block_rows = 1;
  g.b_block_cols = 32;
  g.bias = bias_.get();
  g.y = y;
  g.m = t;
  g.n = out_features();
  g.k = in_features();
  launch_fp8_scaled_gemm(g, stream);
}

GpuLinearMethod::ActivationCodes MxLinearMethod::activation_codes(const void* workspace,
                                                                  int64_t t) const {
  ActivationCodes c;
  c.kind = ActivationCodes::Kind::kFp8E4m3;
  c.values = workspace;
  c.scales = ActivationWorkspace::at<float>(workspace, ws_.scales_offset(t));
  c.scale_cols = ws_.scale_cols;
  return c;
}

size_t MxLinearMethod::device_bytes() const {
  return codes_.bytes() + scales_.bytes() + bias_.bytes();
}

}  // namespace qparity::gpu
