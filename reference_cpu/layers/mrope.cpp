#include "reference_cpu/layers/mrope.h"

#include <algorithm>
#include <string>

#include "core/error.h"

namespace qparity::reference {

MropePositions mrope_positions(std::span<const int64_t> tokens, int64_t image_token_id,
                               std::span<const GridThw> grids, int64_t merge,
                               int64_t vision_start_token_id) {
  MropePositions p;
  const auto n = static_cast<int64_t>(tokens.size());
  int64_t next = 0;  // 1 + the largest position so far
  auto text = [&](int64_t count) {
    for (int64_t i = 0; i < count; ++i) {
      p.t.push_back(next + i);
      p.h.push_back(next + i);
      p.w.push_back(next + i);
    }
    if (count > 0) next += count;
  };
  int64_t st = 0;
  for (size_t g = 0; g < grids.size(); ++g) {
    const GridThw& grid = grids[g];
    const int64_t hm = grid.h / merge, wm = grid.w / merge;
    const int64_t run = grid.t * hm * wm;
    const auto it = std::find(tokens.begin() + st, tokens.end(), image_token_id);
    if (it == tokens.end())
      throw Error("image " + std::to_string(g),
                  "has no placeholder run (token " + std::to_string(image_token_id) +
                      ") left in the prompt after token " + std::to_string(st));
    const auto ed = static_cast<int64_t>(it - tokens.begin());
    int64_t len = 0;
    while (ed + len < n && tokens[static_cast<size_t>(ed + len)] == image_token_id && len < run)
      ++len;
    const bool longer = ed + len < n && tokens[static_cast<size_t>(ed + len)] == image_token_id;
    if (len != run || longer)
      throw Error("token " + std::to_string(ed),
                  "image " + std::to_string(g) + "'s placeholder run is " +
                      (longer ? "longer than" : std::to_string(len) + " tokens, not") + " the " +
                      std::to_string(run) + " its grid (" + std::to_string(grid.t) + ", " +
                      std::to_string(grid.h) + ", " + std::to_string(grid.w) + ") merges to");
    if (vision_start_token_id >= 0 &&
        (ed == 0 || tokens[static_cast<size_t>(ed - 1)] != vision_start_token_id))
      throw Error("token " + std::to_string(ed), "image " + std::to_string(g) +
                                                     "'s placeholder run must directly follow the "
                                                     "vision_start token (" +
                                                     std::to_string(vision_start_token_id) + ")");
    text(ed - st);
    const int64_t base = next;
    int64_t largest = base;
    for (int64_t ti = 0; ti < grid.t; ++ti)
      for (int64_t hi = 0; hi < hm; ++hi)
        for (int64_t wi = 0; wi < wm; ++wi) {
          p.t.push_back(base + ti);
          p.h.push_back(base + hi);
          p.w.push_back(base + wi);
          largest = std::max({largest, base + ti, base + hi, base + wi});
        }
    next = largest + 1;
    st = ed + run;
  }
  if (const auto it = std::find(tokens.begin() + st, tokens.end(), image_token_id);
      it != tokens.end())
    throw Error("token " + std::to_string(it - tokens.begin()),
                "an image placeholder with no image grid left (" + std::to_string(grids.size()) +
                    " given)");
  text(n - st);
  p.delta = next - n;
  return p;
}

}  // namespace qparity::reference
