#include "gpu_engine/quant/fp8_linear.h"

#include <algorithm>

#include "core/codecs/float_format.h"
#include "core/error.h"
#include "gpu_engine/cuda_check.h"
#include "gpu_engine/kernels/random_init.h"
#include "gpu_engine/quant/upload_util.h"
#include "schemes/fp8/fp8_common.h"

namespace qparity::gpu {

namespace {

const reference::Fp8LinearBase& as_fp8(const reference::LinearMethod& h) {
  const auto* m = dynamic_cast<const reference::Fp8LinearBase*>(&h);
  if (!m) throw Error(h.shape().prefix, "not an fp8 linear layer");
  return *m;
}

}  // namespace

Fp8LinearMethod::Fp8LinearMethod(const reference::LinearMethod& host, int64_t expert,
                                 bool tensor_cores)
    : Fp8RuntimeMethod(method_prefix(host, expert), host.config().scheme,
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
  switch (m.activation_mode()) {
    case reference::Fp8Act::kNone:
      throw Error(where, "fp8 weight-only (no activation quantization) is not on the GPU yet");
    case reference::Fp8Act::kStatic:
      rt_.quant.mode = Fp8ActMode::kStatic;
      rt_.quant.static_scale = exact_f32({m.static_input_scale()}, where + ".input_scale")[0];
      break;
    case reference::Fp8Act::kDynamicTensor:
      rt_.quant.mode = Fp8ActMode::kDynamicTensor;
      break;
    case reference::Fp8Act::kDynamicToken:
      rt_.quant.mode = Fp8ActMode::kDynamicToken;
      break;
    case reference::Fp8Act::kDynamicGroup:
      rt_.quant.mode = Fp8ActMode::kDynamicGroup;
      rt_.quant.group = reference::kFp8BlockSize;
      break;
  }
  set_fp8_activation_rule(m.activation_rule(), dialect, where, &rt_.quant);
  rt_.tensor_cores = tensor_cores && expert < 0;
  // Weight: codes on the 2^-9 lattice -> e4m3fn bytes (exact: they are e4m3fn values).
  rt_.upload(m.processed_weight(e), m.processed_bias(e), out_features(), in_features(), where);
}

std::unique_ptr<Fp8LinearMethod> Fp8LinearMethod::random_block(std::string prefix, int64_t n,
                                                               int64_t k, float block_scale,
                                                               uint64_t seed, bool tensor_cores) {
  const int64_t b = reference::kFp8BlockSize;
  if (k % b != 0) throw Error(prefix, "random fp8-block weights: in_features a multiple of 128");
  std::unique_ptr<Fp8LinearMethod> m(
      new Fp8LinearMethod(std::move(prefix), parse_scheme_id("fp8-block"), n, k));
  Fp8GemmRuntime& rt = m->rt_;
  // The activation rule: vLLM's dynamic 1 x 128 groups, as the reference's vllm dialect gives it.
  const reference::Fp8ScaleRule rule =
      reference::fp8_rules(Dialect::kVllm)
          .activation_rule(reference::Fp8Act::kDynamicGroup, DType::kBF16);
  rt.quant.mode = Fp8ActMode::kDynamicGroup;
  rt.quant.group = b;
  set_fp8_activation_rule(rule, "vllm", m->prefix(), &rt.quant);
  rt.b_block_rows = b;
  rt.b_block_cols = b;
  rt.tensor_cores = tensor_cores;
  // Codes: random rows quantized by the same rule (real e4m3fn codes, never NaN).
  {
    DeviceBuffer<__nv_bfloat16> x(static_cast<size_t>(n * k));
    DeviceBuffer<float> s(static_cast<size_t>(n * (k / b)));
    launch_fill_random_bf16(x.get(), static_cast<int64_t>(x.size()), 0.f, 1.f, seed, nullptr);
    rt.codes = DeviceBuffer<uint8_t>(static_cast<size_t>(n * k));
    QuantizeFp8Params q = rt.quant;
    q.x = x.get(), q.q = rt.codes.get(), q.scales = s.get(), q.m = n, q.k = k;
    launch_quantize_fp8(q, nullptr);
    QPARITY_CUDA_CHECK(cudaDeviceSynchronize());
  }
  const std::vector<float> grid(static_cast<size_t>((n + b - 1) / b * (k / b)), block_scale);
  rt.scales = DeviceBuffer<float>(grid);
  rt.prepare_blas(grid, {}, n, k);
  return m;
}

}  // namespace qparity::gpu
