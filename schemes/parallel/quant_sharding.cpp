#include "schemes/parallel/quant_sharding.h"

#include <optional>

#include "core/error.h"
#include "core/parallel/tp_sharding.h"

namespace qparity {

namespace {

// One axis of a registry shape, relative to the weight [N, K].
struct Axis {
  enum class Of { kRows, kCols, kConst } of = Of::kConst;
  int64_t per = 1;    // weight rows / columns per element of this axis (kRows, kCols)
  int64_t value = 0;  // kConst
};

int64_t ceil_div(int64_t a, int64_t b) {
  return (a + b - 1) / b;
}

// "N", "Hkv*D", "ceil(N/128)", "K", "K/G", "K/8", "ceil(K/128)", "1": nullopt for what is not an
// axis of a linear's tensor (an engine stack's E, a norm's H).
std::optional<Axis> parse_axis(const std::string& t, const SchemeId& scheme) {
  const auto per_of = [&](const std::string& d) -> int64_t {
    if (d == "G") return effective_group_size(scheme);
    return std::stoll(d);
  };
  if (t == "N" || t == "Hkv*D") return Axis{Axis::Of::kRows, 1, 0};
  if (t == "K") return Axis{Axis::Of::kCols, 1, 0};
  // Packed b-bit codes (the packed-int family): 32/b codes a word, an axis of whole words where
  // b divides 32; other widths straddle words and have no slice rule.
  if (t == "ceil(K*b/32)" || t == "ceil(N*b/32)") {
    const int b = scheme.kind == SchemeKind::kPackedInt ? scheme.int_weights.bits : 0;
    if (b <= 0 || 32 % b != 0) return std::nullopt;
    return Axis{t[5] == 'K' ? Axis::Of::kCols : Axis::Of::kRows, 32 / b, 0};
  }
  if (t == "K/G" && effective_group_size(scheme) <= 0) return std::nullopt;  // channel, tensor
  if (t.starts_with("K/")) return Axis{Axis::Of::kCols, per_of(t.substr(2)), 0};
  if (t.starts_with("ceil(N/") && t.ends_with(")"))
    return Axis{Axis::Of::kRows, per_of(t.substr(7, t.size() - 8)), 0};
  if (t.starts_with("ceil(K/") && t.ends_with(")"))
    return Axis{Axis::Of::kCols, per_of(t.substr(7, t.size() - 8)), 0};
  if (!t.empty() && t.find_first_not_of("0123456789") == std::string::npos)
    return Axis{Axis::Of::kConst, 1, std::stoll(t)};
  return std::nullopt;
}

// "[N, K/G]" -> its axes; nullopt when some token is not a linear's axis.
std::optional<std::vector<Axis>> parse_shape(const std::string& s, const SchemeId& scheme) {
  if (s.size() < 2 || s.front() != '[' || s.back() != ']') return std::nullopt;
  std::vector<Axis> axes;
  size_t at = 1;
  while (at < s.size() - 1) {
    size_t end = s.find(',', at);
    if (end == std::string::npos) end = s.size() - 1;
    std::string t = s.substr(at, end - at);
    while (!t.empty() && t.front() == ' ')
      t.erase(t.begin());
    const std::optional<Axis> a = parse_axis(t, scheme);
    if (!a) return std::nullopt;
    axes.push_back(*a);
    at = end + 1;
  }
  return axes;
}

std::string shape_text(const std::vector<uint64_t>& shape) {
  std::string s = "[";
  for (size_t i = 0; i < shape.size(); ++i)
    s += (i ? ", " : "") + std::to_string(shape[i]);
  return s + "]";
}

// The stored extent an axis has for a weight [n, k].
int64_t extent(const Axis& a, int64_t n, int64_t k) {
  switch (a.of) {
    case Axis::Of::kRows:
      return ceil_div(n, a.per);
    case Axis::Of::kCols:
      return ceil_div(k, a.per);
    case Axis::Of::kConst:
      return a.value;
  }
  return 0;
}

bool matches(const std::vector<Axis>& axes, const std::vector<uint64_t>& shape, int64_t n,
             int64_t k) {
  if (axes.size() != shape.size()) return false;
  for (size_t i = 0; i < axes.size(); ++i)
    if (extent(axes[i], n, k) != static_cast<int64_t>(shape[i])) return false;
  return true;
}

// [begin, end) of the weight's rows or columns (total `total`) in units of `per`: an Error when a
// unit straddles the boundary (the whole tensor's ragged last unit is allowed).
QuantTensorShard slice(const std::string& name, int dim, int64_t begin, int64_t end, int64_t total,
                       int64_t per, const char* what, int rank) {
  const auto straddles = [&](int64_t at) { return at % per != 0 && at != total; };
  if (straddles(begin) || straddles(end))
    throw Error(name, "a block of " + std::to_string(per) + " weight " + what + " straddles rank " +
                          std::to_string(rank) + "'s boundary (its " + what + " [" +
                          std::to_string(begin) + ", " + std::to_string(end) +
                          ")): the partition must hold whole groups / blocks / packed words");
  return {QuantShardKind::kSlice, dim, begin / per, ceil_div(end, per)};
}

}  // namespace

QuantTensorShard quant_tensor_shard(const ModelConfig& cfg, const SchemeId& scheme,
                                    const std::string& linear, const std::string& tensor,
                                    const std::vector<uint64_t>& shape, int64_t n, int64_t k,
                                    int rank, int tp, bool act_order) {
  const std::string name = linear + "." + tensor;
  if (scheme.kind == SchemeKind::kW4A8Dyn)
    throw Error(name,
                "scheme w4a8-dyn has no tensor-parallel rule yet (int4 pairs packed along N; "
                "scale_bias's 16 K-chunk columns would split with the ranks, as vllm-ascend's "
                "16 / tp)");
  uint64_t numel = 1;
  for (const uint64_t d : shape)
    numel *= d;
  // A KV-cache tensor of an attention module ("k_proj.kv_cache_scale") follows that projection;
  // one of the attention itself (kv-fp8's k_scale / v_scale) is a per-tensor scalar.
  const size_t dot = tensor.rfind('.');
  if (scheme_family(scheme.kind) == SchemeFamily::kKvCache && dot == std::string::npos) {
    // kv-fp8-head: [Hkv, 1, 1] (or [Hkv]), one scale per KV head; each rank keeps its heads.
    if (scheme.kv_per_head) {
      const int64_t h = shape.empty() ? 0 : static_cast<int64_t>(shape[0]);
      if (h <= 0 || static_cast<int64_t>(numel) != h || h % tp != 0)
        throw Error(name, "shape " + shape_text(shape) + ": per-KV-head scales split across " +
                              std::to_string(tp) +
                              " ranks need num_kv_heads scales divisible by tp");
      QuantTensorShard q;
      q.kind = QuantShardKind::kSlice;
      q.dim = 0;
      q.begin = rank * (h / tp);
      q.end = (rank + 1) * (h / tp);
      return q;
    }
    if (numel != 1)
      throw Error(name, "shape " + shape_text(shape) +
                            ": an attention's KV-cache scale is one "
                            "value (per-tensor); no tensor-parallel "
                            "rule for others");
    return {};
  }
  const std::string weight_linear =
      dot == std::string::npos ? linear : linear + "." + tensor.substr(0, dot);
  const TensorShard w =
      tensor_shard(cfg, weight_linear + ".weight",
                   {static_cast<uint64_t>(n), static_cast<uint64_t>(k)}, rank, tp);
  if (w.kind == ShardKind::kVocab)
    throw Error(name, "a quantized embedding or lm_head has no tensor-parallel rule");
  // The registry's shape for this tensor that the stored shape matches.
  std::optional<std::vector<Axis>> axes;
  bool known = false;
  for (const TensorSpec& spec : scheme_info(scheme.kind).tensors) {
    if (spec.name != tensor) continue;
    const std::optional<std::vector<Axis>> a = parse_shape(spec.shape, scheme);
    if (!a) continue;  // an engine-side stack, not a checkpoint tensor of one linear
    known = true;
    if (matches(*a, shape, n, k)) {
      axes = a;
      break;
    }
    // Older files store [N] where the registry says [N, 1].
    if (a->size() == 2 && (*a)[1].of == Axis::Of::kConst && (*a)[1].value == 1 &&
        matches({(*a)[0]}, shape, n, k)) {
      axes = std::vector<Axis>{(*a)[0]};
      break;
    }
  }
  if (!known)
    throw Error(name, "scheme " + to_string(scheme) + " stores no tensor '" + tensor +
                          "' (qparity schemes lists its tensors): no tensor-parallel rule");
  if (!axes) {
    if (numel == 1) return {};  // a per-tensor scale stored where a per-channel one may be
    throw Error(name, "shape " + shape_text(shape) + " matches none of scheme " +
                          to_string(scheme) + "'s shapes for '" + tensor + "' with weight [" +
                          std::to_string(n) + ", " + std::to_string(k) + "]");
  }
  const auto axis_of = [&](Axis::Of of) -> int {
    for (size_t i = 0; i < axes->size(); ++i)
      if ((*axes)[i].of == of) return static_cast<int>(i);
    return -1;
  };
  if (w.kind == ShardKind::kColumn) {
    const int d = axis_of(Axis::Of::kRows);
    if (d < 0) return {};
    return slice(name, d, w.begin, w.end, n, (*axes)[static_cast<size_t>(d)].per, "rows", rank);
  }
  if (w.kind == ShardKind::kRow) {
    const int d = axis_of(Axis::Of::kCols);
    // Act-order groups index the scale grid by g_idx, not by column: the grid stays whole.
    const bool group_grid =
        tensor == "weight_scale" || tensor == "weight_offset" || tensor == "weight_zero_point";
    if (act_order && group_grid) return {};
    if (d >= 0)
      return slice(name, d, w.begin, w.end, k, (*axes)[static_cast<size_t>(d)].per, "columns",
                   rank);
    if (tensor == "quant_bias" || tensor == "bias")
      return {rank == 0 ? QuantShardKind::kWhole : QuantShardKind::kZeros, 0, 0, 0};
    return {};
  }
  return {};  // a replicated weight: everything whole
}

}  // namespace qparity
