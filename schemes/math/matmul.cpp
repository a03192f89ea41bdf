#include "schemes/math/matmul.h"

#include <algorithm>
#include <atomic>

#include "core/error.h"
#include "schemes/method/parallel.h"

namespace qparity::reference {

Matrix matmul_nt(const Matrix& x, const Matrix& w) {
  if (x.cols != w.cols)
    throw Error("matmul_nt", "inner dimensions differ: x has " + std::to_string(x.cols) +
                                 " columns, w has " + std::to_string(w.cols));
  return matmul_nt_rows(x, w.rows, [&](int64_t r, std::span<double> out) {
    std::copy(w.row(r).begin(), w.row(r).end(), out.begin());
  });
}

namespace {

// The product kernel: the same sums in the same order at either width, so the choice changes
// the speed and never a bit (each output is one token's sum against one weight row, ascending k,
// a rounding after every product and every addition; vectors run across outputs, never within a
// sum, and no fused multiply-add is emitted: the AVX2 variant is compiled without FMA).
std::atomic<DotKernel> g_kernel{DotKernel::kAuto};

bool cpu_has_avx2() {
  static const bool has = __builtin_cpu_supports("avx2");
  return has;
}

typedef double V2 __attribute__((vector_size(16)));  // SSE2, every x86-64
typedef double V4 __attribute__((vector_size(32)));  // AVX2

// kTokens tokens x (kVecs * lanes) panel rows of independent sums over k. The panel holds the
// rows transposed: panel[j * kRows + r] = w[r][j].
// Sums over j in [j0, j1), continuing the partial sums in `out` unless `fresh`: storing a partial
// sum and loading it back changes no bit, so blocking k changes nothing but the cache traffic.
template <typename V, int kVecs, int kTokens>
[[gnu::always_inline]] inline void dot_panel_tile(const double* const* xr, const double* panel,
                                                  int64_t j0, int64_t j1, bool fresh, double* out) {
  constexpr int kLanes = static_cast<int>(sizeof(V) / sizeof(double));
  constexpr int kRows = kVecs * kLanes;
  // Fully unrolled, so the accumulators live in registers (GCC -O2 does not unroll these
  // constant loops by itself and kept them on the stack: a third of the speed).
  V acc[kTokens][kVecs];
#pragma GCC unroll 16
  for (int t = 0; t < kTokens; ++t)
#pragma GCC unroll 16
    for (int v = 0; v < kVecs; ++v) {
      acc[t][v] = V{};
      if (!fresh) __builtin_memcpy(&acc[t][v], out + t * kRows + v * kLanes, sizeof(V));
    }
  for (int64_t j = j0; j < j1; ++j) {
    V w[kVecs];
#pragma GCC unroll 16
    for (int v = 0; v < kVecs; ++v)
      __builtin_memcpy(&w[v], panel + j * kRows + v * kLanes, sizeof(V));
#pragma GCC unroll 16
    for (int t = 0; t < kTokens; ++t) {
      V xx;
#pragma GCC unroll 16
      for (int l = 0; l < kLanes; ++l)
        xx[l] = xr[t][j];
#pragma GCC unroll 16
      for (int v = 0; v < kVecs; ++v) {
        const V p = xx * w[v];  // rounded products, then rounded sums
        acc[t][v] = acc[t][v] + p;
      }
    }
  }
  for (int t = 0; t < kTokens; ++t)
    __builtin_memcpy(out + t * kRows, &acc[t][0], sizeof acc[t]);
}

// out[t * kRows + r] = the fixed-order sum over k in [k0, k1) of token t against panel row r, every
// token.
template <typename V, int kVecs, int kTile>
[[gnu::always_inline]] inline void dot_panel(const Matrix& x, const double* panel, int64_t k0,
                                             int64_t k1, double* out) {
  constexpr int kRows = kVecs * static_cast<int>(sizeof(V) / sizeof(double));
  // k in blocks of 256: the panel's block (16 KB at 8 rows) and a tile's x rows stay in L1 while
  // every token tile passes over them.
  constexpr int64_t kBlock = 256;
  for (int64_t j0 = k0; j0 < k1; j0 += kBlock) {
    const int64_t j1 = std::min(k1, j0 + kBlock);
    const bool fresh = j0 == k0;
    int64_t t = 0;
    for (; t + kTile <= x.rows; t += kTile) {
      const double* xr[kTile];
      for (int i = 0; i < kTile; ++i)
        xr[i] = x.row(t + i).data();
      dot_panel_tile<V, kVecs, kTile>(xr, panel, j0, j1, fresh, out + t * kRows);
    }
    for (; t < x.rows; ++t) {
      const double* xr[1] = {x.row(t).data()};
      dot_panel_tile<V, kVecs, 1>(xr, panel, j0, j1, fresh, out + t * kRows);
    }
  }
}

// 4 tokens x 4 rows in SSE2 pairs (8 accumulators + 2 weights + 1 broadcast of the 16 vector
// registers); 6 tokens x 8 rows in AVX2 quads (12 + 2 + 1).
constexpr int64_t kSse2Rows = 4, kAvx2Rows = 8;
void dot_panel_sse2(const Matrix& x, const double* panel, int64_t k0, int64_t k1, double* out) {
  dot_panel<V2, 2, 4>(x, panel, k0, k1, out);
}
__attribute__((target("avx2"))) void dot_panel_avx2(const Matrix& x, const double* panel,
                                                    int64_t k0, int64_t k1, double* out) {
  dot_panel<V4, 2, 6>(x, panel, k0, k1, out);
}

}  // namespace

void set_dot_kernel(DotKernel kernel) {
  if (kernel == DotKernel::kAvx2 && !cpu_has_avx2())
    throw Error("set_dot_kernel", "AVX2 asked for on a CPU without it");
  g_kernel.store(kernel);
}

DotKernel dot_kernel() {
  const DotKernel k = g_kernel.load();
  if (k != DotKernel::kAuto) return k;
  return cpu_has_avx2() ? DotKernel::kAvx2 : DotKernel::kSse2;
}

namespace {

// The panel loop behind both products: rows decoded kRows at a time, transposed into a panel,
// every token against it; `finish(r, nr, panel, out)` turns the panel's sums into outputs.
void panel_loop(const Matrix& x, int64_t n,
                const std::function<void(int64_t, std::span<double>)>& row,
                const std::function<void(int64_t r, int64_t nr, bool avx2, const double* panel,
                                         double* out)>& finish) {
  const int64_t k = x.cols;
  const bool avx2 = dot_kernel() == DotKernel::kAvx2;
  const int64_t kRows = avx2 ? kAvx2Rows : kSse2Rows;
  parallel_chunks(n, x.rows * n * k, [&](int64_t r0, int64_t r1) {
    std::vector<double> rows(static_cast<size_t>(kRows * k)), panel(static_cast<size_t>(k * kRows)),
        out(static_cast<size_t>(x.rows * kRows));
    for (int64_t r = r0; r < r1; r += kRows) {
      const int64_t nr = std::min(kRows, r1 - r);
      // Decode the rows, then transpose with the panel written in order (writing each row
      // straight into the panel strides every store by a cache line).
      std::fill(rows.begin() + nr * k, rows.end(), 0.0);
      for (int64_t j = 0; j < nr; ++j)
        row(r + j, std::span<double>(rows.data() + j * k, static_cast<size_t>(k)));
      for (int64_t c = 0; c < k; ++c)
        for (int64_t j = 0; j < kRows; ++j)
          panel[static_cast<size_t>(c * kRows + j)] = rows[static_cast<size_t>(j * k + c)];
      finish(r, nr, avx2, panel.data(), out.data());
    }
  });
}

}  // namespace

Matrix matmul_nt_rows(const Matrix& x, int64_t n,
                      const std::function<void(int64_t, std::span<double>)>& row) {
  Matrix y(x.rows, n);
  panel_loop(x, n, row, [&](int64_t r, int64_t nr, bool avx2, const double* panel, double* out) {
    const int64_t kRows = avx2 ? kAvx2Rows : kSse2Rows;
    if (avx2)
      dot_panel_avx2(x, panel, 0, x.cols, out);
    else
      dot_panel_sse2(x, panel, 0, x.cols, out);
    for (int64_t t = 0; t < x.rows; ++t)
      for (int64_t j = 0; j < nr; ++j)
        y(t, r + j) = out[static_cast<size_t>(t * kRows + j)];
  });
  return y;
}

Matrix matmul_nt_rows_segmented(const Matrix& x, int64_t n,
                                const std::function<void(int64_t, std::span<double>)>& row,
                                const SegmentedScales& sc) {
  const auto segs = static_cast<int64_t>(sc.cuts.size()) - 1;
  if (segs < 1 || sc.cuts.front() != 0 || sc.cuts.back() != x.cols)
    throw Error("matmul_nt_rows_segmented",
                "segment cuts must run from 0 to K = " + std::to_string(x.cols));
  if (sc.sx && (sc.sx->rows != x.rows || sc.sx->cols != segs))
    throw Error("matmul_nt_rows_segmented", "activation scales are not [T, segments]");
  Matrix y(x.rows, n);
  panel_loop(x, n, row, [&](int64_t r, int64_t nr, bool avx2, const double* panel, double* out) {
    const int64_t kRows = avx2 ? kAvx2Rows : kSse2Rows;
    // Per-thread scratch: the running sums and the panel rows' scales.
    thread_local std::vector<double> acc, sw;
    acc.assign(static_cast<size_t>(x.rows * kRows), 0.0);
    sw.assign(static_cast<size_t>(kRows * segs), 0.0);
    for (int64_t j = 0; j < nr; ++j)
      sc.row_scales(r + j, std::span<double>(sw.data() + j * segs, static_cast<size_t>(segs)));
    for (int64_t s = 0; s < segs; ++s) {
      if (avx2)
        dot_panel_avx2(x, panel, sc.cuts[s], sc.cuts[s + 1], out);
      else
        dot_panel_sse2(x, panel, sc.cuts[s], sc.cuts[s + 1], out);
      for (int64_t t = 0; t < x.rows; ++t) {
        const double sxv = sc.sx ? (*sc.sx)(t, s) : 1.0;
        for (int64_t j = 0; j < nr; ++j) {
          const double d = out[static_cast<size_t>(t * kRows + j)];
          if (sc.int32_check && (d > 2147483647.0 || d < -2147483648.0))
            throw Error("scaled_gemm", "int32 accumulator overflow at output (" +
                                           std::to_string(t) + ", " + std::to_string(r + j) + ")");
          double& a = acc[static_cast<size_t>(t * kRows + j)];
          a = a + ((d * sc.lattice) * sxv) * sw[static_cast<size_t>(j * segs + s)];
        }
      }
    }
    for (int64_t t = 0; t < x.rows; ++t)
      for (int64_t j = 0; j < nr; ++j)
        y(t, r + j) = acc[static_cast<size_t>(t * kRows + j)];
  });
  return y;
}

}  // namespace qparity::reference
