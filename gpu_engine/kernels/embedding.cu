#include "gpu_engine/kernels/embedding.h"
#include "gpu_engine/kernels/launch_check.h"
#include "gpu_engine/kernels/pdl.h"

namespace qparity::gpu {

namespace {

__global__ void embedding_kernel(EmbeddingParams p) {
  probe_entry(p.probe);
  pdl_launch_dependents();
  pdl_wait();
  probe_release(p.probe);
  const int64_t t = blockIdx.x;
  const int64_t id = static_cast<int64_t>(p.ids[t]) - p.vocab_begin;
  const bool ok = id >= 0 && id < p.vocab;
  if (!ok && !p.vocab_shard && threadIdx.x == 0 && p.bad_ids) atomicAdd(p.bad_ids, 1);
  const __nv_bfloat16 other =
      p.vocab_shard ? __float2bfloat16_rn(0.0f) : __float2bfloat16_rn(__int_as_float(0x7fc00000));
  for (int64_t j = threadIdx.x; j < p.hidden; j += blockDim.x)
    p.out[t * p.hidden + j] = ok ? p.table[id * p.hidden + j] : other;
  probe_exit(p.probe);
}

}  // namespace

void launch_embedding(const EmbeddingParams& p, cudaStream_t stream) {
  constexpr const char* k = "embedding";
  require(p.ids && p.table && p.out, k, "ids, table and out are required");
  require(p.tokens >= 0 && p.vocab > 0 && p.hidden > 0, k, "tokens >= 0, vocab > 0, hidden > 0");
  if (p.tokens == 0) return;
  launch_pdl(k, embedding_kernel, dim3(static_cast<unsigned>(p.tokens)), dim3(256), 0, stream, p);
}

}  // namespace qparity::gpu
