#include "schemes/math/scaled_gemm.h"

#include <algorithm>
#include <climits>
#include <cmath>
#include <functional>
#include <string>

#include "core/error.h"
#include "schemes/math/matmul.h"
#include "schemes/method/parallel.h"

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
  const int64_t n_codes = m.compacted() ? m.packed.size() : static_cast<int64_t>(m.codes.size());
  if (m.rows < 0 || m.cols < 0 || n_codes != m.rows * m.cols)
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
  if (!m.zero_points.empty() &&
      static_cast<int64_t>(m.zero_points.size()) != m.scales.rows * m.scales.cols)
    throw Error(where, std::to_string(m.zero_points.size()) + " zero points for a scale grid of " +
                           std::to_string(m.scales.rows * m.scales.cols) + " blocks");
}

void QuantizedMatrix::stored_row(int64_t r, std::span<int64_t> out) const {
  if (static_cast<int64_t>(out.size()) != cols || r < 0 || r >= rows)
    throw Error("QuantizedMatrix",
                "row " + std::to_string(r) + " into a buffer of " + std::to_string(out.size()) +
                    " of a " + std::to_string(rows) + "x" + std::to_string(cols) + " matrix");
  if (compacted())
    packed.decode(r * cols, out);
  else
    std::copy_n(codes.begin() + r * cols, cols, out.begin());
}

void QuantizedMatrix::row_codes(int64_t r, std::span<int64_t> out) const {
  stored_row(r, out);
  if (zero_points.empty()) return;
  const int64_t* z = zero_points.data() + (r / block_rows) * scales.cols;
  for (int64_t c = 0; c < cols; ++c)
    out[static_cast<size_t>(c)] -= z[c / block_cols];
}

void QuantizedMatrix::row_codes_as_doubles(int64_t r, int64_t c0, std::span<double> out) const {
  const auto n = static_cast<int64_t>(out.size());
  if (r < 0 || r >= rows || c0 < 0 || c0 + n > cols)
    throw Error("QuantizedMatrix", "row " + std::to_string(r) + " columns [" + std::to_string(c0) +
                                       ", " + std::to_string(c0 + n) + ") of a " +
                                       std::to_string(rows) + "x" + std::to_string(cols) +
                                       " matrix");
  if (compacted()) {
    packed.decode_as_doubles(r * cols + c0, out);
  } else {
    for (int64_t c = 0; c < n; ++c)
      out[static_cast<size_t>(c)] =
          static_cast<double>(codes[static_cast<size_t>(r * cols + c0 + c)]);
  }
  if (zero_points.empty()) return;
  // q - z is exact in doubles: both are integers below 2^53 (code_bound is checked by the GEMMs).
  const int64_t* z = zero_points.data() + (r / block_rows) * scales.cols;
  for (int64_t c = 0; c < n; ++c)
    out[static_cast<size_t>(c)] -= static_cast<double>(z[(c0 + c) / block_cols]);
}

std::vector<int64_t> QuantizedMatrix::code_vector() const {
  std::vector<int64_t> out(static_cast<size_t>(rows * cols));
  for (int64_t r = 0; r < rows; ++r)
    row_codes(r, std::span<int64_t>(out.data() + r * cols, static_cast<size_t>(cols)));
  return out;
}

void QuantizedMatrix::compact() {
  if (compacted() || codes.empty()) return;
  validate(*this, "QuantizedMatrix::compact");
  packed = CodeStore::pack(codes);
  std::vector<int64_t>().swap(codes);
}

size_t QuantizedMatrix::bytes() const {
  return codes.capacity() * sizeof(int64_t) + packed.bytes() +
         zero_points.capacity() * sizeof(int64_t) + scales.data.capacity() * sizeof(double);
}

Matrix dequantize(const QuantizedMatrix& m) {
  validate(m, "dequantize");
  Matrix out(m.rows, m.cols);
  std::vector<int64_t> row(static_cast<size_t>(m.cols));
  for (int64_t r = 0; r < m.rows; ++r) {
    m.row_codes(r, row);
    for (int64_t c = 0; c < m.cols; ++c)
      out(r, c) = static_cast<double>(row[static_cast<size_t>(c)]) * m.lattice * m.scale(r, c);
  }
  return out;
}

double QuantizedMatrix::code_bound() const {
  double m = 0.0;
  if (compacted()) {
    m = std::max(std::fabs(static_cast<double>(packed.min_code())),
                 std::fabs(static_cast<double>(packed.max_code())));
  } else {
    for (int64_t c : codes)
      m = std::max(m, std::fabs(static_cast<double>(c)));
  }
  double z = 0.0;
  for (int64_t v : zero_points)
    z = std::max(z, std::fabs(static_cast<double>(v)));
  return m + z;
}

