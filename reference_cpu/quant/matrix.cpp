#include "reference_cpu/quant/matrix.h"

#include "core/error.h"

namespace qparity::reference {

Matrix matmul_nt(const Matrix& x, const Matrix& w) {
  if (x.cols != w.cols)
    throw Error("matmul_nt", "inner dimensions differ: x has " + std::to_string(x.cols) +
                                 " columns, w has " + std::to_string(w.cols));
  Matrix y(x.rows, w.rows);
  for (int64_t t = 0; t < x.rows; ++t) {
    const auto xr = x.row(t);
    for (int64_t n = 0; n < w.rows; ++n) {
      const auto wr = w.row(n);
      double acc = 0.0;
      for (int64_t k = 0; k < x.cols; ++k)
        acc += xr[static_cast<size_t>(k)] * wr[static_cast<size_t>(k)];
      y(t, n) = acc;
    }
  }
  return y;
}

Matrix matmul_nt_rows(const Matrix& x, int64_t n,
                      const std::function<void(int64_t, std::span<double>)>& row) {
  std::vector<double> wr(static_cast<size_t>(x.cols));
  Matrix y(x.rows, n);
  for (int64_t r = 0; r < n; ++r) {
    row(r, wr);
    for (int64_t t = 0; t < x.rows; ++t) {
      const auto xr = x.row(t);
      double acc = 0.0;
      for (int64_t k = 0; k < x.cols; ++k)
        acc += xr[static_cast<size_t>(k)] * wr[static_cast<size_t>(k)];
      y(t, r) = acc;
    }
  }
  return y;
}

}  // namespace qparity::reference
