#include "gpu_engine/kernels/attention_parts.cuh"
#include "gpu_engine/kernels/kv_quant.cuh"
#include "gpu_engine/kernels/launch_check.h"
#include "gpu_engine/kernels/paged_attention.h"
#include "gpu_engine/kernels/pdl.h"

namespace qparity::gpu {

namespace {

__device__ __forceinline__ int64_t cache_offset(const int32_t* block_table, int64_t max_blocks,
                                                int64_t block_size, int64_t kv_heads,
                                                int64_t head_dim, int32_t s, int64_t p, int64_t h) {
  // 32-bit division: positions and block sizes fit (the launchers bound them).
  const int32_t pos = static_cast<int32_t>(p), bs = static_cast<int32_t>(block_size);
  const int32_t j = pos / bs;
  const int64_t block = block_table[s * max_blocks + j];
  return ((block * block_size + (pos - j * bs)) * kv_heads + h) * head_dim;
}

__global__ void kv_cache_write_kernel(KvCacheWriteParams p) {
  const int64_t i = blockIdx.x;
  const int64_t width = p.num_kv_heads * p.head_dim;
  for (int64_t e = threadIdx.x; e < width; e += blockDim.x) {
    const int64_t h = e / p.head_dim, d = e % p.head_dim;
    const int64_t o = cache_offset(p.block_table, p.max_blocks_per_seq, p.block_size,
                                   p.num_kv_heads, p.head_dim, p.seq[i], p.pos[i], h) +
                      d;
    kv_store(p.kv, p.k_cache, o, 0, e, p.k[i * p.k_stride + e]);
    kv_store(p.kv, p.v_cache, o, 1, e, p.v[i * p.v_stride + e]);
  }
}

__global__ void kv_cache_read_kernel(KvCacheReadParams p) {
  const int64_t i = blockIdx.x;
  const int64_t width = p.num_kv_heads * p.head_dim;
  for (int64_t e = threadIdx.x; e < width; e += blockDim.x) {
    const int64_t h = e / p.head_dim, d = e % p.head_dim;
    const int64_t o = cache_offset(p.block_table, p.max_blocks_per_seq, p.block_size,
                                   p.num_kv_heads, p.head_dim, p.seq[i], p.pos[i], h) +
                      d;
    p.k[i * p.k_stride + e] = kv_load(p.kv, p.k_cache, o, 0, e);
    p.v[i * p.v_stride + e] = kv_load(p.kv, p.v_cache, o, 1, e);
  }
}

constexpr int kWarps = 16;       // warps per (token, head) block, each taking every 16th key group
constexpr int kMaxTable = 1024;  // block-table entries a sequence may use (staged in shared memory)
constexpr int kKeys = 8;  // keys per warp iteration: all their K and V loads in flight at once
constexpr int kMaxPerLane = 8;  // head_dim <= 256

// One block per (token, head, key chunk). Warp w takes key groups w, w + kWarps, ... of the
// chunk; a group is kKeys consecutive positions, whose K and V rows are all loaded before any is
// used (memory-level parallelism, the decode bottleneck). Then the warps' states merge in warp
// order; a token with one chunk writes its output, else the chunk's state goes to scratch and
// the token's last chunk block to finish merges all chunks in chunk order.
template <int kPerLane, KvCacheFormat F>
__global__ void __launch_bounds__(kWarps * 32, kPerLane <= 4 ? 2 : 1)
    paged_attention_kernel(PagedAttentionParams p) {
  pdl_launch_dependents();
  pdl_wait();
  const int64_t i = blockIdx.x, h = blockIdx.y, c = blockIdx.z;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int64_t kv_h = h / (p.num_heads / p.num_kv_heads);
  const int32_t s = p.seq[i];
  const int64_t last = p.pos[i];
  const int64_t chunks = last / p.chunk + 1;
  __nv_bfloat16* op = p.out + i * p.out_stride + h * p.head_dim;
  if (chunks > p.max_chunks) {  // keys beyond the last chunk: refuse loudly, never drop them
    if (c == 0)
      for (int64_t d = threadIdx.x; d < p.head_dim; d += blockDim.x)
        op[d] = __float2bfloat16_rn(NAN);
    return;
  }
  if (c >= chunks) return;
  const int64_t begin = c * p.chunk;
  const int64_t end = last + 1 < begin + p.chunk ? last + 1 : begin + p.chunk;  // keys [begin, end)
  float q[kPerLane], acc[kPerLane];
  const __nv_bfloat16* qp = p.q + i * p.q_stride + h * p.head_dim + lane * kPerLane;
#pragma unroll
  for (int j = 0; j < kPerLane; ++j) {
    q[j] = __bfloat162float(qp[j]) * p.scale;
    acc[j] = 0.f;
  }
  // The chunk's block-table entries, staged once: key offsets then need no dependent load.
  __shared__ int32_t table[kMaxTable];
  const int32_t bs = static_cast<int32_t>(p.block_size);
  const int64_t first_block = begin / bs, blocks = (end - 1) / bs - first_block + 1;
  for (int64_t j = threadIdx.x; j < blocks; j += blockDim.x)
    table[j] = p.block_table[s * p.max_blocks_per_seq + first_block + j];
  __syncthreads();
  KvLaneScales<F, kPerLane> ksc, vsc;  // the lane's channels' read parameters
  const int64_t ch0 = kv_h * p.head_dim + lane * kPerLane;
  ksc.load(p.kv, 0, ch0);
  vsc.load(p.kv, 1, ch0);
  // A cache read in fp32: its scales factored out of the loop (kv_quant.cuh).
  const bool factored = kv_factored<F>(p.kv);
  float k_bias = 0.f;
  if constexpr (F != KvCacheFormat::kBf16)
    if (factored) k_bias = kv_scale_q<F>(p.kv, ch0, q);
  float m = -INFINITY, l = 0.f;
  for (int64_t base = begin + static_cast<int64_t>(warp) * kKeys; base < end;
       base += kWarps * kKeys) {
    KvCodes<F, kPerLane> kc[kKeys], vc[kKeys];  // every load of the step in flight, then used
#pragma unroll
    for (int u = 0; u < kKeys; ++u) {
      const int64_t key = base + u;
      if (key < end) {
        const int32_t kb = static_cast<int32_t>(key) / bs;
        const int64_t o = ((static_cast<int64_t>(table[kb - first_block]) * bs +
                            (static_cast<int32_t>(key) - kb * bs)) *
                               p.num_kv_heads +
                           kv_h) *
                              p.head_dim +
                          lane * kPerLane;
        kc[u].load(p.k_cache, o);
        vc[u].load(p.v_cache, o);
      } else {
        kc[u].zero();
        vc[u].zero();
      }
    }
    kv_softmax_step(factored, q, kc, vc, ksc, vsc, k_bias, base, end, m, l, acc);
  }
  if constexpr (F != KvCacheFormat::kBf16)
    if (factored) kv_finish_acc<F>(p.kv, ch0, l, acc);
  // Merge the warps' partial softmax states in warp order.
  __shared__ float sm[kWarps], sl[kWarps];
  __shared__ float sacc[kWarps][kMaxPerLane * 32];
  float mm, ll;
  gather_warp_states(m, l, acc, warp, lane, sm, sl, sacc, mm, ll);
  // One chunk: the output; several: this chunk's state into scratch, and the token's last chunk
  // block merges them.
  finish_chunk(sm, sl, sacc, mm, ll, i * p.num_heads + h, c, chunks, p.max_chunks, p.head_dim,
               p.partial_acc, p.partial_ml, p.chunks_done, op);
}

}  // namespace

void require_attention_chunks(const char* k, int64_t chunk, int64_t keys_per_step,
                              int64_t block_size, int64_t max_table, int64_t max_chunks,
                              const float* partial_acc, const float* partial_ml,
                              const uint32_t* chunks_done) {
  require(chunk > 0 && chunk % keys_per_step == 0, k,
          "chunk " + std::to_string(chunk) + " must be a positive multiple of " +
              std::to_string(keys_per_step));
  require(chunk / block_size + 2 <= max_table, k,
          "chunk / block_size too large for the shared-memory block table");
  require(max_chunks >= 1 && max_chunks <= 65535, k, "max_chunks in [1, 65535]");
  require(max_chunks == 1 || (partial_acc && partial_ml && chunks_done), k,
          "max_chunks > 1 needs the scratch (partial_acc, partial_ml, chunks_done)");
}

void require_attention_shapes(const char* k, const void* k_cache, const void* v_cache, int64_t num_heads, int64_t num_kv_heads,
                              int64_t head_dim, int64_t block_size, int64_t max_blocks_per_seq,
                              int64_t q_stride, int64_t out_stride, float scale) {
  require(num_heads > 0 && num_kv_heads > 0 && num_heads % num_kv_heads == 0, k,
          "num_heads must be a positive multiple of num_kv_heads");
  require(block_size > 0 && max_blocks_per_seq > 0, k, "positive block sizes");
  require(q_stride >= num_heads * head_dim && out_stride >= num_heads * head_dim, k,
          "q / out stride < num_heads * head_dim");
  require(scale > 0 && scale < INFINITY, k, "scale must be positive and finite");
  require(aligned(k_cache, 16) && aligned(v_cache, 16), k,
          "k_cache / v_cache must be 16-byte aligned (rows are read with vector loads)");
}

void launch_kv_cache_write(const KvCacheWriteParams& p, cudaStream_t stream) {
  constexpr const char* k = "kv_cache_write";
  require(p.k && p.v && p.k_cache && p.v_cache && p.block_table && p.seq && p.pos, k,
          "every pointer is required");
  require(p.tokens >= 0 && p.num_kv_heads > 0 && p.head_dim > 0 && p.block_size > 0 &&
              p.max_blocks_per_seq > 0 && p.num_blocks > 0,
          k, "positive sizes");
  require(p.k_stride >= p.num_kv_heads * p.head_dim && p.v_stride >= p.num_kv_heads * p.head_dim, k,
          "k / v stride < num_kv_heads * head_dim");
  require_kv_quant(k, p.kv, p.num_kv_heads, p.head_dim);
  if (p.tokens == 0) return;
  kv_cache_write_kernel<<<static_cast<unsigned>(p.tokens), 128, 0, stream>>>(p);
  check_launch(k);
}

void launch_kv_cache_read(const KvCacheReadParams& p, cudaStream_t stream) {
  constexpr const char* k = "kv_cache_read";
  require(p.k && p.v && p.k_cache && p.v_cache && p.block_table && p.seq && p.pos, k,
          "every pointer is required");
  require(p.tokens >= 0 && p.num_kv_heads > 0 && p.head_dim > 0 && p.block_size > 0 &&
              p.max_blocks_per_seq > 0,
          k, "positive sizes");
  require(p.k_stride >= p.num_kv_heads * p.head_dim && p.v_stride >= p.num_kv_heads * p.head_dim, k,
          "k / v stride < num_kv_heads * head_dim");
  require_kv_quant(k, p.kv, p.num_kv_heads, p.head_dim);
  if (p.tokens == 0) return;
  kv_cache_read_kernel<<<static_cast<unsigned>(p.tokens), 128, 0, stream>>>(p);
  check_launch(k);
}

AttentionScratchSize paged_attention_scratch(int64_t tokens, int64_t num_heads, int64_t head_dim,
                                             int64_t max_chunks) {
  if (max_chunks <= 1) return {};
  return {tokens * num_heads * max_chunks * head_dim, tokens * num_heads * max_chunks * 2,
          tokens * num_heads};
}

void launch_paged_attention(const PagedAttentionParams& p, cudaStream_t stream) {
  constexpr const char* k = "paged_attention";
  require(p.q && p.k_cache && p.v_cache && p.block_table && p.seq && p.pos && p.out, k,
          "every pointer is required");
  require(p.head_dim % 32 == 0 && p.head_dim > 0 && p.head_dim <= 32 * kMaxPerLane, k,
          "head_dim " + std::to_string(p.head_dim) + " must be a multiple of 32 in [32, 256]");
  require_attention_shapes(k, p.k_cache, p.v_cache, p.num_heads, p.num_kv_heads, p.head_dim,
                           p.block_size, p.max_blocks_per_seq, p.q_stride, p.out_stride, p.scale);
  require_attention_chunks(k, p.chunk, kWarps * kKeys, p.block_size, kMaxTable, p.max_chunks,
                           p.partial_acc, p.partial_ml, p.chunks_done);
  require_kv_quant(k, p.kv, p.num_kv_heads, p.head_dim);
  if (p.tokens == 0) return;
  const dim3 grid(static_cast<unsigned>(p.tokens), static_cast<unsigned>(p.num_heads),
                  static_cast<unsigned>(p.max_chunks));
  with_per_lane(p.head_dim, [&](auto lanes) {
    with_kv_format(p.kv.format, [&](auto format) {
      launch_pdl(k, paged_attention_kernel<decltype(lanes)::value, decltype(format)::value>, grid,
                 dim3(kWarps * 32), 0, stream, p);
    });
  });
}

}  // namespace qparity::gpu
