#include "gpu_engine/quant/packed_int_a8.h"

#include "core/error.h"
#include "gpu_engine/kernels/int_group_gemm.h"
#include "gpu_engine/quant/fp8_gemm_runtime.h"
#include "gpu_engine/quant/upload_util.h"
#include "schemes/fp8/fp8_common.h"

namespace qparity::gpu {

PackedIntA8Method::PackedIntA8Method(const reference::LinearMethod& host, int64_t expert)
    : GpuLinearMethod(method_prefix(host, expert), host.config().scheme,
                      host.shape().out_features(), host.shape().in_features) {
  const std::string& where = prefix();
  const std::string dialect(qparity::to_string(host.dialect()));
  if (host.dialect() != Dialect::kVllm && host.dialect() != Dialect::kSglang)
    throw Error(where, to_string(scheme()) + " in dialect " + dialect +
                           ": the GPU's per-token input quantization follows vllm or sglang bit "
                           "for bit; run with --dialect vllm or --dialect sglang");
  switch (scheme().int_inputs) {
    case IntWeightInputs::kInt8Token:
      int8_rule_ =
          host.dialect() == Dialect::kVllm ? Int8ActDialect::kVllm : Int8ActDialect::kSglang;
      break;
    case IntWeightInputs::kFp8Token:
      fp8_inputs_ = true;
      fp8_rule_.mode = Fp8ActMode::kDynamicToken;
      set_fp8_activation_rule(
          reference::fp8_rules(host.dialect())
              .activation_rule(reference::Fp8Act::kDynamicToken, host.shape().model_dtype),
          dialect, where, &fp8_rule_);
      break;
    case IntWeightInputs::kNone:
      throw Error(where, "weight-only integer layers run on weight_only_int.h");
  }
  dev_ = upload_int_weight(processed_int_weight_of(host, expert), out_features(), in_features(),
                           where, /*int8_zeros_only=*/true);
  ws_.k = in_features();
  ws_.n = out_features();
  ws_.scale_cols = 1;
}

size_t PackedIntA8Method::workspace_bytes(int64_t max_tokens) const {
  return ws_.bytes(max_tokens) +
         (dev_.perm.size() > 0 ? gathered_input_bytes(max_tokens, in_features()) : 0);
}

void PackedIntA8Method::apply(const __nv_bfloat16* x, __nv_bfloat16* y, int64_t t,
                              cudaStream_t stream, void* workspace) const {
  if (!workspace) throw Error(prefix(), to_string(scheme()) + " needs the engine's workspace");
  auto* codes = static_cast<uint8_t*>(workspace);
  auto* scales = ActivationWorkspace::at<float>(workspace, ws_.scales_offset(t));
  const __nv_bfloat16* xs =
      dev_.perm.size() > 0 ? gather_input(x, dev_.perm.get(), t, in_features(),
                                          ActivationWorkspace::at<uint8_t>(workspace, ws_.bytes(t)),
                                          prefix(), stream)
                           : x;
  if (fp8_inputs_) {
    QuantizeFp8Params q = fp8_rule_;
    q.x = xs;
    q.q = codes;
    q.scales = scales;
    q.m = t;
    q.k = in_features();
    launch_quantize_fp8(q, stream);
  } else {
    launch_quantize_int8_per_token(
        {xs, reinterpret_cast<int8_t*>(codes), scales, t, in_features(), int8_rule_}, stream);
  }
  IntGroupGemmParams g;
  g.a = codes;
  g.a_scales = scales;
  g.a_fp8 = fp8_inputs_;
  g.w = dev_.codes.get();
  g.scales = dev_.scales();
  g.scale_bf16 = dev_.scale_bf16;
  g.zeros_i8 = dev_.zeros_i8.get();
  g.bias = dev_.bias.get();
  g.y = y;
  g.m = t;
  g.n = out_features();
  g.k = in_features();
  g.group = dev_.group;
  g.bits = dev_.bits;
  launch_int_group_gemm(g, stream);
}

GpuLinearMethod::ActivationCodes PackedIntA8Method::activation_codes(const void* workspace,
                                                                     int64_t t) const {
  ActivationCodes c;
  c.kind = fp8_inputs_ ? ActivationCodes::Kind::kFp8E4m3 : ActivationCodes::Kind::kInt8;
  c.values = workspace;
  c.scales = ActivationWorkspace::at<float>(workspace, ws_.scales_offset(t));
  c.scale_cols = 1;
  return c;
}

size_t PackedIntA8Method::device_bytes() const {
  return dev_.bytes();
}

}  // namespace qparity::gpu
