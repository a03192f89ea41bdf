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
// row(n, out) writes w[n, :] (k values) into out. Same sums, same order, as matmul_nt.
Matrix matmul_nt_rows(const Matrix& x, int64_t n,
                      const std::function<void(int64_t, std::span<double>)>& row);

// The kernel under both, register-blocked: for up to kPanelRows weight rows held as a panel
// [k][kPanelRows] (row j's value at k in panel[k * kPanelRows + j]; unused rows any finite
// value), out[t * kPanelRows + j] = sum_k x[t, k] * w_j[k] for every token t, each sum in ascending
// k with a rounding after every product and every addition (no fused multiply-add) — the bits of
// the scalar loop `acc += x * w`, for any tiling. Tokens go four at a time, rows two by two in
// SIMD pairs: sixteen independent sums instead of one latency-bound chain.
inline constexpr int64_t kPanelRows = 4;
void dot_panel_fixed_order(const Matrix& x, std::span<const double> panel, std::span<double> out);

}  // namespace qparity::reference
