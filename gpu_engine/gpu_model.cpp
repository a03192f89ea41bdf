#include "gpu_engine/gpu_model.h"

#include "core/config/rope_tables.h"
#include "core/error.h"
#include "gpu_engine/quant/upload_util.h"
#include "gpu_engine/rope_layout.h"
#include "schemes/math/numeric.h"
#include "schemes/method/tensor_decode.h"

namespace qparity::gpu {

void attach_rope(GpuModel& m) {
  const RopeTable rope = rope_table(m.cfg);
  m.inv_freq = DeviceBuffer<double>(needs_rope_relayout(m.cfg) ? rotate_half_inv_freq(m.cfg)
                                                               : rope.inv_freq);
  m.rope_scaling = rope.attention_scaling;
  if (m.cfg.image_text && m.cfg.mrope_section.size() == 3) {
    const int64_t rotary = m.cfg.rotary_dim > 0 ? m.cfg.rotary_dim : m.cfg.head_dim;
    const std::vector<int> rows = mrope_frequency_rows(rotary / 2, m.cfg.mrope_section);
    std::vector<int32_t> all(static_cast<size_t>(m.cfg.head_dim / 2), 0);
    std::copy(rows.begin(), rows.end(), all.begin());
    m.mrope_rows = DeviceBuffer<int32_t>(all);
  }
}

void attach_qkv_bias(GpuModel& m, const Checkpoint& ck) {
  const ModelConfig& c = m.cfg;
  if (!c.has_qkv_bias()) return;
  if (m.padded && m.padded->head_dim != c.head_dim)
    throw Error("config.json", "q/k/v biases with a head_dim the kernels pad (" +
                                   std::to_string(c.head_dim) + ") are not in the GPU engine yet");
  for (size_t i = 0; i < m.layers.size(); ++i) {
    if (m.layers[i].qkv_q) continue;  // the method holds (and adds) its bias
    const std::string p = "model.layers." + std::to_string(i) + ".self_attn.";
    std::vector<float> values;
    for (const auto& [proj, n] : {std::pair{"q_proj", c.q_size()}, std::pair{"k_proj", c.kv_size()},
                                  std::pair{"v_proj", c.kv_size()}}) {
      const std::string name = p + proj + ".bias";
      const TensorRef& t = ck.at(name);
      if (t.info->shape.size() != 1 || static_cast<int64_t>(t.info->shape[0]) != n)
        throw Error(ck.origin(name), "expected shape [" + std::to_string(n) + "]");
      // fp32 holds a bf16, fp16 or fp32 bias exactly; NaN / Inf and wider values are refused.
      const std::vector<double> v =
          reference::decode_all(t.info->dtype, t.bytes(), t.info->numel(), name);
      reference::require_finite(v, ck.origin(name));
      const std::vector<float> f = exact_f32(v, ck.origin(name));
      values.insert(values.end(), f.begin(), f.end());
    }
    m.layers[i].qkv_bias = DeviceBuffer<float>(values);
  }
}

void attach_linear_attention(GpuModel& m, const Checkpoint& ck) {
  const ModelConfig& c = m.cfg;
  const LinearAttentionDims& d = c.linear;
  for (size_t i = 0; i < m.layers.size(); ++i) {
    if (!c.is_linear_attention_layer(static_cast<int64_t>(i))) continue;
    const std::string p = "model.layers." + std::to_string(i) + ".linear_attn.";
    const auto f32 = [&](const std::string& name, const std::vector<uint64_t>& shape) {
      const TensorRef& t = ck.at(p + name);
      if (t.info->shape != shape) {
        std::string dims;
        for (size_t j = 0; j < shape.size(); ++j)
          dims += (j ? ", " : "") + std::to_string(shape[j]);
        throw Error(ck.origin(p + name),
                    "expected shape [" + dims + "] from the config's linear_* sizes");
      }
      const std::vector<double> v =
          reference::decode_all(t.info->dtype, t.bytes(), t.info->numel(), p + name);
      reference::require_finite(v, ck.origin(p + name));
      return DeviceBuffer<float>(exact_f32(v, ck.origin(p + name)));
    };
    const auto u = [](int64_t x) { return static_cast<uint64_t>(x); };
    GpuLayerWeights& l = m.layers[i];
    l.conv = f32("conv1d.weight", {u(d.conv_dim()), 1, u(d.conv_kernel)});
    l.a_log = f32("A_log", {u(d.num_value_heads)});
    l.dt_bias = f32("dt_bias", {u(d.num_value_heads)});
    l.lin_norm = f32("norm.weight", {u(d.value_head_dim)});
    m.weight_bytes += l.conv.bytes() + l.a_log.bytes() + l.dt_bias.bytes() + l.lin_norm.bytes();
  }
}

}  // namespace qparity::gpu
