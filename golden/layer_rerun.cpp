#include "golden/layer_rerun.h"

#include <regex>
#include "core/capture/capture_points.h"

#include "core/capture/trace.h"
#include "golden/reference_run.h"  // sequence_image_features, record_activation_codes

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
  out.input_point = layer_input_point(layer);
  if (!golden.has_point(out.input_point)) {
    out.why_not = "the golden lacks " + out.input_point + ", the layer's input";
    return out;
  }
  const Array2D in = golden.point(out.input_point);
  const Array2D want = golden.point(point);
  const int64_t t = golden.seq_len();
  // Per-slot MoE points are compared on the experts both runs chose: the router ids come along.
  const bool experts = slots_follow_router(point);
  const std::string ids_point = experts ? slot_ids_point(point) : "";
  if (experts && !golden.has_point(ids_point)) {
    out.why_not = "the golden lacks " + ids_point + ", needed to align " + point;
    return out;
  }
  Array2D got{0, want.cols, {}}, got_ids{0, 0, {}};
  std::vector<int64_t> pos(static_cast<size_t>(t));
  for (int64_t i = 0; i < t; ++i)
    pos[static_cast<size_t>(i)] = i;
  // Image prompts: each sequence's rotary rows and deepstack features from the golden's images.
  const GoldenImages images = golden.images();
  for (int64_t s = 0; s < golden.sequences(); ++s) {
    model.reset_cache();  // every golden sequence starts from an empty cache
    Matrix x(t, in.cols);
    std::copy(in.data.begin() + s * t * in.cols, in.data.begin() + (s + 1) * t * in.cols,
              x.data.begin());
    Trace trace(experts ? point + "," + ids_point : point);
    reference::ForwardHooks hooks;
    hooks.trace = &trace;
    // Activation-code points (x_values / x_scales) come through their own hook, as in the
    // golden's run (reference_run.cpp).
    hooks.on_activation_codes = [&trace](const std::string& name,
                                         const reference::QuantizedMatrix& q) {
      record_activation_codes(trace, name, q);
    };
    if (images.empty()) {
      model.forward_layer(layer, std::move(x), pos, hooks);
    } else {
      const std::span<const int64_t> tokens(golden.tokens().data() + s * t, static_cast<size_t>(t));
      model.forward_layer(layer, std::move(x),
                          model.prepare_image_prompt(tokens, sequence_image_features(images, s)),
                          hooks);
    }
    const Matrix& p = trace.at(point);
    got.data.insert(got.data.end(), p.data.begin(), p.data.end());
    got.rows += p.rows;
    if (experts) {
      const Matrix& ids = trace.at(ids_point);
      got_ids.data.insert(got_ids.data.end(), ids.data.begin(), ids.data.end());
      got_ids.cols = ids.cols;
    }
  }
  model.reset_cache();
  out.available = true;
  out.stats = compare_rerun_point(golden, point, got.data, got_ids.data);
  if (section) out.verdict = judge_point(*section, point, out.stats);
  out.local = !out.verdict.pass;
  return out;
}

Runner reference_runner(reference::CausalLm& model, std::string name) {
  return {std::move(name),
          [&model](const GoldenReader& source, const std::string& point,
                   std::string* why_not) -> std::optional<PointStats> {
            LayerRerun r = rerun_layer_point(model, source, point, nullptr);
            if (!r.available) {
              *why_not = r.why_not;
              return std::nullopt;
            }
            return r.stats;
          }};
}

bool slots_follow_router(const std::string& point) {
  return point_suffix(point) == point::kMoeExpertOut ||
         point_suffix(point) == point::kMoeTopkWeights;
}

std::string slot_ids_point(const std::string& point) {
  return point.substr(0, point.rfind('.') + 1) + "topk_ids";
}

PointStats compare_rerun_point(const GoldenReader& golden, const std::string& point,
                               const std::vector<double>& got, const std::vector<double>& got_ids) {
  const Array2D want = golden.point(point);
  if (slots_follow_router(point)) {
    const Array2D want_ids = golden.point(slot_ids_point(point));
    const ExpertAlignment al =
        align_expert_outputs(want.data, got, want_ids.data, got_ids, want.rows, want_ids.cols,
                             want_ids.cols > 0 ? want.cols / want_ids.cols : 0);
    return compare_point(al.golden, al.candidate, want.rows, want.cols, false);
  }
  const bool ids = point.ends_with(".topk_ids");
  PointStats st = compare_point(want.data, got, want.rows, want.cols, ids);
  if (ids)  // as sets, like compare_goldens
    st.mismatches = compare_router(want.data, got, want.rows, want.cols).changed_ids;
  return st;
}

}  // namespace qparity::golden
