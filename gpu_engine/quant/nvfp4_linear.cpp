#include "gpu_engine/quant/nvfp4_linear.h"

#include "core/error.h"
#include "gpu_engine/quant/upload_util.h"
#include "schemes/fp4/nvfp4.h"
#include "schemes/math/numeric.h"

namespace qparity::gpu {

namespace {

// One global scale for every partition of the expert, or an Error naming the layer.
double uniform_global_scale(const std::vector<double>& per_partition, const std::string& where,
                            const char* what) {
  for (double g : per_partition)
    if (g != per_partition.front())
      throw Error(where, std::string("partitions keep different ") + what +
                             " global scales in this dialect; the GPU applies one per layer "
                             "(run with --dialect vllm or sglang, which unify them)");
  return per_partition.front();
}

}  // namespace

Nvfp4LinearMethod::Nvfp4LinearMethod(const reference::LinearMethod& host, int64_t expert)
    : Fp8RuntimeMethod(method_prefix(host, expert), host.config().scheme,
                       host.shape().out_features(), host.shape().in_features) {
  const auto* m = dynamic_cast<const reference::Nvfp4LinearMethod*>(&host);
  const std::string& where = prefix();
  if (!m) throw Error(where, "not an NVFP4 linear layer");
  const int64_t e = method_expert(host, expert);
  std::vector<double> wgs;
  for (int64_t p = 0; p < host.shape().partition_count(); ++p)
    wgs.push_back(m->effective_weight_global_scale(e, p));
  const double gs_w = uniform_global_scale(wgs, where, "weight");
  using reference::Arith;
  rt_.packed = true;
  rt_.packed_scale = Fp4BlockScale::kE4m3Group16;
  if (!m->quantizes_activations()) {
    // NVFP4A16: bf16 inputs, the weight's global scale once per output (the dialects differ in
    // how activations are quantized; their fused weight scales were checked above).
    rt_.weight_only = true;
    rt_.alpha = static_cast<float>(reference::div_in(Arith::kFp32, 1.0, gs_w));
    rt_.upload(m->processed_codes(e), m->processed_bias(e), out_features(), in_features(), where);
    return;
  }
  const reference::Nvfp4Rules& r = m->rules();
  const bool vllm = r.block_scale == reference::Nvfp4BlockScale::kReciprocalSixFp32 &&
                    r.element == reference::Nvfp4ElementScaling::kReciprocalFp32 &&
                    r.zero_block_scale == 0.0;
  const bool ct = r.block_scale == reference::Nvfp4BlockScale::kDivideFp32 &&
                  r.element == reference::Nvfp4ElementScaling::kDivideFp32 &&
                  r.zero_block_scale == 0.125;
  if (!vllm && !ct)
    throw Error(where, "nvfp4 in dialect " +
                           std::string(qparity::to_string(host.config().dialect)) +
                           ": the GPU quantizes activations by vLLM's or compressed-tensors' fp32 "
                           "rule; run with --dialect vllm, sglang or compressed-tensors");
  std::vector<double> igs;
  for (int64_t p = 0; p < host.shape().partition_count(); ++p)
    igs.push_back(m->effective_input_global_scale(e, p));
  const double gs_in = uniform_global_scale(igs, where, "input");
  rt_.quant.mode = Fp8ActMode::kDynamicGroup;
  rt_.quant.group = reference::kNvfp4GroupSize;
  rt_.quant.nvfp4_global = static_cast<float>(gs_in);  // an F32 value (checkpoint)
  rt_.quant.nvfp4_divide = ct;
  rt_.alpha = static_cast<float>(reference::mul_in(Arith::kFp32,
                                                   reference::div_in(Arith::kFp32, 1.0, gs_in),
                                                   reference::div_in(Arith::kFp32, 1.0, gs_w)));
  rt_.upload(m->processed_codes(e), m->processed_bias(e), out_features(), in_features(), where);
  rt_.ws.reported_scales = true;
}

}  // namespace qparity::gpu
