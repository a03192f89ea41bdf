#pragma once
// The matrices of a plan's online transforms (schemes/description/online_transform.h), read from
// the checkpoint once, before any layer is built: compressed-tensors saves a matrix shared by
// many modules under one of their names only (transformers keeps one name of tied tensors), so a
// layer's own tensors may not hold it, and a per-layer loader could not find it.
//
// For each (group, size) every stored copy `<module>.<group>_<location>.weight` (and `.perm`) of a
// module the group's online entries target is read; all copies must be equal (compressed-
// tensors' factory makes one matrix per size for a group, whatever the location). With none
// stored, a `hadamard` transform without randomize is compressed-tensors' own deterministic
// Sylvester matrix (deterministic_hadamard_matrix; a power of two); anything else is an Error
// naming the tensor it needs. A stored Hadamard matrix must have entries +-1 (compressed-tensors
// stores it unnormalised and divides by sqrt(size) when applying; a normalised one would be off by
// that factor), and a sample of its row pairs must be orthogonal.
//
// Precision: the reference applies every transform in fp64 (the stored +-1 entries, the
// permutation and the transposition are exact; 1/sqrt(size) is one fp64 rounding, folded into
// the matrix). The scheme's `precision` (float32 by default) is the producer's and the engines'
// arithmetic, recorded in the plan.
#include <cstdint>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include "core/safetensors/checkpoint.h"
#include "schemes/description/quant_plan.h"
#include "schemes/method/linear_transforms.h"

namespace qparity::reference {

class OnlineTransformMatrices {
 public:
  // Reads every matrix `plan`'s online transforms need from `ckpt`. Empty when the plan has none.
  static std::shared_ptr<const OnlineTransformMatrices> read(const Checkpoint& ckpt,
                                                             const QuantPlan& plan);
  // A plan's transforms on matrices given directly (tests), keyed by group and size:
  // {"v", 64} -> the stored [64, 64] matrix (and its perm, when the group randomizes).
  struct Stored {
    std::vector<double> weight;
    std::vector<int64_t> perm;
  };
  static std::shared_ptr<const OnlineTransformMatrices> from_stored(
      const QuantPlan& plan, const std::map<std::pair<std::string, int64_t>, Stored>& stored);

  // The matrix of `t` (one of the plan's); an Error naming `module` when it was not read.
  std::shared_ptr<const TransformMatrix> matrix(const OnlineTransform& t,
                                                const std::string& module) const;
  // Whether `tensor` is a transform tensor read here (the loaders skip it).
  bool consumed(const std::string& tensor) const { return consumed_.count(tensor) != 0; }
  bool empty() const { return matrices_.empty(); }

 private:
  // (stem, size, inverse) -> matrix
  std::map<std::tuple<std::string, int64_t, bool>, std::shared_ptr<const TransformMatrix>>
      matrices_;
  std::set<std::string> consumed_;
};

}  // namespace qparity::reference
