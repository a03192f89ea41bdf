#pragma once
// A policy's detection limit, measured on the comparison at hand: how large an error confined to
// one slice of a point (one channel, one 32-column block, one head, one token) must be before
// the point's gate fails. The error is planted on the candidate as dumped (its own noise kept):
// its values on the slice times (1 + eps), eps on the grid 2^-14, 2^-13.5, ..., 2^2; the limit is
// the smallest eps that fails, found by bisection over the grid (a larger planted error never
// passes where a smaller one failed: every gate grows with it). "This PASS excludes an error of
// that size or more on such a slice at this point"; smaller ones may pass.
#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "golden/policy.h"

namespace qparity::golden {

enum class SliceShape { kChannel, kBlock32, kHead, kToken };
const char* to_string(SliceShape s);  // "one channel", "one 32-column block", ...

struct DetectionLimit {
  std::string point;
  SliceShape shape = SliceShape::kChannel;
  int64_t index = 0;               // the column / block / head / row the error was planted on
  std::optional<double> smallest;  // nullopt: not caught even at 2^2 (400 %)
};

// The points whose limits a report shows: the first decoder layer's attn.qkv, attn.core,
// attn.out and mlp.out / moe.out.
bool shows_detection_limit(const std::string& point);

// The limits of `point` ([rows, cols], golden g, candidate c) under `section`, for the shapes
// that fit it (a head: head_dim > 0 columns of attn.core). Empty when the point has no gate or
// the candidate already fails it.
std::vector<DetectionLimit> detection_limits(const PolicySection& section, const std::string& point,
                                             std::span<const double> g, std::span<const double> c,
                                             int64_t rows, int64_t cols, int64_t head_dim);

}  // namespace qparity::golden
