#include "gpu_engine/quant/kv_cache_upload.h"

#include <algorithm>

#include "core/error.h"
#include "gpu_engine/quant/upload_util.h"
#include "schemes/kv/kv_fp8.h"
#include "schemes/kv/kv_int8.h"

namespace qparity::gpu {

namespace {

using reference::Arith;
using reference::IntRound;
using reference::KvWhich;
using reference::ScaleUse;

GpuKvCache upload_int8(const reference::KvInt8CacheMethod& m, int64_t kd) {
  const auto& shape = m.shape();
  const auto& r = m.rules();
  if (r.store_use != ScaleUse::kMultiplyReciprocal || r.store_arith != Arith::kFp32 ||
      r.store_round != IntRound::kHalfEven)
    throw Error(shape.prefix, "kv-int8 in dialect " + std::string(to_string(m.config().dialect)) +
                                  ": the GPU stores c * fp32(1/s) + offset in fp32, half to even "
                                  "(the vllm / sglang / msmodelslim rule); this dialect's store "
                                  "is another, and the GPU never writes codes the reference "
                                  "would not");
  const int64_t h = shape.num_kv_heads, d = shape.head_dim, n = h * kd;
  std::vector<float> rows(static_cast<size_t>(kKvChannelRows * n));
  for (int row = 0; row < kKvChannelRows; ++row)  // padded channels: scale 1, offset 0
    if (row != kKOffset && row != kVOffset) std::fill_n(rows.begin() + row * n, n, 1.f);
  for (const KvWhich w : {KvWhich::kKey, KvWhich::kValue}) {
    const std::string what =
        shape.prefix + (w == KvWhich::kKey ? ".k_proj" : ".v_proj") + ".kv_cache_";
    const std::vector<float> sc = exact_f32(m.scales(w), what + "scale");
    const std::vector<float> of = exact_f32(m.offsets(w), what + "offset");
    const int base = w == KvWhich::kKey ? kKScale : kVScale;
    for (int64_t head = 0; head < h; ++head)
      for (int64_t e = 0; e < d; ++e) {
        const size_t src = static_cast<size_t>(head * d + e);
        const int64_t ch = head * kd + e;
        rows[static_cast<size_t>(base * n + ch)] = sc[src];
        // fp32(1/s): a correctly rounded fp32 division, as the reference's div_in(kFp32, 1, s).
        rows[static_cast<size_t>((base + 1) * n + ch)] = 1.0f / sc[src];
        rows[static_cast<size_t>((base + 2) * n + ch)] = of[src];
      }
  }
  GpuKvCache g;
  g.channels = DeviceBuffer<float>(rows);
  g.quant.format = KvCacheFormat::kInt8;
  g.quant.channels = g.channels.get();
  g.quant.num_channels = n;
  return g;
}

GpuKvCache upload_fp8(const reference::KvFp8CacheMethod& m, int64_t kernel_head_dim) {
  const auto& r = m.rules();
  GpuKvCache g;
  g.quant.format = KvCacheFormat::kFp8E4m3;
  const bool vllm = !r.store_in_model_dtype && r.store_arith == Arith::kFp32 && r.store_saturates;
  const bool sglang = r.store_in_model_dtype && !r.store_saturates;
  if (!vllm && !sglang)
    throw Error(m.shape().prefix,
                "kv-fp8 in dialect " + std::string(to_string(m.config().dialect)) +
                    ": the GPU stores e4m3(fp32(x / s)) saturating (vllm) or the bf16 quotient "
                    "unclamped (sglang); this dialect's store is another");
  if (sglang && m.shape().model_dtype != DType::kBF16)
    throw Error(m.shape().prefix, "kv-fp8 (sglang) rounds the quotient to the model dtype, " +
                                      std::string(dtype_name(m.shape().model_dtype)) +
                                      " here; the GPU runs bf16");
  g.quant.fp8_bf16_quotient = sglang;
  g.quant.read_bf16 = r.read_fp32_then_model;  // vLLM: fp32 product, then the model dtype
  if (!m.per_head()) {
    g.quant.k_scale = exact_f32({m.scale(KvWhich::kKey)}, m.shape().prefix + ".k_scale")[0];
    g.quant.v_scale = exact_f32({m.scale(KvWhich::kValue)}, m.shape().prefix + ".v_scale")[0];
    return g;
  }
  // kv-fp8-head: rows K, V of one scale per head (exact in fp32, as every scale the GPU takes).
  const int64_t h = m.shape().num_kv_heads;
  std::vector<double> both;
  for (const KvWhich w : {KvWhich::kKey, KvWhich::kValue})
    for (int64_t i = 0; i < h; ++i)
      both.push_back(m.head_scale(w, i));
  g.channels = DeviceBuffer<float>(exact_f32(both, m.shape().prefix + ".k_scale / v_scale"));
  g.quant.fp8_heads = g.channels.get();
  g.quant.fp8_num_heads = h;
  g.quant.fp8_head_dim = kernel_head_dim;
  return g;
}

}  // namespace

GpuKvCache upload_kv_cache(const reference::KvCacheMethod& host, int64_t kernel_head_dim) {
  if (!host.processed())
    throw Error(host.shape().prefix, "the KV-cache method is not processed yet");
  if (kernel_head_dim < host.shape().head_dim)
    throw Error(host.shape().prefix, "kernel head_dim below the model's");
  switch (host.config().scheme.kind) {
    case SchemeKind::kKvBf16:
      return {};
    case SchemeKind::kKvInt8:
      return upload_int8(dynamic_cast<const reference::KvInt8CacheMethod&>(host), kernel_head_dim);
    case SchemeKind::kKvFp8:
      return upload_fp8(dynamic_cast<const reference::KvFp8CacheMethod&>(host), kernel_head_dim);
    default:
      throw Error(host.shape().prefix,
                  "KV-cache scheme " + to_string(host.config().scheme) + " is not on the GPU");
  }
}

}  // namespace qparity::gpu
