#include "gpu_engine/kernels/launch_check.h"
#include "gpu_engine/kernels/moe_routing.h"

namespace qparity::gpu {

namespace {

constexpr int kMaxPerLane = 32;  // experts <= 1024

// One warp per token; lane l holds experts l, l + 32, ...
__global__ void moe_routing_kernel(MoeRoutingParams p) {
  const int64_t t = static_cast<int64_t>(blockIdx.x) * (blockDim.x / 32) + threadIdx.x / 32;
  if (t >= p.tokens) return;
  const int lane = threadIdx.x % 32;
  float v[kMaxPerLane];
  float mx = -INFINITY;
  for (int j = 0; j < kMaxPerLane; ++j) {
    const int64_t e = lane + 32 * j;
    v[j] = e < p.experts ? p.logits[t * p.experts + e] : -INFINITY;
    mx = fmaxf(mx, v[j]);
  }
  for (int off = 16; off > 0; off >>= 1)
    mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, off));
  float sum = 0.f;
  for (int j = 0; j < kMaxPerLane; ++j) {
    v[j] = lane + 32 * j < p.experts ? expf(v[j] - mx) : 0.f;
    sum += v[j];
  }
  for (int off = 16; off > 0; off >>= 1)
    sum += __shfl_xor_sync(0xffffffffu, sum, off);
  for (int j = 0; j < kMaxPerLane; ++j)
    v[j] = lane + 32 * j < p.experts ? v[j] / sum : -1.f;  // taken experts become -1 below
  float picked_sum = 0.f;
  for (int64_t k = 0; k < p.top_k; ++k) {
    // Lane's best (lowest index on ties), then the warp's.
    float best = -2.f;
    int best_e = 1 << 30;
    for (int j = 0; j < kMaxPerLane; ++j)
      if (v[j] > best) best = v[j], best_e = lane + 32 * j;
    for (int off = 16; off > 0; off >>= 1) {
      const float ob = __shfl_xor_sync(0xffffffffu, best, off);
      const int oe = __shfl_xor_sync(0xffffffffu, best_e, off);
      if (ob > best || (ob == best && oe < best_e)) best = ob, best_e = oe;
    }
    const bool none = best_e == (1 << 30);  // NaN logits: no expert compares above -2
    if (!none && lane == best_e % 32) v[best_e / 32] = -1.f;
    if (lane == 0) {
      p.ids[t * p.top_k + k] = none ? -1 : best_e;
      p.weights[t * p.top_k + k] = none ? NAN : best;
    }
    picked_sum += best;
  }
  if (p.norm_topk_prob && lane == 0)
    for (int64_t k = 0; k < p.top_k; ++k)
      p.weights[t * p.top_k + k] /= picked_sum;
}

}  // namespace

void launch_moe_routing(const MoeRoutingParams& p, cudaStream_t stream) {
  constexpr const char* k = "moe_routing";
  require(p.logits && p.ids && p.weights, k, "logits, ids and weights are required");
  require(p.experts > 0 && p.experts <= 32 * kMaxPerLane, k,
          "experts " + std::to_string(p.experts) + " outside [1, 1024]");
  require(p.top_k >= 1 && p.top_k <= p.experts && p.top_k <= 32, k,
          "top_k " + std::to_string(p.top_k) + " outside [1, min(experts, 32)]");
  require(p.tokens >= 0, k, "tokens >= 0");
  if (p.tokens == 0) return;
  constexpr int kTokensPerBlock = 4;
  moe_routing_kernel<<<static_cast<unsigned>((p.tokens + kTokensPerBlock - 1) / kTokensPerBlock),
                       kTokensPerBlock * 32, 0, stream>>>(p);
  check_launch(k);
}

}  // namespace qparity::gpu
