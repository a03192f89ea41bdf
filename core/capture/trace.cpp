#include "core/capture/trace.h"

#include "core/error.h"

namespace qparity {

bool glob_match(std::string_view p, std::string_view s) {
  // Iterative wildcard match with backtracking to the last '*': linear in practice.
  size_t pi = 0, si = 0, star = std::string_view::npos, mark = 0;
  while (si < s.size()) {
    if (pi < p.size() && (p[pi] == '?' || p[pi] == s[si])) {
      ++pi, ++si;
    } else if (pi < p.size() && p[pi] == '*') {
      star = pi++;
      mark = si;
    } else if (star != std::string_view::npos) {
      pi = star + 1;
      si = ++mark;
    } else {
      return false;
    }
  }
  while (pi < p.size() && p[pi] == '*')
    ++pi;
  return pi == p.size();
}

Trace::Trace(std::string pattern) : pattern_(pattern) {
  size_t start = 0;
  while (start <= pattern.size()) {
    const size_t comma = pattern.find(',', start);
    std::string g =
        pattern.substr(start, comma == std::string::npos ? std::string::npos : comma - start);
    const size_t a = g.find_first_not_of(" \t"), b = g.find_last_not_of(" \t");
    g = a == std::string::npos ? "" : g.substr(a, b - a + 1);  // "a, b" as well as "a,b"
    if (!g.empty()) globs_.push_back(g);
    if (comma == std::string::npos) break;
    start = comma + 1;
  }
}

bool Trace::wants(std::string_view name) const {
  for (const auto& g : globs_)
    if (glob_match(g, name)) return true;
  return false;
}

void Trace::record(const std::string& name, const Matrix& x) {
  if (!wants(name)) return;
  for (auto& [n, m] : points_) {
    if (n != name) continue;
    if (m.cols != x.cols)
      throw Error("trace point " + name,
                  "has " + std::to_string(m.cols) + " columns, now " + std::to_string(x.cols));
    m.data.insert(m.data.end(), x.data.begin(), x.data.end());
    m.rows += x.rows;
    return;
  }
  points_.emplace_back(name, x);
}

const Matrix* Trace::find(std::string_view name) const {
  for (const auto& [n, m] : points_)
    if (n == name) return &m;
  return nullptr;
}

const Matrix& Trace::at(std::string_view name) const {
  const Matrix* m = find(name);
  if (!m) throw Error("trace", "no capture point '" + std::string(name) + "' was recorded");
  return *m;
}

}  // namespace qparity
