#pragma once
// The reference's fp64 products over core's Matrix (core/matrix.h), each sum in a fixed order
// written out here, so results do not depend on a BLAS, the CPU or the thread count.
#include <cstdint>
#include <functional>
#include <span>
#include <string>
#include <vector>

#include "core/matrix.h"

namespace qparity::reference {

// The bits policy of every product (docs/REFERENCE_BITS.md): each output is one token's sum
// against one weight row, a chain of fused multiply-adds in ascending k from 0.0,
//   acc = fma(x[t, k], w[n, k], acc)   for k = 0, 1, ..., K - 1,
// so one rounding per step. Vectors run across outputs, never within a sum, so the bits are those
// of that scalar loop for any tiling, vector width, thread count or CPU: the AVX-512 and AVX2 + FMA
// kernels and the portable one (std::fma: the FMA instruction where the CPU has one, glibc's exact
// software fma where it does not) give the same result everywhere.

// y = x @ w^T in fp64. x [T, K], w [N, K].
Matrix matmul_nt(const Matrix& x, const Matrix& w);

// A weight produced on the fly (a compact weight decoded per call): row(n, k0, out) writes
// w[n, k0 : k0 + out.size()] into out. The products ask for column ranges of a few hundred, so a
// decoded block stays in the first-level cache.
using WeightRows = std::function<void(int64_t n, int64_t k0, std::span<double> out)>;
// The same sums, in the same order, as matmul_nt.
Matrix matmul_nt_rows(const Matrix& x, int64_t n, const WeightRows& row);

// Segmented and scaled, the quantized GEMMs' form: K is cut at `cuts` ([0, c1, ..., K]); for each
// segment s the ascending-k sum d(t, n, s) of x[t, k] * w[n, k] from 0 (as matmul_nt_rows sums),
// then
//   y(t, n) = fold over s ascending, from 0.0, of acc + ((d * lattice) * sx(t, s)) * sw(n, s)
// (each operation rounded: the fold is not fused) with sx a [T, S] matrix (nullptr: no activation
// scale; multiplying by 1 would change no bit) and row_scales(n, out[S]) writing sw(n, :).
// int32_check: a segment sum outside int32 is an Error naming the output, as an int8 GEMM's
// accumulator would overflow (the sums of integer codes are exact here while |sum| < 2^53, which
// the caller guarantees; fused or not, an exact sum has one value).
struct SegmentedScales {
  std::span<const int64_t> cuts;
  double lattice = 1.0;
  const Matrix* sx = nullptr;
  std::function<void(int64_t, std::span<double>)> row_scales;
  bool int32_check = false;
};
Matrix matmul_nt_rows_segmented(const Matrix& x, int64_t n, const WeightRows& row,
                                const SegmentedScales& scales);

// Which kernel the products run: kAuto picks AVX-512, else AVX2 + FMA, else the portable loop, by
// what the CPU has (checked at run time; the build targets baseline x86-64). The bits are the same;
// tests and the bench force one to show it.
enum class DotKernel { kAuto, kPortable, kAvx2, kAvx512 };
void set_dot_kernel(DotKernel kernel);  // a kernel this CPU cannot run is an Error
DotKernel dot_kernel();                 // the kernel in use (never kAuto)
const char* dot_kernel_name(DotKernel kernel);
// "portable", "avx2" or "avx512" (and "auto"); anything else is an Error listing them.
DotKernel parse_dot_kernel(const std::string& name);

}  // namespace qparity::reference
