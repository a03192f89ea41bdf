// The decoder's Gated DeltaNet block (decoder.h; Qwen3.5's linear_attention layers): h_ -> the
// fused input projection [q | k | v | z | b | a] (one bf16 GEMM) -> causal conv + SiLU (with the
// slot's conv state) -> gates, l2 norms and the delta rule (with the slot's recurrent state) ->
// the gated norm -> out_proj into attn_out_, with the linear_attn.* capture points the
// reference records (core/capture/capture_points.h). Kernels and precision:
// kernels/gated_delta_net.h.
#include "core/capture/capture_points.h"
#include "core/capture/trace.h"
#include "gpu_engine/decoder.h"
#include "gpu_engine/kernels/gated_delta_net.h"

namespace qparity::gpu {

void Decoder::linear_attention(int64_t l, Trace* tr) {
  const ModelConfig& c = model_.kcfg();
  const LinearAttentionDims& d = model_.cfg.linear;
  const GpuLayerWeights& w = model_.layers[static_cast<size_t>(l)];
  const std::string p = layer_prefix(l);
  const int64_t t = in_.t, hd = c.hidden, cd = d.conv_dim(), vd = d.value_dim(),
                hv = d.num_value_heads, width = cd + vd + 2 * hv;
  cudaStream_t s = stream_;
  if (!options_.ablate_linears)
    linear(h_.get(), w.lin_in.get(), lin_in_.get(), false, t, width, hd, nullptr, nullptr);
  capture(tr, point_of(p, point::kLinearAttnQkvz), lin_in_.get(), Elem::kBf16, t, cd + vd, width,
          s);
  capture(tr, point_of(p, point::kLinearAttnBa), lin_in_.get() + cd + vd, Elem::kBf16, t, 2 * hv,
          width, s);

  GdnConvParams cp;
  cp.x = lin_in_.get(), cp.x_stride = width, cp.weight = w.conv.get();
  cp.conv_state = cache_.conv_state(l), cp.slots = in_.slots, cp.positions = in_.positions;
  cp.runs = in_.runs, cp.max_runs = t, cp.out = lin_conv_.get();
  cp.tokens = t, cp.channels = cd, cp.taps = d.conv_kernel;
  launch_gdn_conv(cp, s);
  launch_gdn_conv_state_update(cp, s);
  capture(tr, point_of(p, point::kLinearAttnConv), lin_conv_.get(), Elem::kBf16, t, cd, cd, s);

  const std::string state_name = point_of(p, point::kLinearAttnState);
  const bool want_states = tr && tr->wants(state_name);
  const size_t state_values = static_cast<size_t>(t * d.state_size());
  if (want_states && lin_states_.size() < state_values)  // (a traced forward: never in a graph)
    lin_states_ = DeviceBuffer<float>(state_values);
  GdnRecurrenceParams rp;
  rp.conv = lin_conv_.get(), rp.conv_stride = cd;
  rp.ba = lin_in_.get() + cd + vd, rp.ba_stride = width;
  rp.a_log = w.a_log.get(), rp.dt_bias = w.dt_bias.get(), rp.state = cache_.ssm_state(l);
  rp.slots = in_.slots, rp.positions = in_.positions, rp.runs = in_.runs, rp.max_runs = t;
  rp.beta_out = lin_beta_.get(), rp.decay_out = lin_decay_.get();
  rp.states_out = want_states ? lin_states_.get() : nullptr;
  rp.out = lin_core_.get(), rp.tokens = t;
  rp.key_heads = d.num_key_heads, rp.value_heads = hv;
  rp.key_dim = d.key_head_dim, rp.value_dim = d.value_head_dim;
  launch_gdn_recurrence(rp, s);
  capture(tr, point_of(p, point::kLinearAttnBeta), lin_beta_.get(), Elem::kF32, t, hv, hv, s);
  capture(tr, point_of(p, point::kLinearAttnDecay), lin_decay_.get(), Elem::kF32, t, hv, hv, s);
  if (want_states)
    capture(tr, state_name, lin_states_.get(), Elem::kF32, t, d.state_size(), d.state_size(), s);
  capture(tr, point_of(p, point::kLinearAttnCore), lin_core_.get(), Elem::kBf16, t, vd, vd, s);

  launch_gdn_gated_norm({.o = lin_core_.get(),
                         .z = lin_in_.get() + cd,
                         .z_stride = width,
                         .weight = w.lin_norm.get(),
                         .out = lin_normed_.get(),
                         .tokens = t,
                         .heads = hv,
                         .dim = d.value_head_dim,
                         .eps = static_cast<float>(c.rms_norm_eps)},
                        s);
  capture(tr, point_of(p, point::kLinearAttnNorm), lin_normed_.get(), Elem::kBf16, t, vd, vd, s);
  if (!options_.ablate_linears)
    linear(lin_normed_.get(), w.lin_out.get(), attn_out_.get(), false, t, hd, vd, nullptr, nullptr);
}

}  // namespace qparity::gpu
