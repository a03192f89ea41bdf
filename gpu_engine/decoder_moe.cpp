// The decoder's MoE block (decoder.h): router GEMM (fp32 logits) and top-k on the device; the
// (token, slot) pairs grouped by expert (on the device for decode-sized batches: bf16 experts up
// to kSkinnyMaxM tokens, quantized ones with grouped launches up to kGroupedExpertsMaxTokens;
// else on the host); one gather of all experts' rows, the experts' gate_up GEMMs, SiLU-and-mul,
// the down GEMMs (grouped launches on the device path; a GEMM per expert with tokens on the host
// path: no grouped tensor-core GEMM yet); one scatter into per-slot outputs and the weighted
// combine.
#include <algorithm>
#include "core/capture/capture_points.h"

#include "core/error.h"
#include "gpu_engine/cuda_check.h"
#include "gpu_engine/decoder.h"
#include "gpu_engine/kernels/activation.h"
#include "gpu_engine/kernels/moe_dispatch.h"
#include "gpu_engine/kernels/moe_routing.h"

namespace qparity::gpu {

void Decoder::moe_layer(int64_t l, Trace* tr) {
  const ModelConfig& c = model_.kcfg();
  const GpuLayerWeights& w = model_.layers[static_cast<size_t>(l)];
  const int64_t t = in_.t, hd = c.hidden, e = c.num_experts, k = c.num_experts_per_tok,
                mi = c.moe_intermediate_size;
  const std::string p = layer_prefix(l);
  cudaStream_t s = stream_;
  gemm_->nt(h_.get(), w.router.get(), router_logits_.get(), GemmOut::kF32, t, e, hd, s);
  capture(tr, point_of(p, point::kMoeRouterLogits), router_logits_.get(), Elem::kF32, t, e, e, s);
  launch_moe_routing(
      {router_logits_.get(), topk_ids_.get(), topk_weights_.get(), t, e, k, c.norm_topk_prob}, s);
  capture(tr, point_of(p, point::kMoeTopkIds), topk_ids_.get(), Elem::kI32, t, k, k, s);
  capture(tr, point_of(p, point::kMoeTopkWeights), topk_weights_.get(), Elem::kF32, t, k, k, s);
  const int64_t n = t * k;
  if (moe_on_device(t)) {
    // Decode-sized: grouped on the device, then one grouped skinny GEMM per expert weight (a
    // token's experts are distinct, so no expert has more than t rows). The gate_up product
    // rounds to bf16 before SiLU-and-mul inside the epilogue, as the separate kernels do.
    launch_moe_group_by_expert({topk_ids_.get(), moe_first_.get(), moe_rows_.get(), moe_dest_.get(),
                                moe_active_.get(), moe_bad_.get() + l, n, e, k},
                               s);
    launch_gather_rows({h_.get(), moe_rows_.get(), moe_x_.get(), n, hd, t}, s);
    if (w.quantized_experts()) {  // (a model may mix quantized and bf16 expert layers)
      moe_experts_grouped(l);
    } else {
      SkinnyGemmParams up;
      up.x = moe_x_.get(), up.w = w.w13.get(), up.y = moe_act_.get();
      up.m = t, up.n = 2 * mi, up.k = hd, up.silu_mul = true;
      up.group_first = moe_first_.get(), up.group_active = moe_active_.get();
      up.max_active = std::min(e, n), up.w_group_stride = 2 * mi * hd;
      launch_skinny_gemm(up, s);
      SkinnyGemmParams down = up;
      down.x = moe_act_.get(), down.w = w.w2.get(), down.y = moe_y_.get();
      down.n = hd, down.k = mi, down.silu_mul = false, down.w_group_stride = hd * mi;
      launch_skinny_gemm(down, s);
    }
  } else {
    moe_experts_via_host(l);
  }
  launch_scatter_rows({moe_y_.get(), moe_dest_.get(), moe_slots_.get(), n, hd, n}, s);
  capture(tr, point_of(p, point::kMoeExpertOut), moe_slots_.get(), Elem::kBf16, t, k * hd, k * hd,
          s);
  launch_moe_combine(
      {moe_slots_.get(), topk_ids_.get(), topk_weights_.get(), mlp_out_.get(), t, k, hd}, s);
  // Tensor parallelism: each rank's experts hold a slice of their intermediate size, so each
  // rank's combine is a partial sum (vLLM reduces after the combine, as here).
  if (comm_) reduce_partial(mlp_out_.get());
  capture(tr, point_of(p, point::kMoeOut), mlp_out_.get(), Elem::kBf16, t, hd, hd, s);
}

// Quantized experts of a decode-sized batch, grouped on the device (moe_layer did that and the
// gather): one grouped launch per weight (quant/grouped_experts.h), SiLU-and-mul between them on
// the gate_up product rounded to bf16, as the host path does.
void Decoder::moe_experts_grouped(int64_t l) {
  const ModelConfig& c = model_.kcfg();
  const int64_t t = in_.t, e = c.num_experts, k = c.num_experts_per_tok,
                mi = c.moe_intermediate_size, n = t * k;
  const ExpertGroups groups{moe_first_.get(), moe_active_.get(), std::min(e, n)};
  // A token's experts are distinct, so no expert has more than t rows.
  w13_grouped_[static_cast<size_t>(l)]->apply(moe_x_.get(), moe_gate_up_.get(), n, t, groups,
                                              stream_, quant_workspace_.get());
  launch_silu_and_mul({moe_gate_up_.get(), moe_act_.get(), n, mi}, stream_);
  w2_grouped_[static_cast<size_t>(l)]->apply(moe_act_.get(), moe_y_.get(), n, t, groups, stream_,
                                             quant_workspace_.get());
}

// Larger batches, and quantized experts whose stacks have no grouped launch: the ids come to the
// host, which groups the pairs and runs a GEMM per expert with tokens (a quantized expert: its GPU
// method, the rows of that expert alone, so a token's activation quantization sees only its own
// row, as per token). One launch (or two, with activation quantization) per active expert and
// weight.
void Decoder::moe_experts_via_host(int64_t l) {
  const ModelConfig& c = model_.kcfg();
  const GpuLayerWeights& w = model_.layers[static_cast<size_t>(l)];
  const int64_t t = in_.t, hd = c.hidden, e = c.num_experts, k = c.num_experts_per_tok,
                mi = c.moe_intermediate_size;
  cudaStream_t s = stream_;
  std::vector<int32_t> ids(static_cast<size_t>(t * k));
  QPARITY_CUDA_CHECK(
      cudaMemcpyAsync(ids.data(), topk_ids_.get(), ids.size() * 4, cudaMemcpyDeviceToHost, s));
  QPARITY_CUDA_CHECK(cudaStreamSynchronize(s));
  // Group the (token, slot) pairs by expert in one counting pass; within an expert, token order.
  std::vector<int64_t> first(static_cast<size_t>(e + 1), 0);
  for (const int32_t id : ids) {
    if (id < 0 || id >= e)
      throw Error(layer_prefix(l) + ".moe", "the router returned expert id " + std::to_string(id) +
                                                ", outside [0, " + std::to_string(e) +
                                                ") (NaN router logits?)");
    ++first[static_cast<size_t>(id) + 1];
  }
  for (int64_t x = 0; x < e; ++x)
    first[static_cast<size_t>(x + 1)] += first[static_cast<size_t>(x)];
  std::vector<int32_t> rows(ids.size()), dest(ids.size());
  std::vector<int64_t> fill(first.begin(), first.end() - 1);
  for (int64_t i = 0; i < t * k; ++i) {
    const size_t at = static_cast<size_t>(fill[static_cast<size_t>(ids[static_cast<size_t>(i)])]++);
    rows[at] = static_cast<int32_t>(i / k);
    dest[at] = static_cast<int32_t>(i);
  }
  const int64_t n = t * k;
  QPARITY_CUDA_CHECK(
      cudaMemcpyAsync(moe_rows_.get(), rows.data(), rows.size() * 4, cudaMemcpyHostToDevice, s));
  QPARITY_CUDA_CHECK(
      cudaMemcpyAsync(moe_dest_.get(), dest.data(), dest.size() * 4, cudaMemcpyHostToDevice, s));
  launch_gather_rows({h_.get(), moe_rows_.get(), moe_x_.get(), n, hd, t}, s);
  for (int64_t x = 0; x < e; ++x) {
    const int64_t a = first[static_cast<size_t>(x)], cnt = first[static_cast<size_t>(x + 1)] - a;
    if (cnt == 0) continue;
    if (!w.w13_q.empty())
      w.w13_q[static_cast<size_t>(x)]->apply(moe_x_.get() + a * hd, moe_gate_up_.get() + a * 2 * mi,
                                             cnt, s, quant_workspace_.get());
    else
      linear(moe_x_.get() + a * hd, w.w13.get() + x * 2 * mi * hd, moe_gate_up_.get() + a * 2 * mi,
             false, cnt, 2 * mi, hd);
  }
  launch_silu_and_mul({moe_gate_up_.get(), moe_act_.get(), n, mi}, s);
  for (int64_t x = 0; x < e; ++x) {
    const int64_t a = first[static_cast<size_t>(x)], cnt = first[static_cast<size_t>(x + 1)] - a;
    if (cnt == 0) continue;
    if (!w.w2_q.empty())
      w.w2_q[static_cast<size_t>(x)]->apply(moe_act_.get() + a * mi, moe_y_.get() + a * hd, cnt, s,
                                            quant_workspace_.get());
    else
      linear(moe_act_.get() + a * mi, w.w2.get() + x * hd * mi, moe_y_.get() + a * hd, false, cnt,
             hd, mi);
  }
}

}  // namespace qparity::gpu
