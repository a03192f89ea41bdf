#pragma once
// Qwen3.5's Gated DeltaNet token mixer on the GPU: the steps after the fused input projection
// (whose row is [q | k | v | z | b | a], in_proj_qkv, in_proj_z, in_proj_b, in_proj_a), the same
// order and formulas as the reference (reference_cpu/layers/gated_delta_net.h), in fp32:
//
//   gdn_conv              c = bf16(silu(sum_s w[ch, s] * x_{t-K+1+s}[ch]))   fp32, s ascending
//   gdn_conv_state_update the slot's last K - 1 pre-conv rows, for the next forward
//   gdn_recurrence        beta = sigmoid(b), g = -exp(A_log) * softplus(a + dt_bias) (fp32
//                         outputs), l2-normalized q and k (q also / sqrt(dk)), then per token
//                         S = exp(g) S; u = S^T k; delta = (v - u) beta; S += k delta^T;
//                         o = bf16(S^T q)   (S fp32, kept in the slot between forwards)
//   gdn_gated_norm        y = bf16(w[e] * (o[e] * rstd) * silu(z[e])), rstd over the head's dv
//
// Sequences: a forward's tokens of one slot are consecutive rows at consecutive positions (the
// engine checks it on the host, engine.cpp), given as runs [count, first row, rows, ...]. The
// recurrent state of a slot lives between forwards in `conv_state` [max_seqs, K - 1, C] (bf16:
// the pre-conv rows are bf16 tensors) and `state` [max_seqs, HV, dk, dv] (fp32, as FLA and vLLM
// keep it). A run starting at position 0 starts from zeros whatever the slot holds, so a slot is
// reused without a reset launch.
//
// Summation orders: the conv and each per-column dot product of the state run in the
// reference's order (taps ascending, d ascending); the l2 norms and the gated norm's mean square
// are warp reductions. Sequential over a run's tokens (the recurrence's own dependency), parallel
// over value heads and 32-column tiles of dv.
#include <cuda_bf16.h>
#include <cuda_runtime_api.h>

#include <cstdint>

namespace qparity::gpu {

struct GdnConvParams {
  const __nv_bfloat16* x = nullptr;  // [tokens, x_stride]: the pre-conv rows in [0, channels)
  int64_t x_stride = 0;
  const float* weight = nullptr;        // [channels, taps]; tap taps - 1 takes the newest row
  __nv_bfloat16* conv_state = nullptr;  // [max_seqs, taps - 1, channels]
  const int32_t* slots = nullptr;       // [tokens]
  const int32_t* positions = nullptr;   // [tokens]
  const int32_t* runs = nullptr;        // [1 + 2 max_runs]
  int64_t max_runs = 0;
  __nv_bfloat16* out = nullptr;  // [tokens, channels]
  int64_t tokens = 0, channels = 0, taps = 0;
};

// silu(causal conv) into out; reads the slots' conv_state (not written).
void launch_gdn_conv(const GdnConvParams& p, cudaStream_t stream);
// Then each run's slot keeps its last taps - 1 pre-conv rows (batch rows, older state rows, or
// zeros before position 0). A separate launch: the conv above reads the rows it replaces.
void launch_gdn_conv_state_update(const GdnConvParams& p, cudaStream_t stream);

struct GdnRecurrenceParams {
  const __nv_bfloat16* conv = nullptr;  // [tokens, conv_stride]: q | k | v (gdn_conv's out)
  int64_t conv_stride = 0;
  const __nv_bfloat16* ba = nullptr;  // b at [0, hv), a at [hv, 2 hv) of each row
  int64_t ba_stride = 0;
  const float* a_log = nullptr;    // [hv]
  const float* dt_bias = nullptr;  // [hv]
  float* state = nullptr;          // [max_seqs, hv, dk, dv]
  const int32_t* slots = nullptr;
  const int32_t* positions = nullptr;
  const int32_t* runs = nullptr;
  int64_t max_runs = 0;
  float* beta_out = nullptr;     // [tokens, hv]
  float* decay_out = nullptr;    // [tokens, hv]: g, the log-space decay
  float* states_out = nullptr;   // optional [tokens, hv, dk, dv]: S after each token (capture)
  __nv_bfloat16* out = nullptr;  // [tokens, hv * dv]
  int64_t tokens = 0, key_heads = 0, value_heads = 0, key_dim = 0, value_dim = 0;
};

void launch_gdn_recurrence(const GdnRecurrenceParams& p, cudaStream_t stream);

struct GdnGatedNormParams {
  const __nv_bfloat16* o = nullptr;  // [tokens, heads * dim]
  const __nv_bfloat16* z = nullptr;  // [tokens, z_stride]: the gate in [0, heads * dim)
  int64_t z_stride = 0;
  const float* weight = nullptr;  // [dim], plain (not zero-centred)
  __nv_bfloat16* out = nullptr;   // [tokens, heads * dim]
  int64_t tokens = 0, heads = 0, dim = 0;
  float eps = 1e-6f;
};

void launch_gdn_gated_norm(const GdnGatedNormParams& p, cudaStream_t stream);

}  // namespace qparity::gpu
