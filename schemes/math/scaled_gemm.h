#pragma once
// Exact accumulation for quantized GEMMs.
//
// A QuantizedMatrix holds integer codes on a lattice: element (r, c) has the value
//     codes(r, c) * lattice * scales(r / block_rows, c / block_cols).
// Every format here sits on such a lattice: int codes (lattice 1; zero points already
// subtracted, so codes are q - z), fp8 e4m3 values (multiples of 2^-9, its smallest subnormal),
// e5m2 (2^-16), e2m1 (0.5). The scale grid covers tensor (one block), channel (1 x K), group
// (1 x G), 2-D block (bn x bk) and per-token (1 x K on the activation side) strategies.
//
// scaled_gemm(x, w): y[t, n] = sum over K-segments of (sum_k xc[t,k] * wc[n,k]) * lat_x * lat_w *
// sx[t, seg] * sw[n, seg], where a segment is a maximal run of k on which both scales are
// constant. The inner sum is integer arithmetic in 128 bits: exact, whatever K, which is how an
// int8 GEMM accumulates (int32 on hardware; a sum that would not fit int32 is reported, since a
// real kernel would wrap) and what an fp8/fp4 tensor core approximates (fp32 accumulation). The
// outer sum over segments is fp64 in ascending k, so results are independent of threading.
// How: codes become doubles and run through the fp64 panel kernel (matmul_nt_rows_segmented)
// when every partial sum stays below 2^53 in magnitude (max |x code| * max |w code| * segment
// length), where fp64 integer sums are exact in any order: the int128 sum's bits, at the speed of
// the fp64 products; otherwise the int128 loop itself.
#include <cstdint>
#include <span>
#include <vector>

#include "schemes/math/matmul.h"
#include "schemes/method/code_store.h"

namespace qparity::reference {

struct QuantizedMatrix {
  int64_t rows = 0;
  int64_t cols = 0;
  // Row-major stored codes while the matrix is built (and for activations, which live briefly).
  // compact() moves them into `packed`, in as few bits as they need (a loaded weight's form).
  std::vector<int64_t> codes;
  double lattice = 1.0;
  int64_t block_rows = 1;  // rows sharing one scale row
  int64_t block_cols = 1;  // columns sharing one scale column
  Matrix scales;           // [ceil(rows / block_rows), ceil(cols / block_cols)]
  CodeStore packed;
  // Optional integer zero points, one per scale block ([scales.rows * scales.cols], row-major):
  // code(r, c) = stored(r, c) - zero. They let asymmetric int weights keep their raw q codes
  // (one byte for int8) instead of q - z (nine bits).
  std::vector<int64_t> zero_points;

  bool compacted() const { return codes.empty() && packed.size() > 0; }
  int64_t stored(int64_t r, int64_t c) const {
    const int64_t i = r * cols + c;
    return compacted() ? packed.at(i) : codes[static_cast<size_t>(i)];
  }
  int64_t zero(int64_t r, int64_t c) const {
    return zero_points.empty()
               ? 0
               : zero_points[static_cast<size_t>((r / block_rows) * scales.cols + c / block_cols)];
  }
  int64_t code(int64_t r, int64_t c) const { return stored(r, c) - zero(r, c); }
  double scale(int64_t r, int64_t c) const { return scales(r / block_rows, c / block_cols); }
  double value(int64_t r, int64_t c) const {
    return static_cast<double>(code(r, c)) * lattice * scale(r, c);
  }
  // The stored codes of row r (zero points not subtracted) into out [cols].
  void stored_row(int64_t r, std::span<int64_t> out) const;
  // The codes (zero points subtracted) of row r into out [cols].
  void row_codes(int64_t r, std::span<int64_t> out) const;
  // code(r, c) for c in [c0, c0 + out.size()), as doubles (exact below 2^53): the products' form.
  void row_codes_as_doubles(int64_t r, int64_t c0, std::span<double> out) const;
  // Every code, row-major, zero points subtracted.
  std::vector<int64_t> code_vector() const;
  // Moves `codes` into `packed` (after validate()); a no-op when already compact.
  void compact();
  // Heap bytes held by codes, zero points and scales.
  size_t bytes() const;
  // An upper bound on |code(r, c)| (zero points subtracted), as a double.
  double code_bound() const;
};

// The code of `value` on `lattice` (value / lattice must be an integer; else an Error).
int64_t lattice_code(double value, double lattice);

// Checks sizes and that the scale grid covers the matrix; `where` names it in errors.
void validate(const QuantizedMatrix& m, const char* where);

// All values in fp64 (exact products of code, lattice and scale up to one rounding).
Matrix dequantize(const QuantizedMatrix& m);

// Both operands quantized: x [T, K], w [N, K] -> y [T, N], integer-exact per segment. When
// `int32_accumulator` is set (integer GEMMs), a segment sum outside int32 is an Error, as the
// hardware accumulator would overflow.
Matrix scaled_gemm(const QuantizedMatrix& x, const QuantizedMatrix& w,
                   bool int32_accumulator = false);

// Weight-only: x stays fp64; y[t, n] = sum over weight scale segments of
// (sum_k x[t,k] * wc[n,k]) * lat_w * sw[n, seg], sums in ascending k.
Matrix weight_only_gemm(const Matrix& x, const QuantizedMatrix& w);

}  // namespace qparity::reference
