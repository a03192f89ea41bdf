#include "gpu_engine/kernels/image_rows.h"
#include "gpu_engine/kernels/launch_check.h"
#include "gpu_engine/kernels/pdl.h"

namespace qparity::gpu {

namespace {

constexpr int kThreads = 128;

__global__ void image_rows_kernel(ImageRowsParams p) {
  pdl_launch_dependents();
  pdl_wait();
  const int64_t j = blockIdx.x;
  __nv_bfloat16* row = p.x + static_cast<int64_t>(p.rows[j]) * p.hidden;
  const __nv_bfloat16* src = p.src + j * p.hidden;
  for (int64_t c = threadIdx.x; c < p.hidden; c += kThreads)
    row[c] =
        p.add ? __float2bfloat16_rn(__bfloat162float(row[c]) + __bfloat162float(src[c])) : src[c];
}

}  // namespace

void launch_image_rows(const ImageRowsParams& p, cudaStream_t stream) {
  constexpr const char* k = "image_rows";
  require(p.count >= 0, k, "count >= 0");
  if (p.count == 0) return;  // (a batch without image rows: nothing given, nothing to do)
  require(p.x && p.rows && p.src, k, "x, rows and src are required");
  require(p.hidden > 0, k, "hidden > 0");
  launch_pdl(k, image_rows_kernel, dim3(static_cast<unsigned>(p.count)), dim3(kThreads), 0, stream,
             p);
}

}  // namespace qparity::gpu
