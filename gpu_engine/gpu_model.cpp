#include "gpu_engine/gpu_model.h"

#include "core/codecs/float_format.h"
#include "core/error.h"
#include "gpu_engine/cuda_check.h"
#include "gpu_engine/rope_layout.h"
#include "reference_cpu/layers/rope.h"
#include "reference_cpu/tensor_decode.h"

namespace qparity::gpu {

void attach_rope(GpuModel& m) {
  const reference::Rope rope(m.cfg);
  m.inv_freq = DeviceBuffer<double>(needs_rope_relayout(m.cfg) ? rotate_half_inv_freq(m.cfg)
                                                               : rope.inv_freq());
  m.rope_scaling = rope.attention_scaling();
}

void attach_qkv_bias(GpuModel& m, const Checkpoint& ck) {
  const ModelConfig& c = m.cfg;
  if (!c.has_qkv_bias()) return;
  if (m.padded && m.padded->head_dim != c.head_dim)
    throw Error("config.json", "q/k/v biases with a head_dim the kernels pad (" +
                                   std::to_string(c.head_dim) + ") are not in the GPU engine yet");
  for (size_t i = 0; i < m.layers.size(); ++i) {
    const std::string p = "model.layers." + std::to_string(i) + ".self_attn.";
    std::vector<uint16_t> codes;
    for (const auto& [proj, n] : {std::pair{"q_proj", c.q_size()}, std::pair{"k_proj", c.kv_size()},
                                  std::pair{"v_proj", c.kv_size()}}) {
      const std::string name = p + proj + ".bias";
      const TensorRef& t = ck.at(name);
      if (t.info->shape.size() != 1 || static_cast<int64_t>(t.info->shape[0]) != n)
        throw Error(ck.origin(name), "expected shape [" + std::to_string(n) + "]");
      for (double v : reference::decode_all(t.info->dtype, t.bytes(), t.info->numel(), name))
        codes.push_back(codec::double_to_bf16(v));  // the run dtype, rounded once
    }
    m.layers[i].qkv_bias = Bf16Buffer(codes.size());
    QPARITY_CUDA_CHECK(cudaMemcpy(m.layers[i].qkv_bias.get(), codes.data(), codes.size() * 2,
                                  cudaMemcpyHostToDevice));
  }
}

}  // namespace qparity::gpu
