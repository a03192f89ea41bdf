#include "gpu_engine/quant/w8a8_int8.h"

#include <algorithm>

#include "core/error.h"
#include "gpu_engine/quant/upload_util.h"
#include "schemes/int/w4a8_dynamic.h"
#include "schemes/int/w8a8_int8_dynamic.h"

namespace qparity::gpu {

namespace {

// The activation rule of a w8a8-int8-dyn layer, from its dialect.
Int8ActDialect int8_dynamic_rule(const reference::W8A8Int8DynamicLinearMethod& m,
                                 const std::string& where) {
  switch (m.dialect()) {
    case Dialect::kVllm:
      return Int8ActDialect::kVllm;
    case Dialect::kSglang:
      return Int8ActDialect::kSglang;
    case Dialect::kIdeal:
    case Dialect::kCompressedTensors:
    case Dialect::kMsModelSlim:
      break;
  }
  throw Error(where, "w8a8-int8-dyn in dialect " + std::string(to_string(m.dialect())) +
                         ": the GPU's activation quantization follows vllm or sglang bit for "
                         "bit; run with --dialect vllm or --dialect sglang");
}

}  // namespace

W8A8Int8Method::W8A8Int8Method(const reference::LinearMethod& host, int64_t expert)
    : GpuLinearMethod(method_prefix(host, expert), host.config().scheme,
                      host.shape().out_features(), host.shape().in_features) {
  ws_.k = in_features();
  ws_.n = out_features();
  ws_.int8_product = true;
  const std::string& where = prefix();
  if (const auto* m = dynamic_cast<const reference::W8A8Int8DynamicLinearMethod*>(&host)) {
    dialect_ = int8_dynamic_rule(*m, where);
    if (m->static_input()) {
      // Only vllm keeps static scales (sglang ignores them: static_input() is false there).
      if (dialect_ != Int8ActDialect::kVllm)
        throw Error(where,
                    "static per-tensor int8 inputs follow vLLM's kernels on the GPU; run "
                    "with --dialect vllm");
      static_input_ = true;
      const int64_t e = std::max<int64_t>(expert, 0);
      const std::vector<float> sf = exact_f32({m->input_scale(e)}, where + ".input_scale");
      static_.scale = sf[0];
      const int64_t z = m->input_zero_point(e);
      if (z < -128 || z > 127) throw Error(where + ".input_zero_point", "outside int8");
      input_zero_point_ = static_cast<int32_t>(z);
      if (m->input_symmetric()) {
        static_.divide = true;  // static_scaled_int8_quant_kernel: x / s
      } else {
        static_.factor = 1.0f / sf[0];  // the azp kernel's inv_s, fp32 (RN)
        static_.offset = static_cast<float>(z);
        static_.offset_after_round = true;
      }
    }
  } else if (dynamic_cast<const reference::W4A8DynamicLinearMethod*>(&host)) {
    // Every runtime of the format quantizes with npu_dynamic_quant; only the ideal dialect
    // (fp64 amax / 127) differs, and the GPU does not run fp64 activation scales.
    if (host.dialect() == Dialect::kIdeal)
      throw Error(where,
                  "w4a8-dyn in dialect ideal: the GPU's activation quantization is the NPU's "
                  "npu_dynamic_quant rule (every other dialect); run with --dialect vllm");
    dialect_ = Int8ActDialect::kNpu;
  } else {
    throw Error(where, "not a w8a8-int8-dyn or w4a8-dyn layer");
  }
  if (in_features() % 16 != 0)
    throw Error(where, "in_features " + std::to_string(in_features()) +
                           " must be a multiple of 16 for the GPU's int8 GEMM");
  const reference::ProcessedIntWeight w = processed_int_weight_of(host, expert);
  for (double z : w.zero)
    if (z != 0)
      throw Error(where, "int8 / int4 dynamic weights are symmetric; a zero point is not");
  codes_ = DeviceBuffer<int8_t>(w.stored);
  if (static_input_ && input_zero_point_ != 0) {
    // azp_adj: the exact int32 correction z * sum_k w[n, k] taken out of every row's sum.
    std::vector<int32_t> adjust(static_cast<size_t>(out_features()), 0);
    for (int64_t n = 0; n < out_features(); ++n) {
      int64_t sum = 0;
      for (int64_t k = 0; k < in_features(); ++k)
        sum += static_cast<int64_t>(w.stored[static_cast<size_t>(n * in_features() + k)]);
      adjust[static_cast<size_t>(n)] = static_cast<int32_t>(-input_zero_point_ * sum);
    }
    zero_point_adjust_ = DeviceBuffer<int32_t>(adjust);
  }
  scales_ = DeviceBuffer<float>(exact_f32(w.scale, where + ".weight_scale"));
  if (!w.bias.empty()) bias_ = DeviceBuffer<float>(exact_f32(w.bias, where + ".bias"));
}

size_t W8A8Int8Method::workspace_bytes(int64_t max_tokens) const {
  return ws_.bytes(max_tokens);
}

void W8A8Int8Method::apply(const __nv_bfloat16* x, __nv_bfloat16* y, int64_t t, cudaStream_t stream,
                           void* workspace) const {
  if (!workspace) throw Error(prefix(), "w8a8-int8-dyn needs the engine's workspace");
  auto* codes = static_cast<int8_t*>(workspace);
  auto* scales = ActivationWorkspace::at<float>(workspace, ws_.scales_offset(t));
  if (static_input_) {
    QuantizeInt8StaticParams q = static_;
    q.x = x;
    q.q = codes;
    q.scales = scales;
    q.m = t;
    q.k = in_features();
    launch_quantize_int8_static(q, stream);
  } else {
    launch_quantize_int8_per_token({x, codes, scales, t, in_features(), dialect_}, stream);
  }
  Int8GemmParams g;
  g.a = codes;
  g.a_scales = scales;
  g.b = codes_.get();
  g.b_scales = scales_.get();
  g.bias = bias_.get();
  g.acc_bias = zero_point_adjust_.get();
  g.y = y;
  g.m = t;
  g.n = out_features();
  g.k = in_features();
  int8_scaled_gemm(g, ActivationWorkspace::at<int32_t>(workspace, ws_.product_offset(t)), stream);
}

GpuLinearMethod::ActivationCodes W8A8Int8Method::activation_codes(const void* workspace,
                                                                  int64_t t) const {
  ActivationCodes c;
  c.kind = ActivationCodes::Kind::kInt8;
  c.values = workspace;
  c.scales = ActivationWorkspace::at<float>(workspace, ws_.scales_offset(t));
  c.scale_cols = 1;
  c.zero_point = static_input_ ? input_zero_point_ : 0;
  return c;
}

size_t W8A8Int8Method::device_bytes() const {
  return codes_.bytes() + scales_.bytes() + bias_.bytes() + zero_point_adjust_.bytes();
}

}  // namespace qparity::gpu
