#pragma once
// The reference's fp64 products over core's Matrix (core/matrix.h), each sum in a fixed order
// written out here, so results do not depend on a BLAS or on the thread count.
#include <cstdint>
#include <functional>
#include <span>
#include <vector>

#include "core/matrix.h"

namespace qparity::reference {

// y = x @ w^T in fp64, each output summed over k in ascending order. x [T, K], w [N, K].
Matrix matmul_nt(const Matrix& x, const Matrix& w);
// The same with the weight produced one row at a time (a compact weight decoded on the fly):
// row(n, out) writes w[n, :] (k values) into out. Same sums, same order, as matmul_nt. Both are
// register-blocked (4 tokens x 4 rows of independent sums in SSE2, 6 x 8 in AVX2, over a
// transposed panel of rows), each output still the ascending-k sum with a rounding after every
// product and every addition (no fused multiply-add): the bits of the scalar loop
// `acc += x * w`, for any tiling, vector width or CPU (no cache-size-dependent blocking).
Matrix matmul_nt_rows(const Matrix& x, int64_t n,
                      const std::function<void(int64_t, std::span<double>)>& row);

// Segmented and scaled, the quantized GEMMs' form: K is cut at `cuts` ([0, c1, ..., K]); for each
// segment s the ascending-k sum d(t, n, s) of x[t, k] * w[n, k] from 0 (as matmul_nt_rows sums),
// then
//   y(t, n) = fold over s ascending, from 0.0, of acc + ((d * lattice) * sx(t, s)) * sw(n, s)
// with sx a [T, S] matrix (nullptr: no activation scale; multiplying by 1 would change no bit) and
// row_scales(n, out[S]) writing sw(n, :). int32_check: a segment sum outside int32 is an Error
// naming the output, as an int8 GEMM's accumulator would overflow (the sums of integer codes are
// exact here while |sum| < 2^53, which the caller guarantees).
struct SegmentedScales {
  std::span<const int64_t> cuts;
  double lattice = 1.0;
  const Matrix* sx = nullptr;
  std::function<void(int64_t, std::span<double>)> row_scales;
  bool int32_check = false;
};
Matrix matmul_nt_rows_segmented(const Matrix& x, int64_t n,
                                const std::function<void(int64_t, std::span<double>)>& row,
                                const SegmentedScales& scales);

// Which vector width the products run at: kAuto picks AVX2 where the CPU has it (checked at run
// time; the build targets baseline x86-64), else SSE2. The bits are the same; tests and the
// bench force one to show it.
enum class DotKernel { kAuto, kSse2, kAvx2 };
void set_dot_kernel(DotKernel kernel);  // kAvx2 on a CPU without it is an Error
DotKernel dot_kernel();                 // the kernel in use (never kAuto)

}  // namespace qparity::reference
