#include "reference_cpu/quant/matrix.h"

#include <algorithm>

#include "core/error.h"
#include "reference_cpu/quant/parallel.h"

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

constexpr int64_t kPanelRows = 4;  // weight rows a panel holds

// Two doubles a register (SSE2, every x86-64): a product and a sum each round once, as scalars.
typedef double V2 __attribute__((vector_size(16)));

template <int kTokens>
void dot_panel_tile(const double* const* xr, const double* panel, int64_t k, double* out) {
  V2 acc[kTokens][2];
  for (int t = 0; t < kTokens; ++t)
    acc[t][0] = acc[t][1] = V2{0.0, 0.0};
  for (int64_t j = 0; j < k; ++j) {
    V2 w0, w1;
    __builtin_memcpy(&w0, panel + j * kPanelRows, sizeof w0);
    __builtin_memcpy(&w1, panel + j * kPanelRows + 2, sizeof w1);
    for (int t = 0; t < kTokens; ++t) {
      const double xv = xr[t][j];
      const V2 xx = {xv, xv};
      const V2 p0 = xx * w0, p1 = xx * w1;  // rounded products, then rounded sums
      acc[t][0] = acc[t][0] + p0;
      acc[t][1] = acc[t][1] + p1;
    }
  }
  for (int t = 0; t < kTokens; ++t) {
    out[t * kPanelRows + 0] = acc[t][0][0];
    out[t * kPanelRows + 1] = acc[t][0][1];
    out[t * kPanelRows + 2] = acc[t][1][0];
    out[t * kPanelRows + 3] = acc[t][1][1];
  }
}

// out[t * kPanelRows + j] = the fixed-order sum of token t against panel row j, every token.
void dot_panel_fixed_order(const Matrix& x, std::span<const double> panel, std::span<double> out) {
  const int64_t k = x.cols;
  if (static_cast<int64_t>(panel.size()) < k * kPanelRows ||
      static_cast<int64_t>(out.size()) < x.rows * kPanelRows)
    throw Error("dot_panel_fixed_order", "panel or output too small");
  int64_t t = 0;
  for (; t + 4 <= x.rows; t += 4) {
    const double* xr[4] = {x.row(t).data(), x.row(t + 1).data(), x.row(t + 2).data(),
                           x.row(t + 3).data()};
    dot_panel_tile<4>(xr, panel.data(), k, out.data() + t * kPanelRows);
  }
  for (; t < x.rows; ++t) {
    const double* xr[1] = {x.row(t).data()};
    dot_panel_tile<1>(xr, panel.data(), k, out.data() + t * kPanelRows);
  }
}

}  // namespace

Matrix matmul_nt_rows(const Matrix& x, int64_t n,
                      const std::function<void(int64_t, std::span<double>)>& row) {
  Matrix y(x.rows, n);
  const int64_t k = x.cols;
  parallel_chunks(n, x.rows * n * k, [&](int64_t r0, int64_t r1) {
    std::vector<double> wr(static_cast<size_t>(k)), panel(static_cast<size_t>(k * kPanelRows)),
        out(static_cast<size_t>(x.rows * kPanelRows));
    for (int64_t r = r0; r < r1; r += kPanelRows) {
      const int64_t nr = std::min(kPanelRows, r1 - r);
      std::fill(panel.begin(), panel.end(), 0.0);
      for (int64_t j = 0; j < nr; ++j) {
        row(r + j, wr);
        for (int64_t c = 0; c < k; ++c)
          panel[static_cast<size_t>(c * kPanelRows + j)] = wr[static_cast<size_t>(c)];
      }
      dot_panel_fixed_order(x, panel, out);
      for (int64_t t = 0; t < x.rows; ++t)
        for (int64_t j = 0; j < nr; ++j)
          y(t, r + j) = out[static_cast<size_t>(t * kPanelRows + j)];
    }
  });
  return y;
}

}  // namespace qparity::reference
