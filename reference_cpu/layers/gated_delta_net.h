#pragma once
// Qwen3.5's Gated DeltaNet token mixer (transformers 5.17 Qwen3_5GatedDeltaNet, with FLA's
// gated delta rule), in fp64. Sizes: HK key heads and HV value heads (r = HV / HK value heads per
// key head; value head j reads key head j / r), dk / dv per head, C = 2 HK dk + HV dv conv
// channels [q | k | v], K conv taps. Per token t, in this order:
//
//   conv     c_t[ch] = silu(sum_{s=0..K-1} w[ch, s] * x_{t-K+1+s}[ch])   s ascending; x_u = 0 for
//            u before the sequence (nn.Conv1d(padding = K - 1) keeps the first T outputs); the
//            state holds the last K - 1 *pre-conv* rows, as causal_conv1d_update's does
//   split    q = c[0, HK dk), k = c[HK dk, 2 HK dk), v = c[2 HK dk, C), each head contiguous
//   gates    beta_t[j] = 1 / (1 + exp(-b_t[j]))
//            g_t[j]    = -exp(A_log[j]) * softplus(a_t[j] + dt_bias[j]),
//            softplus(x) = x when x > 20, else log1p(exp(x))   (torch's threshold 20, as vLLM's
//            and FLA's gating kernels use it)
//   l2 norm  q̂ = q * (1 / sqrt(sum q^2 + 1e-6)), k̂ likewise (per key head, sum ascending; HF
//            l2norm: x * rsqrt(sum x^2 + eps)); q̃ = q̂ * (1 / sqrt(dk))
//   rule     per value head j (key head h = j / r), state S [dk, dv]:
//              S        = exp(g_t[j]) * S                      (decay before the read)
//              u[e]     = sum_d S[d, e] * k̂[h][d]              d ascending
//              delta[e] = (v[j][e] - u[e]) * beta_t[j]
//              S[d, e]  = S[d, e] + k̂[h][d] * delta[e]
//              o[j][e]  = sum_d S[d, e] * q̃[h][d]              (the updated state: t sees itself)
//   norm     y[j][e] = (w[e] * (o[j][e] * rstd_j)) * silu(z_t[j][e]),
//            rstd_j = 1 / sqrt(sum_e o[j][e]^2 / dv + eps)   (Qwen3_5RMSNormGated: plain w,
//            norm before gate)
// silu(x) = x / (1 + exp(-x)). The recurrence is the sequential (token-by-token) form: a prefill
// of T tokens performs exactly the operations of T one-token decode steps, so the two agree bit
// for bit. Transformers' prefill uses the chunked (WY / UT-transform, chunk 64) form of the same
// recurrence, equal in exact arithmetic and different only in summation order (the unit tests
// check the two agree to 1e-13 in fp64).
//
// fp32_state (emulate mode): the state is rounded to fp32 after every token's update, as engines
// (transformers, FLA, vLLM) keep it in fp32; everything else stays fp64.
#include <cstdint>
#include <vector>

#include "core/config/model_config.h"
#include "schemes/loading/layer_weights.h"  // GatedDeltaNetParams
#include "schemes/math/matmul.h"

namespace qparity::reference {

// What a sequence leaves behind for the next call (decode).
struct GatedDeltaNetState {
  Matrix conv_inputs;     // the last K - 1 pre-conv rows [K - 1, C]; zeros on a fresh sequence
  std::vector<double> s;  // [HV, dk, dv]; zeros on a fresh sequence
  void reset(const LinearAttentionDims& d);
  bool empty() const { return s.empty(); }
};

// x [T, C] (in_proj_qkv's output) -> silu(causal conv) [T, C]; appends x to the conv state.
Matrix causal_conv_silu(const Matrix& x, const GatedDeltaNetParams& p, GatedDeltaNetState& st);

// b, a [T, HV] -> beta [T, HV], g [T, HV] as the header states.
void delta_rule_gates(const Matrix& b, const Matrix& a, const GatedDeltaNetParams& p, Matrix& beta,
                      Matrix& g);

// conv [T, C], beta / g [T, HV] -> o [T, HV dv], advancing st.s token by token. states, when
// given, receives the state after each token [T, HV dk dv].
Matrix gated_delta_rule(const Matrix& conv, const Matrix& beta, const Matrix& g,
                        const GatedDeltaNetParams& p, GatedDeltaNetState& st, bool fp32_state,
                        Matrix* states = nullptr);

// o, z [T, HV dv] -> the gated norm's output [T, HV dv].
Matrix gated_rms_norm(const Matrix& o, const Matrix& z, const GatedDeltaNetParams& p);

}  // namespace qparity::reference
