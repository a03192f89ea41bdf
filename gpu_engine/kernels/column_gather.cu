#include "gpu_engine/kernels/column_gather.h"
#include "gpu_engine/kernels/launch_check.h"
#include "gpu_engine/kernels/pdl.h"

namespace qparity::gpu {

namespace {

constexpr int kThreads = 256;

// One block per row (rows are at most a forward's tokens; a row's gather is a few KiB).
__global__ void column_gather_kernel(ColumnGatherParams p) {
  pdl_launch_dependents();
  pdl_wait();
  const int64_t r = blockIdx.x;
  const __nv_bfloat16* src = p.src + r * p.src_stride;
  __nv_bfloat16* dst = p.dst + r * p.dst_stride;
  for (int64_t c = threadIdx.x; c < p.cols; c += kThreads)
    dst[c] = src[p.sources[c]];
}

}  // namespace

void launch_column_gather(const ColumnGatherParams& p, cudaStream_t stream) {
  constexpr const char* k = "column_gather";
  require(p.rows >= 0 && p.cols >= 0, k, "rows, cols >= 0");
  if (p.rows == 0 || p.cols == 0) return;
  require(p.src && p.dst && p.sources, k, "src, dst and sources are required");
  require(p.src_stride > 0 && p.dst_stride >= p.cols, k, "src_stride > 0, dst_stride >= cols");
  launch_pdl(k, column_gather_kernel, dim3(static_cast<unsigned>(p.rows)), dim3(kThreads), 0,
             stream, p);
}

}  // namespace qparity::gpu
