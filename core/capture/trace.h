#pragma once
// Capture hooks: the named tensors a forward pass records at the capture points of
// ARCHITECTURE.md ("embed", "layers.3.attn.core", ..., "logits"), for every token, in execution
// order. A pattern selects which points are kept: comma-separated globs (`*` any run of
// characters, `?` one), e.g. "layers.*.residual,logits"; "*" keeps everything, "" nothing.
// Rows accumulate across calls, so a prefill followed by decode steps yields one matrix per point
// with a row per token.
#include <cstdint>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "core/matrix.h"

namespace qparity {

bool glob_match(std::string_view pattern, std::string_view name);

class Trace {
 public:
  explicit Trace(std::string pattern = "*");
  // What the constructor took: a trace of another engine rank wants the same points.
  const std::string& pattern() const { return pattern_; }

  bool wants(std::string_view name) const;
  // Appends x's rows to the point `name` (created on first use; the column count must not change).
  void record(const std::string& name, const Matrix& x);

  // (name, rows) in first-recorded order.
  const std::vector<std::pair<std::string, Matrix>>& points() const { return points_; }
  const Matrix* find(std::string_view name) const;
  const Matrix& at(std::string_view name) const;  // throws naming the point when absent
  void clear() { points_.clear(); }

 private:
  std::string pattern_;
  std::vector<std::string> globs_;
  std::vector<std::pair<std::string, Matrix>> points_;
};

}  // namespace qparity
