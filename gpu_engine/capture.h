#pragma once
// Capture points on the device -> a Trace on the host: a [rows, cols] view of a
// device tensor (row stride in elements), copied and widened to doubles (bf16, fp32, int32,
// int8 and fp8 e4m3 codes, all exact in fp64). Synchronous: capture is for dumps, not serving.
// A column map picks the logical columns out of a kernel layout that pads (head_dim or the
// intermediate size rounded up for the kernels, shape_padding.h): the trace only ever holds
// the model's own shapes.
#include <cuda_runtime_api.h>

#include <cstdint>
#include <string>
#include <vector>

namespace qparity {
class Trace;
}

namespace qparity::gpu {

enum class Elem { kBf16, kF32, kI32, kI8, kE4m3 };

// Logical column j of a captured row is the view's column columns[j]; empty: all of them.
using ColumnMap = std::vector<int64_t>;

// Each value is recorded as widened - shift (an asymmetric int8 code's zero point: q - z, exact).
void capture(Trace* trace, const std::string& name, const void* dev, Elem e, int64_t rows,
             int64_t cols, int64_t stride, cudaStream_t stream, const ColumnMap& columns = {},
             double shift = 0.0);

}  // namespace qparity::gpu
