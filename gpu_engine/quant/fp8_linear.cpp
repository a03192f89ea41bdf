#include "gpu_engine/quant/fp8_linear.h"

#include <algorithm>

#include "core/codecs/float_format.h"
#include "core/error.h"
#include "gpu_engine/quant/upload_util.h"
#include "reference_cpu/quant/fp8_common.h"

namespace qparity::gpu {

namespace {

const reference::Fp8LinearBase& as_fp8(const reference::LinearMethod& h) {
  const auto* m = dynamic_cast<const reference::Fp8LinearBase*>(&h);
  if (!m) throw Error(h.shape().prefix, "not an fp8 linear layer");
  return *m;
}

}  // namespace

Fp8LinearMethod::Fp8LinearMethod(const reference::LinearMethod& host, int64_t expert)
    : GpuLinearMethod(method_prefix(host, expert), host.config().scheme,
                      host.shape().out_features(), host.shape().in_features) {
  const auto& m = as_fp8(host);
  const std::string& where = prefix();
  // An expert's weight after the stack's processing (per-expert scales; fp8-tensor's w13 scale
  // unified across gate and up, each shard requantized with the max, as the dialect does it).
  const int64_t e = method_expert(host, expert);
  const std::string dialect(qparity::to_string(m.dialect()));
  if (m.dialect() != Dialect::kVllm && m.dialect() != Dialect::kSglang)
    throw Error(where, to_string(scheme()) + " in dialect " + dialect +
                           ": the GPU's activation quantization follows vllm or sglang bit for "
                           "bit; run with --dialect vllm or --dialect sglang");
  const reference::Fp8ScaleRule rule = m.activation_rule();
  if (rule.arith != reference::Arith::kFp32 || rule.ue8m0 || rule.zero_scale > 0)
    throw Error(where, "the fp8 activation rule of dialect " + dialect +
                           " (UE8M0 scales, or arithmetic other than fp32) is not on the GPU");
  switch (m.activation_mode()) {
    case reference::Fp8Act::kNone:
      throw Error(where, "fp8 weight-only (no activation quantization) is not on the GPU yet");
    case reference::Fp8Act::kStatic:
      quant_.mode = Fp8ActMode::kStatic;
      quant_.static_scale = exact_f32({m.static_input_scale()}, where + ".input_scale")[0];
      break;
    case reference::Fp8Act::kDynamicTensor:
      quant_.mode = Fp8ActMode::kDynamicTensor;
      break;
    case reference::Fp8Act::kDynamicToken:
      quant_.mode = Fp8ActMode::kDynamicToken;
      break;
    case reference::Fp8Act::kDynamicGroup:
      quant_.mode = Fp8ActMode::kDynamicGroup;
      quant_.group = reference::kFp8BlockSize;
      break;
  }
  ws_.k = in_features();
  ws_.n = out_features();
  ws_.scale_cols = fp8_act_scale_cols(quant_.mode, in_features(), quant_.group);
  ws_.extra_bytes = sizeof(float);
  quant_.multiply_reciprocal = rule.use == reference::ScaleUse::kMultiplyReciprocal;
  quant_.amax_floor = static_cast<float>(rule.amax_floor);
  quant_.min_scale = static_cast<float>(rule.min_scale);
  quant_.zero_saturates = rule.zero_saturates;
  if (in_features() % 16 != 0)
    throw Error(where, "in_features " + std::to_string(in_features()) +
                           " must be a multiple of 16 for the GPU's fp8 GEMM");
  // Weight: codes on the 2^-9 lattice -> e4m3fn bytes (exact: they are e4m3fn values).
  const reference::QuantizedMatrix& w = m.processed_weight(e);
  if (w.rows != out_features() || w.cols != in_features())
    throw Error(where, "processed fp8 weight has the wrong shape");
  std::vector<uint8_t> bytes(static_cast<size_t>(w.rows * w.cols));
  for (int64_t r = 0; r < w.rows; ++r)
    for (int64_t c = 0; c < w.cols; ++c) {
      const double v = static_cast<double>(w.code(r, c)) * w.lattice;
      const uint8_t b = codec::double_to_e4m3fn(v, codec::Overflow::kSaturate);
      if (codec::e4m3fn_to_double(b) != v)
        throw Error(where, "weight element (" + std::to_string(r) + ", " + std::to_string(c) +
                               ") is not an e4m3fn value");
      bytes[static_cast<size_t>(r * w.cols + c)] = b;
    }
  codes_ = DeviceBuffer<uint8_t>(bytes);
  b_block_rows_ = w.block_rows;
  b_block_cols_ = w.block_cols;
  if (b_block_cols_ < in_features() && b_block_cols_ % 16 != 0)
    throw Error(where, "weight scale blocks of " + std::to_string(b_block_cols_) +
                           " columns: the GPU's fp8 GEMM needs multiples of 16");
  scales_ = DeviceBuffer<float>(exact_f32(w.scales.data, where + ".weight_scale"));
  const std::vector<double>& b = m.processed_bias(0);
  if (std::any_of(b.begin(), b.end(), [](double v) { return v != 0.0; }))
    bias_ = DeviceBuffer<float>(exact_f32(b, where + ".bias"));
}

size_t Fp8LinearMethod::workspace_bytes(int64_t max_tokens) const {
  return ws_.bytes(max_tokens);
}

void Fp8LinearMethod::apply(const __nv_bfloat16* x, __nv_bfloat16* y, int64_t t,
                            cudaStream_t stream, void* workspace) const {
  if (!workspace) throw Error(prefix(), "fp8 linears need the engine's workspace");
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
  g.a_group = quant_.mode == Fp8ActMode::kDynamicGroup ? quant_.group : in_features();
  g.b = codes_.get();
  g.b_scales = scales_.get();
  g.b_block_rows = b_block_rows_;
  g.b_block_cols = b_block_cols_;
  g.bias = bias_.get();
  g.y = y;
  g.m = t;
  g.n = out_features();
  g.k = in_features();
  launch_fp8_scaled_gemm(g, stream);
}

GpuLinearMethod::ActivationCodes Fp8LinearMethod::activation_codes(const void* workspace,
                                                                   int64_t t) const {
  ActivationCodes c;
  c.kind = ActivationCodes::Kind::kFp8E4m3;
  c.values = workspace;
  c.scales = ActivationWorkspace::at<float>(workspace, ws_.scales_offset(t));
  c.scale_cols = ws_.scale_cols;
  return c;
}

size_t Fp8LinearMethod::device_bytes() const {
  return codes_.bytes() + scales_.bytes() + bias_.bytes();
}

}  // namespace qparity::gpu
