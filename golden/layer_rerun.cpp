#include "golden/layer_rerun.h"

#include <regex>

#include "reference_cpu/models/trace.h"

namespace qparity::golden {

LayerRerun rerun_layer_point(reference::CausalLm& model, const GoldenReader& golden,
                             const std::string& point, const PolicySection* section) {
  LayerRerun out;
  std::smatch m;
  static const std::regex layer_point(R"(^layers\.(\d+)\.)");
  if (!std::regex_search(point, m, layer_point)) {
    out.why_not = point + " is not inside a decoder layer";
    return out;
  }
  const int64_t layer = std::stoll(m[1].str());
  out.input_point = layer == 0 ? "embed" : "layers." + std::to_string(layer - 1) + ".residual";
  if (!golden.has_point(out.input_point)) {
    out.why_not = "the golden lacks " + out.input_point + ", the layer's input";
    return out;
  }
  const Array2D in = golden.point(out.input_point);
  const Array2D want = golden.point(point);
  const int64_t t = golden.seq_len();
  Array2D got{0, want.cols, {}};
  std::vector<int64_t> pos(static_cast<size_t>(t));
  for (int64_t i = 0; i < t; ++i)
    pos[static_cast<size_t>(i)] = i;
  for (int64_t s = 0; s < golden.sequences(); ++s) {
    model.reset_cache();  // every golden sequence starts from an empty cache
    reference::Matrix x(t, in.cols);
    std::copy(in.data.begin() + s * t * in.cols, in.data.begin() + (s + 1) * t * in.cols,
              x.data.begin());
    reference::Trace trace(point);
    reference::ForwardHooks hooks;
    hooks.trace = &trace;
    model.forward_layer(layer, std::move(x), pos, hooks);
    const reference::Matrix& p = trace.at(point);
    got.data.insert(got.data.end(), p.data.begin(), p.data.end());
    got.rows += p.rows;
  }
  model.reset_cache();
  out.available = true;
  out.stats = compare_point(want.data, got.data, want.rows, want.cols,
                            point.find("topk_ids") != std::string::npos);
  if (section) out.verdict = judge_point(*section, point, out.stats);
  out.local = !out.verdict.pass;
  return out;
}

}  // namespace qparity::golden
