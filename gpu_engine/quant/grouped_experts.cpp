#include "gpu_engine/quant/grouped_experts.h"

#include "core/error.h"
#include "gpu_engine/quant/fp8_gemm_runtime.h"
#include "gpu_engine/quant/weight_only_int.h"

namespace qparity::gpu {

namespace {

// The fields of an activation rule that decide the codes (pointers and sizes aside).
bool same_rule(const QuantizeFp8Params& a, const QuantizeFp8Params& b) {
  return a.mode == b.mode && a.group == b.group && a.static_scale == b.static_scale &&
         a.multiply_reciprocal == b.multiply_reciprocal && a.amax_floor == b.amax_floor &&
         a.min_scale == b.min_scale && a.zero_saturates == b.zero_saturates &&
         a.mx_bump == b.mx_bump && a.mx_e2m1 == b.mx_e2m1 && a.nvfp4_global == b.nvfp4_global &&
         a.nvfp4_divide == b.nvfp4_divide;
}

std::unique_ptr<GroupedExperts> refuse(std::string* why, const std::string& what) {
  if (why) *why = what;
  return nullptr;
}

}  // namespace

std::unique_ptr<GroupedExperts> GroupedExperts::make(
    const std::vector<std::unique_ptr<GpuLinearMethod>>& experts, std::string* why) {
  if (experts.empty()) return refuse(why, "no experts");
  std::unique_ptr<GroupedExperts> g(new GroupedExperts());
  g->n_ = experts[0]->out_features();
  g->k_ = experts[0]->in_features();
  for (const auto& m : experts)
    if (m->out_features() != g->n_ || m->in_features() != g->k_ ||
        m->scheme() != experts[0]->scheme())
      return refuse(why, m->prefix() + ": experts of one stack differ in shape or scheme");
  if (const auto* w0 = dynamic_cast<const WeightOnlyIntMethod*>(experts[0].get())) {
    std::vector<WeightOnlyExpert> table;
    const WeightOnlyExpert v0 = w0->device_view();
    for (const auto& m : experts) {
      const auto* w = dynamic_cast<const WeightOnlyIntMethod*>(m.get());
      if (!w || w->bits() != w0->bits() || w->group() != w0->group() ||
          w->scale_bf16() != w0->scale_bf16() || w->faulty())
        return refuse(why, m->prefix() +
                               ": bits, group or scale kind differ from expert 0's "
                               "(or a test fault is planted)");
      if (w->permuted())
        return refuse(why, m->prefix() + ": act-order experts gather their inputs per expert");
      const WeightOnlyExpert v = w->device_view();
      if (!v.zeros_f32 != !v0.zeros_f32 || !v.zeros_i8 != !v0.zeros_i8)
        return refuse(why, m->prefix() + ": zero-point kind differs from expert 0's");
      table.push_back(v);
    }
    g->int_.bits = w0->bits();
    g->int_.group = w0->group();
    g->int_.scale_bf16 = w0->scale_bf16();
    g->int_.has_zeros_f32 = v0.zeros_f32 != nullptr;
    g->int_.has_zeros_i8 = v0.zeros_i8 != nullptr;
    g->int_.n = g->n_;
    g->int_.k = g->k_;
    g->int_table_ = DeviceBuffer<WeightOnlyExpert>(table);
    return g;
  }
  if (const auto* f0 = dynamic_cast<const Fp8RuntimeMethod*>(experts[0].get())) {
    const Fp8GemmRuntime& r0 = f0->runtime();
    if (r0.packed || r0.weight_only)
      return refuse(why, "packed 4-bit or weight-only experts have no grouped GEMM yet");
    if (r0.quant.mode == Fp8ActMode::kDynamicTensor)
      return refuse(why, "a dynamic per-tensor activation scale spans an expert's rows");
    std::vector<Fp8Expert> table;
    for (const auto& m : experts) {
      const auto* f = dynamic_cast<const Fp8RuntimeMethod*>(m.get());
      if (!f) return refuse(why, m->prefix() + ": not an fp8-coded expert like expert 0");
      const Fp8GemmRuntime& r = f->runtime();
      if (r.packed || r.weight_only || !same_rule(r.quant, r0.quant) ||
          r.b_block_rows != r0.b_block_rows || r.b_block_cols != r0.b_block_cols ||
          r.alpha != r0.alpha || r.ws.reported_scales || r.ws.doubled_codes)
        return refuse(why, m->prefix() +
                               ": activation rule, block geometry or alpha differ from "
                               "expert 0's");
      table.push_back({r.codes.get(), r.scales.get(), r.bias.get()});
    }
    g->fp8_ = true;
    g->quant_ = r0.quant;
    g->ws_ = r0.ws;
    g->fp8_gemm_.a_group = r0.quant.mode == Fp8ActMode::kDynamicGroup ? r0.quant.group : g->k_;
    g->fp8_gemm_.b_block_rows = r0.b_block_rows;
    g->fp8_gemm_.b_block_cols = r0.b_block_cols;
    g->fp8_gemm_.alpha = r0.alpha;
    g->fp8_gemm_.n = g->n_;
    g->fp8_gemm_.k = g->k_;
    g->fp8_table_ = DeviceBuffer<Fp8Expert>(table);
    return g;
  }
  return refuse(why, to_string(experts[0]->scheme()) + " experts have no grouped GEMM");
}

void GroupedExperts::apply(const __nv_bfloat16* x, __nv_bfloat16* y, int64_t rows,
                           int64_t max_rows_per_expert, const ExpertGroups& groups,
                           cudaStream_t stream, void* workspace) const {
  if (rows == 0) return;
  if (!fp8_) {
    WeightOnlyGemmParams p = int_;
    p.x = x, p.y = y, p.m = max_rows_per_expert;
    p.groups = groups;
    p.experts = int_table_.get();
    launch_weight_only_gemm(p, stream);
    return;
  }
  if (!workspace) throw Error("grouped experts", "fp8 experts need the engine's workspace");
  // Every row quantized at once: the rule is row-local, so each row gets its own codes.
  QuantizeFp8Params q = quant_;
  q.x = x;
  q.q = static_cast<uint8_t*>(workspace);
  q.scales = ActivationWorkspace::at<float>(workspace, ws_.scales_offset(rows));
  q.tensor_amax = ActivationWorkspace::at<float>(workspace, ws_.extra_offset(rows));
  q.m = rows;
  q.k = k_;
  launch_quantize_fp8(q, stream);
  Fp8GemmParams g = fp8_gemm_;
  g.a = q.q;
  g.a_scales = q.scales;
  g.y = y;
  g.m = max_rows_per_expert;
  g.groups = groups;
  g.experts = fp8_table_.get();
  launch_fp8_scaled_gemm(g, stream);
}

}  // namespace qparity::gpu
