#include "gpu_engine/quant/fp8_gemm_runtime.h"

#include <algorithm>

#include "core/codecs/float_format.h"
#include "core/error.h"
#include "gpu_engine/quant/upload_util.h"

namespace qparity::gpu {

void Fp8GemmRuntime::upload(const reference::QuantizedMatrix& w,
                            const std::vector<double>& bias_values, int64_t n, int64_t k,
                            const std::string& where) {
  if (w.rows != n || w.cols != k)
    throw Error(where, "processed weight is [" + std::to_string(w.rows) + ", " +
                           std::to_string(w.cols) + "], the layer is [" + std::to_string(n) +
                           ", " + std::to_string(k) + "]");
  if (k % 16 != 0)
    throw Error(where, "in_features " + std::to_string(k) +
                           " must be a multiple of 16 for the GPU's fp8 GEMM");
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
  codes = DeviceBuffer<uint8_t>(bytes);
  b_block_rows = w.block_rows;
  b_block_cols = w.block_cols;
  if (b_block_cols < k && b_block_cols % 16 != 0)
    throw Error(where, "weight scale blocks of " + std::to_string(b_block_cols) +
                           " columns: the GPU's fp8 GEMM needs multiples of 16");
  scales = DeviceBuffer<float>(exact_f32(w.scales.data, where + ".weight_scale"));
  if (std::any_of(bias_values.begin(), bias_values.end(), [](double v) { return v != 0.0; }))
    bias = DeviceBuffer<float>(exact_f32(bias_values, where + ".bias"));
  ws.k = k;
  ws.n = n;
  ws.scale_cols = fp8_act_scale_cols(quant.mode, k, quant.group);
  ws.extra_bytes = sizeof(float);
}

void Fp8GemmRuntime::apply(const std::string& name, const __nv_bfloat16* x, __nv_bfloat16* y,
                           int64_t t, int64_t n, int64_t k, cudaStream_t stream,
                           void* workspace) const {
  if (!workspace) throw Error(name, "fp8 and MX linears need the engine's workspace");
  auto* base = static_cast<uint8_t*>(workspace);
  QuantizeFp8Params q = quant;
  q.x = x;
  q.q = base;
  q.scales = ActivationWorkspace::at<float>(workspace, ws.scales_offset(t));
  q.tensor_amax = ActivationWorkspace::at<float>(workspace, ws.extra_offset(t));
  q.m = t;
  q.k = k;
  launch_quantize_fp8(q, stream);
  Fp8GemmParams g;
  g.a = base;
  g.a_scales = q.scales;
  g.a_group = quant.mode == Fp8ActMode::kDynamicGroup ? quant.group : k;
  g.b = codes.get();
  g.b_scales = scales.get();
  g.b_block_rows = b_block_rows;
  g.b_block_cols = b_block_cols;
  g.bias = bias.get();
  g.y = y;
  g.m = t;
  g.n = n;
  g.k = k;
  launch_fp8_scaled_gemm(g, stream);
}

GpuLinearMethod::ActivationCodes Fp8GemmRuntime::activation_codes(const void* workspace,
                                                                  int64_t t) const {
  GpuLinearMethod::ActivationCodes c;
  c.kind = GpuLinearMethod::ActivationCodes::Kind::kFp8E4m3;
  c.values = workspace;
  c.scales = ActivationWorkspace::at<float>(workspace, ws.scales_offset(t));
  c.scale_cols = ws.scale_cols;
  return c;
}

}  // namespace qparity::gpu
