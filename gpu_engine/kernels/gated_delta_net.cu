#include <string>

#include "gpu_engine/kernels/gated_delta_net.h"
#include "gpu_engine/kernels/launch_check.h"
#include "gpu_engine/kernels/pdl.h"

namespace qparity::gpu {

namespace {

constexpr int kConvThreads = 128;
constexpr int kTile = 32;  // value columns a recurrence block owns (one warp, a column a lane)

__device__ __forceinline__ float warp_sum(float v) {
  for (int o = 16; o > 0; o >>= 1)
    v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;  // every lane holds the same sum
}

__device__ __forceinline__ float silu(float x) {
  return x / (1.f + expf(-x));
}

// Pre-conv value of channel ch at position u of token i's sequence, `back` = pos - u rows back:
// a batch row (the d earlier rows of this run), the slot's state (rows before the run), or zero
// before the sequence.
__device__ __forceinline__ float conv_input(const GdnConvParams& p, int64_t i, int32_t slot,
                                            int32_t u, int back, int d, int64_t ch) {
  if (back <= d) return __bfloat162float(p.x[(i - back) * p.x_stride + ch]);
  if (u < 0) return 0.f;
  const int64_t k1 = p.taps - 1;
  const int64_t row = k1 - (back - d);  // the state's last row is the position before the run
  return __bfloat162float(p.conv_state[(static_cast<int64_t>(slot) * k1 + row) * p.channels + ch]);
}

__global__ void gdn_conv_kernel(GdnConvParams p) {
  pdl_launch_dependents();
  pdl_wait();
  const int64_t i = blockIdx.x;
  const int64_t ch = static_cast<int64_t>(blockIdx.y) * kConvThreads + threadIdx.x;
  if (ch >= p.channels) return;
  const int32_t slot = p.slots[i], pos = p.positions[i];
  // Earlier rows of this token's run, up to taps - 1: matched by slot alone, which is sound
  // because the host refuses a batch whose slot tokens are not one run at consecutive positions
  // (engine.cpp recurrent_runs).
  int d = 0;
  while (d < p.taps - 1 && i - d - 1 >= 0 && p.slots[i - d - 1] == slot)
    ++d;
  float acc = 0.f;
  for (int s = 0; s < p.taps; ++s) {
    const int back = static_cast<int>(p.taps) - 1 - s;
    acc += p.weight[ch * p.taps + s] * conv_input(p, i, slot, pos - back, back, d, ch);
  }
  p.out[i * p.channels + ch] = __float2bfloat16_rn(silu(acc));
}

__global__ void gdn_conv_state_kernel(GdnConvParams p) {
  pdl_launch_dependents();
  pdl_wait();
  const int64_t r = blockIdx.x;
  const int64_t ch = static_cast<int64_t>(blockIdx.y) * kConvThreads + threadIdx.x;
  if (r >= p.runs[0] || ch >= p.channels) return;
  const int32_t first = p.runs[1 + 2 * r], n = p.runs[2 + 2 * r];
  const int32_t slot = p.slots[first], p0 = p.positions[first];
  const int32_t k1 = static_cast<int32_t>(p.taps) - 1;
  __nv_bfloat16* st = p.conv_state + static_cast<int64_t>(slot) * k1 * p.channels + ch;
  // Row rr takes position p0 + n - k1 + rr. An older state row it needs sits at rr + n > rr:
  // ascending rr reads each before it is replaced.
  for (int32_t rr = 0; rr < k1; ++rr) {
    const int32_t u = p0 + n - k1 + rr;
    __nv_bfloat16 v = __float2bfloat16_rn(0.f);
    if (u >= p0)
      v = p.x[static_cast<int64_t>(first + (u - p0)) * p.x_stride + ch];
    else if (u >= 0)
      v = st[static_cast<int64_t>(rr + n) * p.channels];
    st[static_cast<int64_t>(rr) * p.channels] = v;
  }
}

__global__ void gdn_recurrence_kernel(GdnRecurrenceParams p) {
  pdl_launch_dependents();
  pdl_wait();
  const int64_t r = blockIdx.x;
  if (r >= p.runs[0]) return;
  extern __shared__ float smem[];
  const int64_t dk = p.key_dim, dv = p.value_dim, hv = p.value_heads;
  float* s = smem;             // [dk][kTile]: column lane of the tile's state
  float* qn = s + dk * kTile;  // [dk]
  float* kn = qn + dk;         // [dk]
  const int lane = threadIdx.x;
  const int64_t j = blockIdx.y, h = j / (hv / p.key_heads);
  const int64_t e = static_cast<int64_t>(blockIdx.z) * kTile + lane;
  const bool col = e < dv;
  const int32_t first = p.runs[1 + 2 * r], n = p.runs[2 + 2 * r];
  const int32_t slot = p.slots[first];
  float* slot_state = p.state + (static_cast<int64_t>(slot) * hv + j) * dk * dv;
  const bool fresh = p.positions[first] == 0;
  for (int64_t d = 0; d < dk; ++d)
    s[d * kTile + lane] = col && !fresh ? slot_state[d * dv + e] : 0.f;
  const float a_log = p.a_log[j], dt_bias = p.dt_bias[j];
  const float q_scale = rsqrtf(static_cast<float>(dk));
  for (int32_t t = 0; t < n; ++t) {
    const int64_t i = first + t;
    const __nv_bfloat16* row = p.conv + i * p.conv_stride;
    float sq = 0.f, sk = 0.f;
    for (int64_t d = lane; d < dk; d += 32) {
      const float qv = __bfloat162float(row[h * dk + d]);
      const float kv = __bfloat162float(row[p.key_heads * dk + h * dk + d]);
      qn[d] = qv, kn[d] = kv;
      sq += qv * qv, sk += kv * kv;
    }
    const float rq = rsqrtf(warp_sum(sq) + 1e-6f) * q_scale, rk = rsqrtf(warp_sum(sk) + 1e-6f);
    __syncwarp();
    const float b = __bfloat162float(p.ba[i * p.ba_stride + j]);
    const float a = __bfloat162float(p.ba[i * p.ba_stride + hv + j]) + dt_bias;
    const float beta = 1.f / (1.f + expf(-b));
    const float g = -expf(a_log) * (a > 20.f ? a : log1pf(expf(a)));  // torch's softplus
    if (blockIdx.z == 0 && lane == 0) {
      p.beta_out[i * hv + j] = beta;
      p.decay_out[i * hv + j] = g;
    }
    const float decay = expf(g);
    const float v = col ? __bfloat162float(row[2 * p.key_heads * dk + j * dv + e]) : 0.f;
    float u = 0.f;
    for (int64_t d = 0; d < dk; ++d) {
      float& x = s[d * kTile + lane];
      x *= decay;
      u += x * (kn[d] * rk);
    }
    const float delta = (v - u) * beta;
    float o = 0.f;
    for (int64_t d = 0; d < dk; ++d) {
      float& x = s[d * kTile + lane];
      x += (kn[d] * rk) * delta;
      o += x * (qn[d] * rq);
    }
    if (col) {
      p.out[i * hv * dv + j * dv + e] = __float2bfloat16_rn(o);
      if (p.states_out)
        for (int64_t d = 0; d < dk; ++d)
          p.states_out[((i * hv + j) * dk + d) * dv + e] = s[d * kTile + lane];
    }
    __syncwarp();  // every lane is done with qn / kn before the next token's
  }
  if (col)
    for (int64_t d = 0; d < dk; ++d)
      slot_state[d * dv + e] = s[d * kTile + lane];
}

__global__ void gdn_gated_norm_kernel(GdnGatedNormParams p) {
  pdl_launch_dependents();
  pdl_wait();
  const int64_t i = blockIdx.x / p.heads, hh = blockIdx.x % p.heads;
  const int lane = threadIdx.x;
  const __nv_bfloat16* o = p.o + i * p.heads * p.dim + hh * p.dim;
  float ss = 0.f;
  for (int64_t e = lane; e < p.dim; e += 32) {
    const float v = __bfloat162float(o[e]);
    ss += v * v;
  }
  const float r = rsqrtf(warp_sum(ss) / static_cast<float>(p.dim) + p.eps);
  const __nv_bfloat16* z = p.z + i * p.z_stride + hh * p.dim;
  __nv_bfloat16* out = p.out + i * p.heads * p.dim + hh * p.dim;
  for (int64_t e = lane; e < p.dim; e += 32)
    out[e] = __float2bfloat16_rn(p.weight[e] * (__bfloat162float(o[e]) * r) *
                                 silu(__bfloat162float(z[e])));
}

void check_runs(const char* k, const int32_t* runs, int64_t max_runs, const int32_t* slots,
                const int32_t* positions, int64_t tokens) {
  require(runs && slots && positions, k, "runs, slots and positions are required");
  // (the runs themselves are the host's: engine.cpp builds and checks them)
  require(max_runs >= 1 && max_runs <= tokens, k,
          "max_runs " + std::to_string(max_runs) + " outside [1, tokens]");
}

}  // namespace

void launch_gdn_conv(const GdnConvParams& p, cudaStream_t stream) {
  constexpr const char* k = "gdn_conv";
  require(p.x && p.weight && p.conv_state && p.out, k, "x, weight, conv_state and out");
  require(p.channels > 0 && p.taps >= 2 && p.x_stride >= p.channels, k,
          "channels > 0, taps >= 2, x_stride >= channels");
  require(p.slots && p.positions, k, "slots and positions are required");
  if (p.tokens == 0) return;
  const dim3 grid(static_cast<unsigned>(p.tokens),
                  static_cast<unsigned>((p.channels + kConvThreads - 1) / kConvThreads));
  launch_pdl(k, gdn_conv_kernel, grid, dim3(kConvThreads), 0, stream, p);
}

void launch_gdn_conv_state_update(const GdnConvParams& p, cudaStream_t stream) {
  constexpr const char* k = "gdn_conv_state_update";
  require(p.x && p.conv_state, k, "x and conv_state");
  require(p.channels > 0 && p.taps >= 2, k, "channels > 0, taps >= 2");
  if (p.tokens == 0) return;
  check_runs(k, p.runs, p.max_runs, p.slots, p.positions, p.tokens);
  const dim3 grid(static_cast<unsigned>(p.max_runs),
                  static_cast<unsigned>((p.channels + kConvThreads - 1) / kConvThreads));
  launch_pdl(k, gdn_conv_state_kernel, grid, dim3(kConvThreads), 0, stream, p);
}

void launch_gdn_recurrence(const GdnRecurrenceParams& p, cudaStream_t stream) {
  constexpr const char* k = "gdn_recurrence";
  require(p.conv && p.ba && p.a_log && p.dt_bias && p.state && p.beta_out && p.decay_out && p.out,
          k, "conv, ba, a_log, dt_bias, state, beta_out, decay_out and out");
  require(p.key_heads > 0 && p.value_heads % p.key_heads == 0, k,
          "value heads must be a multiple of key heads");
  // (dk + 2 dk / 32) * 32 floats of shared memory: dk <= 256 stays within the default 48 KiB.
  require(p.key_dim > 0 && p.key_dim <= 256 && p.value_dim > 0, k,
          "key_dim in (0, 256], value_dim > 0");
  if (p.tokens == 0) return;
  check_runs(k, p.runs, p.max_runs, p.slots, p.positions, p.tokens);
  const size_t smem = static_cast<size_t>(p.key_dim) * (kTile + 2) * sizeof(float);
  const dim3 grid(static_cast<unsigned>(p.max_runs), static_cast<unsigned>(p.value_heads),
                  static_cast<unsigned>((p.value_dim + kTile - 1) / kTile));
  launch_pdl(k, gdn_recurrence_kernel, grid, dim3(kTile), smem, stream, p);
}

void launch_gdn_gated_norm(const GdnGatedNormParams& p, cudaStream_t stream) {
  constexpr const char* k = "gdn_gated_norm";
  require(p.o && p.z && p.weight && p.out, k, "o, z, weight and out");
  require(p.heads > 0 && p.dim > 0 && p.z_stride >= p.heads * p.dim, k,
          "heads > 0, dim > 0, z_stride >= heads * dim");
  if (p.tokens == 0) return;
  launch_pdl(k, gdn_gated_norm_kernel, dim3(static_cast<unsigned>(p.tokens * p.heads)), dim3(32), 0,
             stream, p);
}

}  // namespace qparity::gpu
