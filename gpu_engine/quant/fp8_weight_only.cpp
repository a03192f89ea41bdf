#include "gpu_engine/quant/fp8_weight_only.h"

#include <cuda_bf16.h>

#include <algorithm>
#include <numeric>

#include "core/error.h"
#include "gpu_engine/quant/fp8_gemm_runtime.h"
#include "gpu_engine/quant/upload_util.h"
#include "schemes/fp8/fp8_common.h"
#include "schemes/math/mx_scale.h"

namespace qparity::gpu {

namespace {

// The processed weight and bias of an fp8 or MX e4m3 weight-only layer.
struct Fp8WeightOnlyHost {
  const reference::QuantizedMatrix* w = nullptr;
  const std::vector<double>* bias = nullptr;
};

Fp8WeightOnlyHost host_weight(const reference::LinearMethod& host, int64_t e,
                              const std::string& where) {
  if (const auto* f = dynamic_cast<const reference::Fp8LinearBase*>(&host)) {
    if (f->activation_mode() != reference::Fp8Act::kNone)
      throw Error(where, "fp8 inputs run on the fp8 GEMM (fp8_linear.h), not weight-only");
    return {&f->processed_weight(e), &f->processed_bias(e)};
  }
  if (const auto* m = dynamic_cast<const reference::MxLinearMethodBase*>(&host)) {
    if (m->quantizes_activations() || m->element() != reference::MxElem::kE4M3)
      throw Error(where, "only MXFP8A16 (e4m3 elements, bf16 inputs) runs weight-only here");
    return {&m->processed_weight(e), &m->processed_bias(e)};
  }
  throw Error(where, "not an fp8 or MXFP8 weight-only layer");
}

}  // namespace

Fp8WeightOnlyMethod::Fp8WeightOnlyMethod(const reference::LinearMethod& host, int64_t expert)
    : GpuLinearMethod(method_prefix(host, expert), host.config().scheme,
                      host.shape().out_features(), host.shape().in_features) {
  const std::string& where = prefix();
  const Fp8WeightOnlyHost h = host_weight(host, method_expert(host, expert), where);
  const reference::QuantizedMatrix& w = *h.w;
  const int64_t n = out_features(), k = in_features();
  require_processed_shape(w.rows, w.cols, n, k, where);
  if (k % 16 != 0)
    throw Error(where, "in_features " + std::to_string(k) +
                           " must be a multiple of 16 for the GPU's fp8 weight-only kernel");
  // Columns per scale: the largest that divides k and the block (a multiple of 16 since k is).
  group_ = std::gcd(k, std::min(w.block_cols, k));
  if (group_ % 16 != 0)
    throw Error(where, "weight scale blocks of " + std::to_string(w.block_cols) +
                           " columns: the GPU's fp8 weight-only kernel needs multiples of 16");
  const int64_t groups = k / group_;
  std::vector<double> grid(static_cast<size_t>(n * groups));
  for (int64_t r = 0; r < n; ++r)
    for (int64_t g = 0; g < groups; ++g) {
      const double s = w.scale(r, g * group_);
      if (!std::isfinite(s) || s < 0)
        throw Error(where + ".weight_scale", "scale " + std::to_string(s) + " at row " +
                                                 std::to_string(r) + " (must be finite >= 0)");
      grid[static_cast<size_t>(r * groups + g)] = s;
    }
  scale_bf16_ = all_bf16_values(grid);
  if (expert < 0) {
    const std::vector<uint8_t> bytes = e4m3_bytes(w, where);
    mma_ = upload_mma_weight(pack_weight_only_mma(MmaCodes::kE4m3, n, k, group_,
                                                  std::vector<int8_t>(bytes.begin(), bytes.end()),
                                                  grid, {}, scale_bf16_, where));
  } else if (scale_bf16_) {
    std::vector<__nv_bfloat16> s(grid.size());
    for (size_t i = 0; i < s.size(); ++i)
      s[i] = __float2bfloat16_rn(static_cast<float>(grid[i]));
    scales_bf16_ = DeviceBuffer<__nv_bfloat16>(s);
  } else {
    scales_f32_ = DeviceBuffer<float>(exact_f32(grid, where + ".weight_scale"));
  }
  if (expert >= 0) codes_ = DeviceBuffer<uint8_t>(e4m3_bytes(w, where));
  if (std::any_of(h.bias->begin(), h.bias->end(), [](double v) { return v != 0.0; }))
    bias_ = DeviceBuffer<float>(exact_f32(*h.bias, where + ".bias"));
}

void Fp8WeightOnlyMethod::apply(const __nv_bfloat16* x, __nv_bfloat16* y, int64_t t,
                                cudaStream_t stream, void*) const {
  if (mma_.on()) {
    launch_weight_only_mma(mma_.params(x, y, t, bias_.get()), stream);
    return;
  }
  WeightOnlyGemmParams p;
  p.x = x;
  p.w = codes_.get();
  p.scales = scale_bf16_ ? static_cast<const void*>(scales_bf16_.get())
                         : static_cast<const void*>(scales_f32_.get());
  p.scale_bf16 = scale_bf16_;
  p.bias = bias_.get();
  p.y = y;
  p.m = t;
  p.n = out_features();
  p.k = in_features();
  p.group = group_;
  p.bits = 8;
  p.fp8_codes = true;
  launch_weight_only_gemm(p, stream);
}

size_t Fp8WeightOnlyMethod::device_bytes() const {
  return codes_.bytes() + scales_f32_.bytes() + scales_bf16_.bytes() + bias_.bytes() + mma_.bytes();
}

}  // namespace qparity::gpu
