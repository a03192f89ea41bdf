#include "gpu_engine/quant/w8a8_static.h"

#include <climits>

#include "core/error.h"
#include "gpu_engine/quant/upload_util.h"
#include "schemes/int/w8a8_static.h"

namespace qparity::gpu {

W8A8StaticMethod::W8A8StaticMethod(const reference::LinearMethod& host)
    : GpuLinearMethod(host.shape().prefix, host.config().scheme, host.shape().out_features(),
                      host.shape().in_features) {
  ws_.k = in_features();
  ws_.n = out_features();
  ws_.int8_product = true;
  const std::string& where = prefix();
  const auto* m = dynamic_cast<const reference::W8A8StaticLinearMethod*>(&host);
  if (!m) throw Error(where, "not a w8a8-static layer");
  if (m->dialect() != Dialect::kVllm && m->dialect() != Dialect::kSglang)
    throw Error(where, to_string(scheme()) + " in dialect " +
                           std::string(qparity::to_string(m->dialect())) +
                           ": the GPU's activation quantization follows vllm or sglang bit for "
                           "bit; run with --dialect vllm or --dialect sglang");
  if (in_features() % 16 != 0)
    throw Error(where, "in_features " + std::to_string(in_features()) +
                           " must be a multiple of 16 for the GPU's int8 GEMM");
  const reference::ProcessedIntWeight w = processed_int_weight_of(host);
  const auto a = m->static_activation(0);
  if (a.arith != reference::Arith::kFp32)
    throw Error(where, "static activation arithmetic other than fp32 is not on the GPU");
  const std::vector<float> s = exact_f32({a.scale, a.divide ? 1.0 : a.factor, a.offset},
                                         where + ".input_scale / input_offset");
  quant_.scale = s[0];
  quant_.factor = a.divide ? 0.f : s[1];
  quant_.offset = s[2];
  quant_.divide = a.divide;
  codes_ = DeviceBuffer<int8_t>(w.stored);
  deq_scale_ = DeviceBuffer<float>(exact_f32(m->deq_scale(0), where + ".deq_scale"));
  std::vector<int32_t> qb;
  for (int64_t v : m->quant_bias(0)) {
    if (v < INT32_MIN || v > INT32_MAX) throw Error(where + ".quant_bias", "outside int32");
    qb.push_back(static_cast<int32_t>(v));
  }
  quant_bias_ = DeviceBuffer<int32_t>(qb);
}

size_t W8A8StaticMethod::workspace_bytes(int64_t max_tokens) const {
  return ws_.bytes(max_tokens);
}

void W8A8StaticMethod::apply(const __nv_bfloat16* x, __nv_bfloat16* y, int64_t t,
                             cudaStream_t stream, void* workspace) const {
  if (!workspace) throw Error(prefix(), "w8a8-static needs the engine's workspace");
  auto* codes = static_cast<int8_t*>(workspace);
  QuantizeInt8StaticParams q = quant_;
  q.x = x;
  q.q = codes;
  q.scales = ActivationWorkspace::at<float>(workspace, ws_.scales_offset(t));
  q.m = t;
  q.k = in_features();
  launch_quantize_int8_static(q, stream);
  Int8GemmParams g;
  g.a = codes;
  g.b = codes_.get();
  g.b_scales = deq_scale_.get();
  g.acc_bias = quant_bias_.get();
  g.y = y;
  g.m = t;
  g.n = out_features();
  g.k = in_features();
  int8_scaled_gemm(g, ActivationWorkspace::at<int32_t>(workspace, ws_.product_offset(t)), stream);
}

GpuLinearMethod::ActivationCodes W8A8StaticMethod::activation_codes(const void* workspace,
                                                                    int64_t t) const {
  ActivationCodes c;
  c.values = workspace;
  c.scales = ActivationWorkspace::at<float>(workspace, ws_.scales_offset(t));
  return c;
}

size_t W8A8StaticMethod::device_bytes() const {
  return codes_.bytes() + deq_scale_.bytes() + quant_bias_.bytes();
}

}  // namespace qparity::gpu
