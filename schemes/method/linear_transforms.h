#pragma once
// Online rotations around one linear layer (compressed-tensors transform_config;
// schemes/description/online_transform.h): the input transform multiplies x before the layer
// (its activation quantization, if any, sees the rotated x, as compressed-tensors' pre-hook and
// vLLM's CompressedTensorsLinearTransformMethod order them), the output transform of partition p
// multiplies that partition's columns of y after it. All in fp64.
#include <cstdint>
#include <memory>
#include <vector>

#include "core/matrix.h"
#include "schemes/description/online_transform.h"

namespace qparity::reference {

// One online transform ready to apply: value' = value @ T, T block diagonal with `block`-order
// blocks, each `t` (row-major [block, block]: permuted, transposed for an inverse Hadamard,
// normalised).
struct TransformMatrix {
  int64_t block = 0;
  std::vector<double> t;
};

// x [rows, K] -> x @ blockdiag(T, ..., T); K must be a multiple of the block. Each output is the
// ascending sum over the block's rows in fp64 (matmul_nt's order and bits).
Matrix apply_transform(const Matrix& x, const TransformMatrix& m);

// The matrix compressed-tensors applies for a stored one (its TransformBase.forward): for the
// Hadamard types H[perm][:, perm], transposed when inverse, divided by sqrt(n) (stored entries
// +-1); a random-matrix transform as stored (its inverse is stored as its own matrix). `stored`
// is [n, n] row-major; `perm` empty or a permutation of 0..n-1.
TransformMatrix applied_transform(TransformType type, bool inverse, int64_t n,
                                  const std::vector<double>& stored,
                                  const std::vector<int64_t>& perm);

struct LinearTransforms {
  std::shared_ptr<const TransformMatrix> input;                // null: none
  std::vector<std::shared_ptr<const TransformMatrix>> output;  // per partition (null: none)

  bool empty() const;
};

}  // namespace qparity::reference
