#include "schemes/loading/online_transform_matrices.h"

#include <bit>
#include <cmath>
#include <cstring>

#include "core/error.h"
#include "schemes/math/numeric.h"
#include "schemes/method/host_tensor.h"
#include "schemes/method/tensor_decode.h"

namespace qparity::reference {

namespace {

bool is_float(DType d) {
  return d == DType::kBF16 || d == DType::kF16 || d == DType::kF32 || d == DType::kF64;
}

// compressed-tensors' deterministic_hadamard_matrix (Sylvester's construction):
// H[i][j] = (-1)^popcount(i & j).
std::vector<double> sylvester(int64_t n) {
  std::vector<double> h(static_cast<size_t>(n * n));
  for (int64_t i = 0; i < n; ++i)
    for (int64_t j = 0; j < n; ++j)
      h[static_cast<size_t>(i * n + j)] =
          (std::popcount(static_cast<uint64_t>(i & j)) % 2 == 0) ? 1.0 : -1.0;
  return h;
}

// A stored Hadamard matrix: every entry +-1, and a fixed sample of row pairs orthogonal (each
// dot product an exact integer sum in fp64). The whole H H^T = n I would be O(n^3).
void check_hadamard(const std::vector<double>& h, int64_t n, const std::string& where) {
  for (size_t i = 0; i < h.size(); ++i)
    if (h[i] != 1.0 && h[i] != -1.0)
      throw Error(where,
                  "a Hadamard transform's stored matrix has entries +-1 (compressed-"
                  "tensors divides by sqrt(" +
                      std::to_string(n) + ") when applying it), but element " + std::to_string(i) +
                      " is " + std::to_string(h[i]));
  const int64_t pairs = std::min<int64_t>(n, 64);
  for (int64_t s = 0; s < pairs; ++s) {
    const int64_t i = (s * 2654435761LL) % n, j = (i + 1 + s) % n;
    double dot = 0;
    for (int64_t k = 0; k < n; ++k)
      dot += h[static_cast<size_t>(i * n + k)] * h[static_cast<size_t>(j * n + k)];
    if (i != j && dot != 0.0)
      throw Error(where, "not a Hadamard matrix: rows " + std::to_string(i) + " and " +
                             std::to_string(j) + " are not orthogonal (dot product " +
                             std::to_string(dot) + ")");
  }
}

std::vector<int64_t> read_perm(const TensorRef& r, int64_t n, const std::string& where) {
  const DType d = r.info->dtype;
  if ((d != DType::kI64 && d != DType::kI32) || r.info->shape.size() != 1 ||
      static_cast<int64_t>(r.info->shape[0]) != n)
    throw Error(where,
                "expected an I64 [" + std::to_string(n) + "] permutation, got " +
                    std::string(dtype_name(d)) + " " +
                    shape_string(std::vector<int64_t>(r.info->shape.begin(), r.info->shape.end())));
  const auto bytes = r.bytes();
  std::vector<int64_t> p(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) {
    if (d == DType::kI64) {
      std::memcpy(&p[static_cast<size_t>(i)], bytes.data() + 8 * i, 8);
    } else {
      int32_t v;
      std::memcpy(&v, bytes.data() + 4 * i, 4);
      p[static_cast<size_t>(i)] = v;
    }
  }
  std::vector<bool> seen(static_cast<size_t>(n), false);
  for (int64_t i = 0; i < n; ++i) {
    const int64_t v = p[static_cast<size_t>(i)];
    if (v < 0 || v >= n || seen[static_cast<size_t>(v)])
      throw Error(where, "not a permutation of 0.." + std::to_string(n - 1) + " (element " +
                             std::to_string(i) + " is " + std::to_string(v) + ")");
    seen[static_cast<size_t>(v)] = true;
  }
  return p;
}

// One (group, size): compressed-tensors' factory caches one matrix per size for a group, shared
// by every module and location it applies to.
struct Need {
  const OnlineTransform* t = nullptr;  // the first use's (one group: one type, one randomize)
  std::vector<std::string> stems;      // "<module>.<group>_<location>", model order
};

}  // namespace

std::shared_ptr<const OnlineTransformMatrices> OnlineTransformMatrices::read(
    const Checkpoint& ckpt, const QuantPlan& plan) {
  std::map<std::pair<std::string, int64_t>, Need> needs;
  for (const PlanEntry& e : plan)
    for (const OnlineTransform& t : e.transforms) {
      Need& n = needs[{t.group, t.size}];
      if (!n.t) n.t = &t;
      n.stems.push_back(e.prefix + "." + t.stem());
    }
  std::map<std::pair<std::string, int64_t>, Stored> stored;
  auto out = std::make_shared<OnlineTransformMatrices>();
  const std::string root = ckpt.root().string();
  for (const auto& [k, need] : needs) {
    const int64_t n = k.second;
    const OnlineTransform& t = *need.t;
    Stored s;
    std::string first;  // the copy read first
    for (const std::string& stem : need.stems) {
      const std::string wname = stem + ".weight", pname = stem + ".perm";
      const std::string where = root + ": tensor '" + wname + "'";
      const bool has_w = ckpt.contains(wname), has_p = ckpt.contains(pname);
      if (has_p && !t.randomize)
        throw Error(root + ": tensor '" + pname + "'",
                    "a permutation for a transform without randomize (" + t.key + ")");
      if (!has_w) {
        if (has_p) throw Error(root + ": tensor '" + pname + "'", "present without " + wname);
        continue;
      }
      const TensorRef& r = ckpt.at(wname);
      const std::vector<int64_t> shape(r.info->shape.begin(), r.info->shape.end());
      if (!is_float(r.info->dtype) || shape != std::vector<int64_t>{n, n})
        throw Error(where, "expected a float [" + std::to_string(n) + ", " + std::to_string(n) +
                               "] transform matrix (" + t.key + "), got " +
                               std::string(dtype_name(r.info->dtype)) + " " + shape_string(shape));
      std::vector<double> w = decode_all(r.info->dtype, r.bytes(), r.info->numel(), where);
      require_finite(w, where);
      std::vector<int64_t> p;
      if (t.randomize) {
        if (!has_p)
          throw Error(root + ": tensor '" + pname + "'",
                      "missing: the transform randomizes (" + t.key +
                          ") and its permutation is stored beside " + wname);
        p = read_perm(ckpt.at(pname), n, root + ": tensor '" + pname + "'");
      }
      if (first.empty()) {
        first = wname;
        s.weight = std::move(w);
        s.perm = std::move(p);
      } else if (w != s.weight || p != s.perm) {
        throw Error(where, "differs from " + first +
                               " (compressed-tensors shares one matrix per transform and size; "
                               "which one applies to the modules that store none is not "
                               "determined)");
      }
      out->consumed_.insert(wname);
      if (has_p) out->consumed_.insert(pname);
    }
    if (first.empty()) {
      const std::string missing = root + ": tensor '" + need.stems.front() + ".weight'";
      if (t.type != TransformType::kHadamard || t.randomize)
        throw Error(missing, "missing: no module stores the " + to_string(t.type) +
                                 (t.randomize ? " (randomized)" : "") + " matrix of " + t.key +
                                 " for size " + std::to_string(n) +
                                 ", and only a plain hadamard transform is determined by the "
                                 "config alone");
      if (!std::has_single_bit(static_cast<uint64_t>(n)))
        throw Error(missing, "missing, and a hadamard transform of size " + std::to_string(n) +
                                 " is compressed-tensors' deterministic Sylvester matrix only "
                                 "for a power of two");
      s.weight = sylvester(n);
    } else if (t.type != TransformType::kRandomMatrix) {
      check_hadamard(s.weight, n, root + ": tensor '" + first + "'");
      if (t.type == TransformType::kHadamard && s.weight != sylvester(n))
        throw Error(root + ": tensor '" + first + "'",
                    "a 'hadamard' transform's matrix is compressed-tensors' deterministic "
                    "Sylvester matrix, and this stored one is not (a random-hadamard written "
                    "under the wrong type?)");
    }
    stored.emplace(k, std::move(s));
  }
  auto built = from_stored(plan, stored);
  out->matrices_ = built->matrices_;
  return out;
}

std::shared_ptr<const OnlineTransformMatrices> OnlineTransformMatrices::from_stored(
    const QuantPlan& plan, const std::map<std::pair<std::string, int64_t>, Stored>& stored) {
  auto out = std::make_shared<OnlineTransformMatrices>();
  for (const PlanEntry& e : plan)
    for (const OnlineTransform& t : e.transforms) {
      const auto key = std::make_tuple(t.stem(), t.size, t.inverse);
      if (out->matrices_.count(key)) continue;
      const auto it = stored.find({t.group, t.size});
      if (it == stored.end())
        throw Error(e.prefix, "no matrix for the online transform group " + t.group + " of size " +
                                  std::to_string(t.size));
      out->matrices_[key] = std::make_shared<const TransformMatrix>(
          applied_transform(t.type, t.inverse, t.size, it->second.weight, it->second.perm));
    }
  return out;
}

std::shared_ptr<const TransformMatrix> OnlineTransformMatrices::matrix(
    const OnlineTransform& t, const std::string& module) const {
  const auto it = matrices_.find(std::make_tuple(t.stem(), t.size, t.inverse));
  if (it == matrices_.end())
    throw Error(module, "the online transform " + t.stem() + " (" + t.key +
                            ") has no matrix: the loader was not given the checkpoint's "
                            "transform matrices");
  return it->second;
}

}  // namespace qparity::reference
