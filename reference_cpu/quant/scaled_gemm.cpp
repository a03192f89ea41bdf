#include "reference_cpu/quant/scaled_gemm.h"

#include <algorithm>
#include <climits>
#include <cmath>
#include <string>

#include "core/error.h"

namespace qparity::reference {

namespace {

__extension__ typedef __int128 Int128;

int64_t ceil_div(int64_t a, int64_t b) {
  return (a + b - 1) / b;
}

// Column boundaries where either operand's scale column changes: [0, b1, b2, ..., K].
std::vector<int64_t> segments(int64_t k, int64_t bx, int64_t bw) {
  std::vector<int64_t> cuts;
  for (int64_t c = 0; c < k; c += bx)
    cuts.push_back(c);
  for (int64_t c = 0; c < k; c += bw)
    cuts.push_back(c);
  cuts.push_back(k);
  std::sort(cuts.begin(), cuts.end());
  cuts.erase(std::unique(cuts.begin(), cuts.end()), cuts.end());
  return cuts;
}

}  // namespace

int64_t lattice_code(double value, double lattice) {
  const double c = value / lattice;  // exact: lattice is a power of two
  if (!(c == std::floor(c)) || std::fabs(c) > 9.0e15)
    throw Error("lattice_code",
                std::to_string(value) + " is not on the lattice " + std::to_string(lattice));
  return static_cast<int64_t>(c);
}

void validate(const QuantizedMatrix& m, const char* where) {
  if (m.rows < 0 || m.cols < 0 || static_cast<int64_t>(m.codes.size()) != m.rows * m.cols)
    throw Error(where,
                "codes do not match " + std::to_string(m.rows) + "x" + std::to_string(m.cols));
  if (m.block_rows <= 0 || m.block_cols <= 0) throw Error(where, "scale block size must be > 0");
  if (m.scales.rows != ceil_div(m.rows, m.block_rows) ||
      m.scales.cols != ceil_div(m.cols, m.block_cols))
    throw Error(where, "scale grid " + std::to_string(m.scales.rows) + "x" +
                           std::to_string(m.scales.cols) + " does not cover " +
                           std::to_string(m.rows) + "x" + std::to_string(m.cols) +
                           " in blocks of " + std::to_string(m.block_rows) + "x" +
                           std::to_string(m.block_cols));
}

Matrix dequantize(const QuantizedMatrix& m) {
  validate(m, "dequantize");
  Matrix out(m.rows, m.cols);
  for (int64_t r = 0; r < m.rows; ++r)
    for (int64_t c = 0; c < m.cols; ++c)
      out(r, c) = m.value(r, c);
  return out;
}

Matrix scaled_gemm(const QuantizedMatrix& x, const QuantizedMatrix& w, bool int32_accumulator) {
  validate(x, "scaled_gemm activations");
  validate(w, "scaled_gemm weights");
  if (x.cols != w.cols)
    throw Error("scaled_gemm", "inner dimensions differ: " + std::to_string(x.cols) + " vs " +
                                   std::to_string(w.cols));
  const auto cuts = segments(x.cols, x.block_cols, w.block_cols);
  const double lat = x.lattice * w.lattice;
  Matrix y(x.rows, w.rows);
  for (int64_t t = 0; t < x.rows; ++t) {
    const int64_t* xr = x.codes.data() + t * x.cols;
    for (int64_t n = 0; n < w.rows; ++n) {
      const int64_t* wr = w.codes.data() + n * w.cols;
      double acc = 0.0;
      for (size_t s = 0; s + 1 < cuts.size(); ++s) {
        Int128 dot = 0;
        for (int64_t k = cuts[s]; k < cuts[s + 1]; ++k)
          dot += static_cast<Int128>(xr[k]) * wr[k];
        if (int32_accumulator && (dot > INT32_MAX || dot < INT32_MIN))
          throw Error("scaled_gemm", "int32 accumulator overflow at output (" + std::to_string(t) +
                                         ", " + std::to_string(n) + ")");
        acc += static_cast<double>(dot) * lat * x.scale(t, cuts[s]) * w.scale(n, cuts[s]);
      }
      y(t, n) = acc;
    }
  }
  return y;
}

Matrix weight_only_gemm(const Matrix& x, const QuantizedMatrix& w) {
  validate(w, "weight_only_gemm weights");
  if (x.cols != w.cols)
    throw Error("weight_only_gemm", "inner dimensions differ: " + std::to_string(x.cols) + " vs " +
                                        std::to_string(w.cols));
  const auto cuts = segments(w.cols, w.block_cols, w.block_cols);
  Matrix y(x.rows, w.rows);
  for (int64_t t = 0; t < x.rows; ++t) {
    const auto xr = x.row(t);
    for (int64_t n = 0; n < w.rows; ++n) {
      const int64_t* wr = w.codes.data() + n * w.cols;
      double acc = 0.0;
      for (size_t s = 0; s + 1 < cuts.size(); ++s) {
        double dot = 0.0;
        for (int64_t k = cuts[s]; k < cuts[s + 1]; ++k)
          dot += xr[static_cast<size_t>(k)] * static_cast<double>(wr[k]);
        acc += dot * w.lattice * w.scale(n, cuts[s]);
      }
      y(t, n) = acc;
    }
  }
  return y;
}

}  // namespace qparity::reference
