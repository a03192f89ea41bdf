#include <climits>

#include "gpu_engine/cuda_check.h"
#include "gpu_engine/kernels/attention_parts.cuh"
#include "gpu_engine/kernels/decode_attention.h"
#include "gpu_engine/kernels/kv_quant.cuh"
#include "gpu_engine/kernels/launch_check.h"
#include "gpu_engine/kernels/paged_attention.h"
#include "gpu_engine/kernels/pdl.h"

namespace qparity::gpu {

namespace {

constexpr int kWarps = 8;  // warps per (token, head, chunk) block
constexpr int kKeys = 8;   // keys per warp step, all their K and V loads in flight at once
constexpr int kStep = kWarps * kKeys;
constexpr int kMaxPerLane = 8;  // head_dim <= 256
// Each warp reads its keys' table entries straight from global memory: no shared-memory table
// bounds the chunk / block_size ratio.
constexpr int64_t kNoTableLimit = int64_t{1} << 40;

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

// The stage stamps of the last stamped launch, token 0's blocks (h * max_chunks + c), see
// decode_attention.h.
constexpr int kMaxStageBlocks = 8192;
__device__ unsigned long long g_stages[kMaxStageBlocks * kStageSlots];

// kStamp: the stage-stamping instantiation (DecodeAttentionParams::stages), so the plain one
// carries no trace of it.
template <int kPerLane, bool kStamp, KvCacheFormat F>
__global__ void __launch_bounds__(kWarps * 32, 2) decode_attention_kernel(DecodeAttentionParams p) {
  unsigned long long st[kStamp ? kStageSlots : 1];
  const bool stamp = kStamp && threadIdx.x == 0;
  const auto stage = [&](int slot) {
    if constexpr (kStamp)
      if (stamp) st[slot] = probe_now();
  };
  stage(0);
  probe_entry(p.probe);
  pdl_launch_dependents();
  const int64_t i = blockIdx.x, h = blockIdx.y, c = blockIdx.z;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int64_t d = p.head_dim, nq = p.num_heads, nkv = p.num_kv_heads;
  const int64_t group = nq / nkv, kv_h = h / group;
  // Before the wait: only the batch's positions, the block table, weights and cached keys, and
  // no barrier: every warp issues its own loads as soon as its own addresses are known. The chain
  // up to the cached keys' requests is one round trip (this token's position, the batch's tokens,
  // the table entries of the warp's keys, all independent with token_table), then the requests;
  // the RoPE angles (each lane its own frequencies) are computed while they fly.
  const int32_t bs = static_cast<int32_t>(p.block_size);
  const int32_t chunk = static_cast<int32_t>(p.chunk);
  const int32_t mbps = static_cast<int32_t>(p.max_blocks_per_seq);
  const int32_t begin = static_cast<int32_t>(c) * chunk;
  const int ntok = static_cast<int>(p.tokens);
  const int32_t last = p.positions[i];
  const int32_t s = p.seq[i];
  // Lane j < ntok holds batch token j's sequence and position (a key this launch writes is read
  // from its token's qkv row, never from the cache).
  const int32_t tseq = lane < ntok ? p.seq[lane] : -1;
  const int32_t tpos = lane < ntok ? p.positions[lane] : 0;
  const int32_t trot = lane < ntok ? (p.rope_positions ? p.rope_positions[lane] : tpos) : 0;
  const int32_t rot_last = p.rope_positions ? p.rope_positions[i] : last;
  const int32_t* row = p.token_table ? p.token_table + i * p.max_blocks_per_seq
                                     : p.block_table + static_cast<int64_t>(s) * mbps;
  // The table entries of a step's keys [base, base + kKeys), entry u for key base + u (a bound
  // that needs neither the position nor, with token_table, the sequence).
  int32_t ent[kKeys], off[kKeys];  // the key's cache block and its slot in the block
  const auto load_entries = [&](int32_t base) {
    int32_t kb = base / bs, r = base - kb * bs;
#pragma unroll
    for (int u = 0; u < kKeys; ++u) {
      ent[u] = kb < mbps ? row[kb] : 0;
      off[u] = r;
      if (++r == bs) ++kb, r = 0;
    }
  };
  int32_t base = begin + warp * kKeys;
  load_entries(base);
  const bool norm = p.q_norm != nullptr;
  PackedRow<kPerLane> qw_raw, kw_raw;  // converted where used, after the wait
  double inv_freq[kPerLane];
  if (norm) {
    qw_raw.load(p.q_norm + lane * kPerLane);
    kw_raw.load(p.k_norm + lane * kPerLane);
  } else {
    qw_raw.zero();
    kw_raw.zero();
  }
#pragma unroll
  for (int j = 0; j < kPerLane; ++j)
    inv_freq[j] = p.inv_freq[(lane & 15) * kPerLane + j];
  const int32_t chunks = last / chunk + 1;
  __nv_bfloat16* op = p.out + i * p.out_stride + h * d;
  if (chunks > p.max_chunks) {  // keys beyond the last chunk: refuse loudly, never drop them
    pdl_wait();
    if (c == 0)
      for (int64_t e = threadIdx.x; e < d; e += blockDim.x)
        op[e] = __float2bfloat16_rn(NAN);
    return;
  }
  if (c >= chunks) return;                           // writes nothing: no need to wait
  const int32_t end = min(last + 1, begin + chunk);  // keys [begin, end)
  // Keys below first_new are all cached; at or above it a key may be a batch token's.
  const int32_t first_new = __reduce_min_sync(0xffffffffu, tseq == s ? tpos : INT_MAX);
  // The batch token holding position `key` of this sequence, or -1 (warp-uniform).
  const auto batch_token = [&](int32_t key) {
    if (key < first_new) return -1;
    const unsigned hit = __ballot_sync(0xffffffffu, tseq == s && tpos == key);
    return hit ? __ffs(hit) - 1 : -1;
  };
  // The offset of key u's row of this KV head in the caches.
  const auto cache_at = [&](int u) {
    return ((static_cast<int64_t>(ent[u]) * bs + off[u]) * nkv + kv_h) * d;
  };
  PackedRow<kPerLane> kv[kKeys], vv[kKeys];
  // A quantized cache's raw codes (bf16 loads straight into kv / vv), and the lane's channels'
  // read parameters (weights: read before the wait).
  KvCodes<F, kPerLane> kc[kKeys], vc[kKeys];
  KvLaneScales<F, kPerLane> ksc, vsc;
  const int64_t ch0 = kv_h * d + lane * kPerLane;  // the lane's first channel
  ksc.load(p.kv, 0, ch0);
  vsc.load(p.kv, 1, ch0);
  int src[kKeys];  // per key of the current step: the batch token holding it, or -1
#pragma unroll
  for (int u = 0; u < kKeys; ++u)
    src[u] = -1;        // a warp whose first step is past the chunk's end has no keys at all
  int64_t own_at = -1;  // the cache offset of token i's own key, when this step holds it
  const auto load_cached = [&](int32_t base) {
#pragma unroll
    for (int u = 0; u < kKeys; ++u) {
      const int32_t key = base + u;
      src[u] = key < end ? batch_token(key) : -1;
      if (src[u] == i) own_at = cache_at(u);
      if (key < end && src[u] < 0) {
        const int64_t o = cache_at(u) + lane * kPerLane;
        if constexpr (F == KvCacheFormat::kBf16) {
          kv[u].load(static_cast<const __nv_bfloat16*>(p.k_cache) + o);
          vv[u].load(static_cast<const __nv_bfloat16*>(p.v_cache) + o);
        } else {
          kc[u].load(p.k_cache, o);
          vc[u].load(p.v_cache, o);
        }
      } else if constexpr (F == KvCacheFormat::kBf16) {
        kv[u].zero();
        vv[u].zero();
      } else {
        kc[u].zero();
        vc[u].zero();
      }
    }
  };

  if (base < end) load_cached(base);  // the first step's cached keys stream during the wait
  // RoPE at the token's own position (its q and its own key): each lane its own frequencies,
  // kept in the warp's own shared-memory slots across the wait (registers are the scarce part).
  __shared__ double rope_cs[kWarps][2][kPerLane * 16];
#pragma unroll
  for (int j = 0; j < kPerLane; ++j) {
    double sn, cs;
    sincos(static_cast<double>(rot_last) * inv_freq[j], &sn, &cs);
    rope_cs[warp][0][(lane & 15) * kPerLane + j] = cs * p.rope_scaling;
    rope_cs[warp][1][(lane & 15) * kPerLane + j] = sn * p.rope_scaling;
  }
  __syncwarp();
  stage(1);
  pdl_wait();
  stage(2);
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
  HeadRope<kPerLane> rope;
#pragma unroll
  for (int j = 0; j < kPerLane; ++j) {
    rope.c[j] = rope_cs[warp][0][(lane & 15) * kPerLane + j];
    rope.s[j] = rope_cs[warp][1][(lane & 15) * kPerLane + j];
  }
  float qw[kPerLane], kw[kPerLane];
#pragma unroll
  for (int j = 0; j < kPerLane; ++j) {
    qw[j] = qw_raw.at(j) + p.norm_offset;
    kw[j] = kw_raw.at(j) + p.norm_offset;
  }
  float q[kPerLane];
  {
    PackedRow<kPerLane> normed, roped;
    normed.load(row_i + h * d + lane * kPerLane);
    norm_rope(qw, norm, p.eps, p.norm_dim > 0 ? p.norm_dim : d, rope, lane, normed, roped);
#pragma unroll
    for (int j = 0; j < kPerLane; ++j)
      q[j] = roped.at(j) * p.scale;
    if (c == 0 && warp == 0) {  // the q captures, once per (token, head)
      const int64_t at = i * (nq + nkv) * d + h * d + lane * kPerLane;
      if (p.normed_out) store_row(p.normed_out + at, normed);
      if (p.rope_out) store_row(p.rope_out + at, roped);
    }
  }
  // A cache read in fp32: its scales factored out of the loop (kv_quant.cuh).
  const bool factored = kv_factored<F>(p.kv);
  float k_bias = 0.f;
  if constexpr (F != KvCacheFormat::kBf16)
    if (factored) k_bias = kv_scale_q<F>(p.kv, ch0, q);
  stage(3);
  float m = -INFINITY, l = 0.f, acc[kPerLane];
#pragma unroll
  for (int j = 0; j < kPerLane; ++j)
    acc[j] = 0.f;
  for (bool first = true; base < end; base += kStep, first = false) {
    if (!first) {
      load_entries(base);
      load_cached(base);
      load_new();
    }
    // Keys this batch holds: computed from their token's qkv row (warp-uniform: src depends on
    // the key only). The token's own key is also written to the cache, by one block. Most warps
    // hold none: one branch skips the whole unrolled block, whose code (eight keys' norm and
    // RoPE) would otherwise be fetched, cold, on the path after the release.
    bool any_new = false;
#pragma unroll
    for (int u = 0; u < kKeys; ++u)
      any_new |= src[u] >= 0;
    if (any_new) {
#pragma unroll
      for (int u = 0; u < kKeys; ++u) {
        const int j = src[u];
        if (j < 0) continue;
        HeadRope<kPerLane> rj;
        const int32_t pos_j = __shfl_sync(0xffffffffu, tpos, j);
        if (pos_j == last)
          rj = rope;
        else  // another token of this sequence in the batch (a short prefill): its own angles
          rj.angles(__shfl_sync(0xffffffffu, trot, j), p.inv_freq, p.rope_scaling, lane);
        PackedRow<kPerLane> normed = kv[u];  // the raw k slice load_new fetched
        norm_rope(kw, norm, p.eps, p.norm_dim > 0 ? p.norm_dim : d, rj, lane, normed, kv[u]);
        const bool own = j == i && h == kv_h * group;  // token i's own K/V: one block writes it
        if (own) {  // the captures: before the cache's quantization (rope_k)
          const int64_t at = i * (nq + nkv) * d + (nq + kv_h) * d + lane * kPerLane;
          if (p.normed_out) store_row(p.normed_out + at, normed);
          if (p.rope_out) store_row(p.rope_out + at, kv[u]);
        }
        // Into the cache (the owner), and used as the cache holds it (everyone): a quantized
        // cache's batch keys join the cached ones as codes.
        const int64_t o = own_at + lane * kPerLane;
        kv_store_codes<F>(p.kv, kv[u], kc[u], p.k_cache, o, 0, ch0, own);
        kv_store_codes<F>(p.kv, vv[u], vc[u], p.v_cache, o, 1, ch0, own);
      }
    }
    if constexpr (F == KvCacheFormat::kBf16)
      online_softmax_step(q, kv, vv, base, end, m, l, acc);
    else
      kv_softmax_step(factored, q, kc, vc, ksc, vsc, k_bias, base, end, m, l, acc);
  }
  if constexpr (F != KvCacheFormat::kBf16)
    if (factored) kv_finish_acc<F>(p.kv, ch0, l, acc);
  stage(4);
  // Merge the warps' partial softmax states in warp order.
  __shared__ float sm[kWarps], sl[kWarps];
  __shared__ float sacc[kWarps][kMaxPerLane * 32];
  float mm, ll;
  gather_warp_states(m, l, acc, warp, lane, sm, sl, sacc, mm, ll);
  stage(5);
  unsigned long long* counted = nullptr;
  if constexpr (kStamp) {
    st[6] = 0;
    counted = stamp ? &st[6] : nullptr;
  }
  finish_chunk(sm, sl, sacc, mm, ll, i * nq + h, c, chunks, p.max_chunks, d, p.partial_acc,
               p.partial_ml, p.chunks_done, op, counted);
  stage(7);
  probe_exit(p.probe);
  if constexpr (kStamp) {
    if (stamp && i == 0 && h * p.max_chunks + c < kMaxStageBlocks) {
      st[8] = static_cast<unsigned long long>(chunks);
      for (int s2 = 0; s2 < kStageSlots; ++s2)
        p.stages[(h * p.max_chunks + c) * kStageSlots + s2] = st[s2];
    }
  }
}

template <int kPerLane, KvCacheFormat F>
void launch_per_lane(const DecodeAttentionParams& p, cudaStream_t stream) {
  const dim3 grid(static_cast<unsigned>(p.tokens), static_cast<unsigned>(p.num_heads),
                  static_cast<unsigned>(p.max_chunks));
  if constexpr (F == KvCacheFormat::kBf16) {
    if (p.stages) {
      launch_pdl("decode_attention", decode_attention_kernel<kPerLane, true, F>, grid,
                 dim3(kWarps * 32), 0, stream, p);
      return;
    }
  }
  launch_pdl("decode_attention", decode_attention_kernel<kPerLane, false, F>, grid,
             dim3(kWarps * 32), 0, stream, p);
}

}  // namespace

unsigned long long* decode_attention_stage_buffer() {
  void* a = nullptr;
  QPARITY_CUDA_CHECK(cudaGetSymbolAddress(&a, g_stages));
  return static_cast<unsigned long long*>(a);
}

void reset_decode_attention_stages() {
  QPARITY_CUDA_CHECK(cudaMemset(decode_attention_stage_buffer(), 0, sizeof(g_stages)));
}

std::vector<unsigned long long> read_decode_attention_stages(int64_t blocks) {
  require(
      blocks >= 0 && blocks <= kMaxStageBlocks, "decode_attention stages",
      "blocks " + std::to_string(blocks) + " outside [0, " + std::to_string(kMaxStageBlocks) + "]");
  std::vector<unsigned long long> out(static_cast<size_t>(blocks * kStageSlots));
  QPARITY_CUDA_CHECK(cudaDeviceSynchronize());
  QPARITY_CUDA_CHECK(cudaMemcpyFromSymbol(out.data(), g_stages, out.size() * 8));
  return out;
}

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
  require(p.norm_dim >= 0 && p.norm_dim <= p.head_dim, k, "norm_dim in [0, head_dim]");
  require_attention_chunks(k, p.chunk, kStep, p.block_size, kNoTableLimit, p.max_chunks,
                           p.partial_acc, p.partial_ml, p.chunks_done);
  require(p.chunk * p.max_chunks <= INT32_MAX && p.max_blocks_per_seq * p.block_size <= INT32_MAX,
          k, "key positions (chunk * max_chunks, max_blocks_per_seq * block_size) must fit int32");
  require_kv_quant(k, p.kv, p.num_kv_heads, p.head_dim);
  require(!p.stages || p.kv.format == KvCacheFormat::kBf16, k,
          "the stage stamps are instantiated for bf16 caches only");
  if (p.tokens == 0) return;
  with_per_lane(p.head_dim, [&](auto lanes) {
    with_kv_format(p.kv.format, [&](auto format) {
      launch_per_lane<decltype(lanes)::value, decltype(format)::value>(p, stream);
    });
  });
}

}  // namespace qparity::gpu
