#include "gpu_engine/capture.h"

#include <cuda_bf16.h>

#include <cstring>

#include "core/capture/trace.h"
#include "core/codecs/float_format.h"
#include "gpu_engine/cuda_check.h"

namespace qparity::gpu {

namespace {

double widen(Elem e, const uint8_t* p) {
  switch (e) {
    case Elem::kBf16: {
      __nv_bfloat16 b;
      std::memcpy(&b, p, 2);
      return static_cast<double>(__bfloat162float(b));
    }
    case Elem::kI8:
      return static_cast<int8_t>(*p);
    case Elem::kE4m3:
      return codec::e4m3fn_to_double(*p);
    case Elem::kF32: {
      float f;
      std::memcpy(&f, p, 4);
      return f;
    }
    case Elem::kI32: {
      int32_t v;
      std::memcpy(&v, p, 4);
      return v;
    }
  }
  return 0;  // unreachable: every Elem is handled above
}

size_t elem_bytes(Elem e) {
  switch (e) {
    case Elem::kBf16:
      return 2;
    case Elem::kI8:
    case Elem::kE4m3:
      return 1;
    case Elem::kF32:
    case Elem::kI32:
      return 4;
  }
  return 4;
}

}  // namespace

void capture(Trace* trace, const std::string& name, const void* dev, Elem e, int64_t rows,
             int64_t cols, int64_t stride, cudaStream_t stream, const ColumnMap& columns,
             double shift) {
  if (!trace || !trace->wants(name)) return;
  const size_t es = elem_bytes(e);
  std::vector<uint8_t> host(static_cast<size_t>(rows * cols) * es);
  QPARITY_CUDA_CHECK(cudaMemcpy2DAsync(
      host.data(), static_cast<size_t>(cols) * es, dev, static_cast<size_t>(stride) * es,
      static_cast<size_t>(cols) * es, static_cast<size_t>(rows), cudaMemcpyDeviceToHost, stream));
  QPARITY_CUDA_CHECK(cudaStreamSynchronize(stream));
  const int64_t out_cols = columns.empty() ? cols : static_cast<int64_t>(columns.size());
  Matrix m(rows, out_cols);
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t j = 0; j < out_cols; ++j) {
      const int64_t c = columns.empty() ? j : columns[static_cast<size_t>(j)];
      m(r, j) = widen(e, host.data() + static_cast<size_t>(r * cols + c) * es) - shift;
    }
  trace->record(name, m);
}

}  // namespace qparity::gpu