namespace {

int64_t longest_segment(const std::vector<int64_t>& cuts) {
  int64_t m = 0;
  for (size_t s = 0; s + 1 < cuts.size(); ++s)
    m = std::max(m, cuts[s + 1] - cuts[s]);
  return m;
}

// The weight's codes as doubles (exact below 2^53), a row's column block at a time from the
// compact form.
WeightRows code_rows(const QuantizedMatrix& w) {
  return [&w](int64_t n, int64_t k0, std::span<double> out) { w.row_codes_as_doubles(n, k0, out); };
}

// sw(n, s) for every segment, from the segments' first columns.
std::function<void(int64_t, std::span<double>)> weight_scales(const QuantizedMatrix& w,
                                                              const std::vector<int64_t>& cuts) {
  return [&w, &cuts](int64_t n, std::span<double> out) {
    for (size_t s = 0; s < out.size(); ++s)
      out[s] = w.scale(n, cuts[s]);
  };
}

}  // namespace

// Both GEMMs decode one weight row at a time (the weight stays compact) and split the weight rows
// across threads; each y(t, n) is still its own fixed-order sum, so neither the order of visits
// nor the thread count changes a bit of the result.
Matrix scaled_gemm(const QuantizedMatrix& x, const QuantizedMatrix& w, bool int32_accumulator) {
  validate(x, "scaled_gemm activations");
  validate(w, "scaled_gemm weights");
  if (x.cols != w.cols)
    throw Error("scaled_gemm", "inner dimensions differ: " + std::to_string(x.cols) + " vs " +
                                   std::to_string(w.cols));
  const auto cuts = segments(x.cols, x.block_cols, w.block_cols);
  const double lat = x.lattice * w.lattice;
  const std::vector<int64_t> xcodes = x.code_vector();
  if (x.code_bound() * w.code_bound() * static_cast<double>(longest_segment(cuts)) < 0x1p53) {
    Matrix xd(x.rows, x.cols), sx(x.rows, static_cast<int64_t>(cuts.size()) - 1);
    for (size_t i = 0; i < xcodes.size(); ++i)
      xd.data[i] = static_cast<double>(xcodes[i]);
    for (int64_t t = 0; t < x.rows; ++t)
      for (int64_t s = 0; s + 1 < static_cast<int64_t>(cuts.size()); ++s)
        sx(t, s) = x.scale(t, cuts[static_cast<size_t>(s)]);
    SegmentedScales sc;
    sc.cuts = cuts;
    sc.lattice = lat;
    sc.sx = &sx;
    sc.row_scales = weight_scales(w, cuts);
    sc.int32_check = int32_accumulator;
    return matmul_nt_rows_segmented(xd, w.rows, code_rows(w), sc);
  }
  Matrix y(x.rows, w.rows);
  parallel_chunks(w.rows, x.rows * w.rows * w.cols, [&](int64_t n0, int64_t n1) {
    std::vector<int64_t> wr(static_cast<size_t>(w.cols));
    for (int64_t n = n0; n < n1; ++n) {
      w.row_codes(n, wr);
      for (int64_t t = 0; t < x.rows; ++t) {
        const int64_t* xr = xcodes.data() + t * x.cols;
        double acc = 0.0;
        for (size_t s = 0; s + 1 < cuts.size(); ++s) {
          Int128 dot = 0;
          for (int64_t k = cuts[s]; k < cuts[s + 1]; ++k)
            dot += static_cast<Int128>(xr[k]) * wr[static_cast<size_t>(k)];
          if (int32_accumulator && (dot > INT32_MAX || dot < INT32_MIN))
            throw Error("scaled_gemm", "int32 accumulator overflow at output (" +
                                           std::to_string(t) + ", " + std::to_string(n) + ")");
          acc += static_cast<double>(dot) * lat * x.scale(t, cuts[s]) * w.scale(n, cuts[s]);
        }
        y(t, n) = acc;
      }
    }
  });
  return y;
}

// The segment sums are fp64 sums of x times integer codes in ascending k: exactly what
// matmul_nt_rows_segmented computes over the codes as doubles (exact below 2^53).
Matrix weight_only_gemm(const Matrix& x, const QuantizedMatrix& w) {
  validate(w, "weight_only_gemm weights");
  if (x.cols != w.cols)
    throw Error("weight_only_gemm", "inner dimensions differ: " + std::to_string(x.cols) + " vs " +
                                        std::to_string(w.cols));
  if (!(w.code_bound() < 0x1p53))
    throw Error("weight_only_gemm", "weight codes beyond 2^53 have no exact fp64 value");
  const auto cuts = segments(w.cols, w.block_cols, w.block_cols);
  SegmentedScales sc;
  sc.cuts = cuts;
  sc.lattice = w.lattice;
  sc.row_scales = weight_scales(w, cuts);
  return matmul_nt_rows_segmented(x, w.rows, code_rows(w), sc);
}

}  // namespace qparity::reference
