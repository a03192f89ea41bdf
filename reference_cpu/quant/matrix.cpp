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

Matrix matmul_nt_rows(const Matrix& x, int64_t n,
                      const std::function<void(int64_t, std::span<double>)>& row) {
  Matrix y(x.rows, n);
  parallel_chunks(n, x.rows * n * x.cols, [&](int64_t r0, int64_t r1) {
    std::vector<double> wr(static_cast<size_t>(x.cols));
    for (int64_t r = r0; r < r1; ++r) {
      row(r, wr);
      for (int64_t t = 0; t < x.rows; ++t) {
        const auto xr = x.row(t);
        double acc = 0.0;
        for (int64_t k = 0; k < x.cols; ++k)
          acc += xr[static_cast<size_t>(k)] * wr[static_cast<size_t>(k)];
        y(t, r) = acc;
      }
    }
  });
  return y;
}

}  // namespace qparity::reference
