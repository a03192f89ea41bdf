#include "gpu_engine/kernels/attention_parts.cuh"
#include "gpu_engine/kernels/decode_attention.h"
#include "gpu_engine/kernels/launch_check.h"
#include "gpu_engine/kernels/paged_attention.h"
#include "gpu_engine/kernels/pdl.h"

namespace qparity::gpu {

namespace {

constexpr int kWarps = 8;  // warps per (token, head, chunk) block
constexpr int kKeys = 8;   // keys per warp step, all their K and V loads in flight at once
constexpr int kStep = kWarps * kKeys;
constexpr int kMaxTable = 1024;  // block-table entries of one chunk (staged in shared memory)
static_assert(kMaxTable % (kWarps * 32) == 0, "the table is staged kMaxTable / threads a thread");
constexpr int kMaxPerLane = 8;  // head_dim <= 256

// Lane l holds elements l*kPerLane .. l*kPerLane+kPerLane-1 of a head. RoPE pairs element e with
// e + head_dim/2, held by lane l ^ 16 in the same slot (head_dim/2 / kPerLane = 16).
template <int kPerLane>
struct HeadRope {
  double c[kPerLane], s[kPerLane];
  __device__ __forceinline__ void angles(int64_t pos, const double* inv_freq, double scaling,
                                         int lane) {
#pragma unroll
    for (int j = 0; j < kPerLane; ++j) {
      sincos(static_cast<double>(pos) * inv_freq[(lane & 15) * kPerLane + j], &s[j], &c[j]);
      c[j] *= scaling;
      s[j] *= scaling;
    }
  }
};

// One head (the lane's slice, raw, in `normed`): the optional per-head RMSNorm (fp32, rounded to
// bf16) in place, then RoPE (fp64, rounded to bf16) into `roped`. Every lane of the warp takes
// part (shuffles).
template <int kPerLane>
__device__ __forceinline__ void norm_rope(const float (&w)[kPerLane], bool norm, float eps,
                                          int64_t d, const HeadRope<kPerLane>& r, int lane,
                                          PackedRow<kPerLane>& normed, PackedRow<kPerLane>& roped) {
  if (norm) {
    float sum = 0.f;
#pragma unroll
    for (int j = 0; j < kPerLane; ++j)
      sum += normed.at(j) * normed.at(j);
#pragma unroll
    for (int o = 16; o > 0; o >>= 1)
      sum += __shfl_xor_sync(0xffffffffu, sum, o);
    const float rs = rsqrtf(sum / static_cast<float>(d) + eps);
#pragma unroll
    for (int j = 0; j < kPerLane; ++j)
      normed.set(j, __float2bfloat16_rn(w[j] * (normed.at(j) * rs)));
  }
  const bool low = lane < 16;  // elements below head_dim/2
#pragma unroll
  for (int j = 0; j < kPerLane; ++j) {
    const double x = normed.at(j);
    const double partner = __shfl_xor_sync(0xffffffffu, normed.at(j), 16);
    roped.set(
        j, __double2bfloat16(low ? x * r.c[j] - partner * r.s[j] : x * r.c[j] + partner * r.s[j]));
  }
}

template <int kPerLane>
__device__ __forceinline__ void store_row(__nv_bfloat16* dst, const PackedRow<kPerLane>& row) {
#pragma unroll
  for (int j = 0; j < kPerLane; ++j)
    dst[j] = row.bf16_at(j);
}

template <int kPerLane>
__global__ void __launch_bounds__(kWarps * 32, 2) decode_attention_kernel(DecodeAttentionParams p) {
  probe_entry(p.probe);
  pdl_launch_dependents();
  const int64_t i = blockIdx.x, h = blockIdx.y, c = blockIdx.z;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int64_t d = p.head_dim, nq = p.num_heads, nkv = p.num_kv_heads;
  const int64_t group = nq / nkv, kv_h = h / group;
  // Before the wait: only the batch's positions, the block table, weights and cached keys. The
  // chain up to the cached keys' requests is one round trip (positions, table entries and the
  // batch's tokens together; with token_table the entries need neither the sequence nor the
  // position), then the requests; the RoPE angles and norm weights follow while they fly. A
  // block made resident only near the release (all of them do not fit beside the qkv GEMM's) has
  // its keys that much sooner.
  __shared__ int32_t table[kMaxTable];
  __shared__ int32_t batch_seq[kDecodeAttentionMaxTokens], batch_pos[kDecodeAttentionMaxTokens];
  const int32_t bs = static_cast<int32_t>(p.block_size);
  // Every entry a chunk can touch (a bound that needs neither the position nor, with
  // token_table, the sequence).
  const int64_t begin = c * p.chunk;
  const int64_t first_block = begin / bs;
  const int64_t blocks = min(p.chunk / bs + 2, p.max_blocks_per_seq - first_block);
  const int32_t s = p.seq[i];
  const int64_t last = p.positions[i];
  const int32_t* row = p.token_table ? p.token_table + i * p.max_blocks_per_seq
                                     : p.block_table + s * p.max_blocks_per_seq;
  // All loads first, then the stores: a store waits for its load, and the next loads would wait
  // behind it.
  constexpr int kTablePerThread = kMaxTable / (kWarps * 32);
  int32_t entry[kTablePerThread];
#pragma unroll
  for (int r = 0; r < kTablePerThread; ++r) {
    const int64_t j = threadIdx.x + r * kWarps * 32;
    entry[r] = j < blocks ? row[first_block + j] : 0;
  }
  const bool holds_token = threadIdx.x < p.tokens;
  const int32_t token_seq = holds_token ? p.seq[threadIdx.x] : 0;
  const int32_t token_pos = holds_token ? p.positions[threadIdx.x] : 0;
#pragma unroll
  for (int r = 0; r < kTablePerThread; ++r) {
    const int64_t j = threadIdx.x + r * kWarps * 32;
    if (j < blocks) table[j] = entry[r];
  }
  if (holds_token) {
    batch_seq[threadIdx.x] = token_seq;
    batch_pos[threadIdx.x] = token_pos;
  }
  const int64_t chunks = last / p.chunk + 1;
  __nv_bfloat16* op = p.out + i * p.out_stride + h * d;
  if (chunks > p.max_chunks) {  // keys beyond the last chunk: refuse loudly, never drop them
    pdl_wait();
    if (c == 0)
      for (int64_t e = threadIdx.x; e < d; e += blockDim.x)
        op[e] = __float2bfloat16_rn(NAN);
    return;
  }
  if (c >= chunks) return;  // writes nothing: no need to wait
  __syncthreads();  // (block-uniform: every thread of a block takes the same branches above)
  const int64_t end = last + 1 < begin + p.chunk ? last + 1 : begin + p.chunk;  // [begin, end)
  const int ntok = static_cast<int>(p.tokens);
  // The batch token holding position `key` of this sequence, or -1 (the key is cached).
  const auto batch_token = [&](int64_t key) {
    for (int j = 0; j < ntok; ++j)
      if (batch_seq[j] == s && batch_pos[j] == key) return j;
    return -1;
  };
  const auto cache_at = [&](int64_t key) {
    const int32_t kb = static_cast<int32_t>(key) / bs;
    return ((static_cast<int64_t>(table[kb - first_block]) * bs +
             (static_cast<int32_t>(key) - kb * bs)) *
                nkv +
            kv_h) *
           d;
  };
  PackedRow<kPerLane> kv[kKeys], vv[kKeys];
  int src[kKeys];  // per key of the current step: the batch token holding it, or -1
#pragma unroll
  for (int u = 0; u < kKeys; ++u)
    src[u] = -1;  // a warp whose first step is past the chunk's end has no keys at all
  const auto load_cached = [&](int64_t base) {
#pragma unroll
    for (int u = 0; u < kKeys; ++u) {
      const int64_t key = base + u;
      src[u] = key < end ? batch_token(key) : -1;
      if (key < end && src[u] < 0) {
        const int64_t o = cache_at(key) + lane * kPerLane;
        kv[u].load(p.k_cache + o);
        vv[u].load(p.v_cache + o);
      } else {
        kv[u].zero();
        vv[u].zero();
      }
    }
  };
  int64_t base = begin + static_cast<int64_t>(warp) * kKeys;
  if (base < end) load_cached(base);  // the first step's cached keys stream during the wait
  // RoPE at the token's own position (its q and its own key), one angle per frequency, shared
  // by the block's warps.
  __shared__ double rope_c[kMaxPerLane * 16], rope_s[kMaxPerLane * 16];
  for (int64_t f = threadIdx.x; f < d / 2; f += blockDim.x) {
    double sn, cs;
    sincos(static_cast<double>(last) * p.inv_freq[f], &sn, &cs);
    rope_c[f] = cs * p.rope_scaling;
    rope_s[f] = sn * p.rope_scaling;
  }
  const bool norm = p.q_norm != nullptr;
  PackedRow<kPerLane> qw_raw, kw_raw;  // converted where used, after the wait
  if (norm) {
    qw_raw.load(p.q_norm + lane * kPerLane);
    kw_raw.load(p.k_norm + lane * kPerLane);
  } else {
    qw_raw.zero();
    kw_raw.zero();
  }
  __syncthreads();

  pdl_wait();
  probe_release(p.probe);
  // The rows this forward wrote: q, and the first step's batch keys, loaded together.
  const __nv_bfloat16* row_i = p.qkv + i * p.qkv_stride;
  const auto load_new = [&] {
#pragma unroll
    for (int u = 0; u < kKeys; ++u) {
      if (src[u] < 0) continue;
      const __nv_bfloat16* row_j = p.qkv + src[u] * p.qkv_stride;
      kv[u].load(row_j + (nq + kv_h) * d + lane * kPerLane);
      vv[u].load(row_j + (nq + nkv + kv_h) * d + lane * kPerLane);
    }
  };
  load_new();
  float qw[kPerLane], kw[kPerLane];
#pragma unroll
  for (int j = 0; j < kPerLane; ++j) {
    qw[j] = qw_raw.at(j);
    kw[j] = kw_raw.at(j);
  }
  HeadRope<kPerLane> rope;
#pragma unroll
  for (int j = 0; j < kPerLane; ++j) {
    const int f = (lane & 15) * kPerLane + j;
    rope.c[j] = rope_c[f];
    rope.s[j] = rope_s[f];
  }
  float q[kPerLane];
  {
    PackedRow<kPerLane> normed, roped;
    normed.load(row_i + h * d + lane * kPerLane);
    norm_rope(qw, norm, p.eps, d, rope, lane, normed, roped);
#pragma unroll
    for (int j = 0; j < kPerLane; ++j)
      q[j] = roped.at(j) * p.scale;
    if (c == 0 && warp == 0) {  // the q captures, once per (token, head)
      const int64_t at = i * (nq + nkv) * d + h * d + lane * kPerLane;
      if (p.normed_out) store_row(p.normed_out + at, normed);
      if (p.rope_out) store_row(p.rope_out + at, roped);
    }
  }
  float m = -INFINITY, l = 0.f, acc[kPerLane];
#pragma unroll
  for (int j = 0; j < kPerLane; ++j)
    acc[j] = 0.f;
  for (bool first = true; base < end; base += kStep, first = false) {
    if (!first) {
      load_cached(base);
      load_new();
    }
    // Keys this batch holds: computed from their token's qkv row (warp-uniform: src depends on
    // the key only). The token's own key is also written to the cache, by one block.
#pragma unroll
    for (int u = 0; u < kKeys; ++u) {
      const int j = src[u];
      if (j < 0) continue;
      HeadRope<kPerLane> rj;
      if (batch_pos[j] == last)
        rj = rope;
      else  // another token of this sequence in the batch (a short prefill): its own angles
        rj.angles(batch_pos[j], p.inv_freq, p.rope_scaling, lane);
      PackedRow<kPerLane> normed = kv[u];  // the raw k slice load_new fetched
      norm_rope(kw, norm, p.eps, d, rj, lane, normed, kv[u]);
      if (j == i && h == kv_h * group) {  // token i's own K/V: into the cache, and its captures
        const int64_t o = cache_at(base + u) + lane * kPerLane;
        store_row(p.k_cache + o, kv[u]);
        store_row(p.v_cache + o, vv[u]);
        const int64_t at = i * (nq + nkv) * d + (nq + kv_h) * d + lane * kPerLane;
        if (p.normed_out) store_row(p.normed_out + at, normed);
        if (p.rope_out) store_row(p.rope_out + at, kv[u]);
      }
    }
    online_softmax_step(q, kv, vv, base, end, m, l, acc);
  }
  // Merge the warps' partial softmax states in warp order.
  __shared__ float sm[kWarps], sl[kWarps];
  __shared__ float sacc[kWarps][kMaxPerLane * 32];
  float mm, ll;
  gather_warp_states(m, l, acc, warp, lane, sm, sl, sacc, mm, ll);
  finish_chunk(sm, sl, sacc, mm, ll, i * nq + h, c, chunks, p.max_chunks, d, p.partial_acc,
               p.partial_ml, p.chunks_done, op);
  probe_exit(p.probe);
}

template <int kPerLane>
void launch_per_lane(const DecodeAttentionParams& p, cudaStream_t stream) {
  const dim3 grid(static_cast<unsigned>(p.tokens), static_cast<unsigned>(p.num_heads),
                  static_cast<unsigned>(p.max_chunks));
  launch_pdl("decode_attention", decode_attention_kernel<kPerLane>, grid, dim3(kWarps * 32), 0,
             stream, p);
}

}  // namespace

void launch_decode_attention(const DecodeAttentionParams& p, cudaStream_t stream) {
  constexpr const char* k = "decode_attention";
  require(p.qkv && p.positions && p.seq && p.inv_freq && p.k_cache && p.v_cache && p.block_table &&
              p.out,
          k, "qkv, positions, seq, inv_freq, the caches, block_table and out are required");
  require(!p.q_norm == !p.k_norm, k, "q_norm and k_norm come together");
  require(p.head_dim % 32 == 0 && p.head_dim > 0 && p.head_dim <= 32 * kMaxPerLane, k,
          "head_dim " + std::to_string(p.head_dim) + " must be a multiple of 32 in [32, 256]");
  require(p.tokens >= 0 && p.tokens <= kDecodeAttentionMaxTokens, k,
          "tokens " + std::to_string(p.tokens) + " outside [0, " +
              std::to_string(kDecodeAttentionMaxTokens) + "]");
  require_attention_shapes(k, p.k_cache, p.v_cache, p.num_heads, p.num_kv_heads, p.head_dim,
                           p.block_size, p.max_blocks_per_seq, p.out_stride, p.out_stride, p.scale);
  require(p.qkv_stride >= (p.num_heads + 2 * p.num_kv_heads) * p.head_dim, k,
          "qkv_stride < (num_heads + 2 * num_kv_heads) * head_dim");
  require(aligned(p.qkv, 16) && p.qkv_stride % 8 == 0, k,
          "qkv must be 16-byte aligned with a stride that keeps rows aligned");
  require(p.eps >= 0, k, "eps must be >= 0");
  require_attention_chunks(k, p.chunk, kStep, p.block_size, kMaxTable, p.max_chunks, p.partial_acc,
                           p.partial_ml, p.chunks_done);
  if (p.tokens == 0) return;
  with_per_lane(p.head_dim, [&]<int kPerLane>() { launch_per_lane<kPerLane>(p, stream); });
}

}  // namespace qparity::gpu
