#pragma once
// A row-major fp64 matrix: weights [N, K] (PyTorch Linear layout), activations [T, K], outputs
// [T, N], capture points [tokens, width]. Deliberately plain: the reference's reductions run in a
// fixed order written out in the code that uses it (schemes/math/matmul.h), so results do
// not depend on a BLAS or on the thread count.
#include <cstdint>
#include <span>
#include <vector>

namespace qparity {

struct Matrix {
  int64_t rows = 0;
  int64_t cols = 0;
  std::vector<double> data;

  Matrix() = default;
  Matrix(int64_t r, int64_t c, double fill = 0.0)
      : rows(r), cols(c), data(static_cast<size_t>(r * c), fill) {}

  double& operator()(int64_t r, int64_t c) { return data[static_cast<size_t>(r * cols + c)]; }
  double operator()(int64_t r, int64_t c) const { return data[static_cast<size_t>(r * cols + c)]; }
  std::span<double> row(int64_t r) { return {data.data() + r * cols, static_cast<size_t>(cols)}; }
  std::span<const double> row(int64_t r) const {
    return {data.data() + r * cols, static_cast<size_t>(cols)};
  }
};

}  // namespace qparity
