#include "schemes/parallel/checkpoint_shard.h"

#include <cstring>
#include <optional>

#include "core/error.h"
#include "core/parallel/tp_sharding.h"
#include "core/safetensors/safetensors_writer.h"
#include "schemes/parallel/quant_sharding.h"

namespace qparity {

namespace {

bool ends_with(const std::string& s, const std::string& suffix) {
  return s.size() >= suffix.size() &&
         s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}

// A tensor of the rank's shard: its bytes and shape.
struct ShardTensor {
  std::string name;
  DType dtype;
  std::vector<uint64_t> shape;
  std::vector<uint8_t> bytes;
};

// Bytes of `count` elements of `bits` each; an Error when they are not whole bytes.
uint64_t whole_bytes(uint64_t count, unsigned bits, const std::string& name, const char* what) {
  if (count * bits % 8 != 0)
    throw Error(name, std::string("a shard boundary falls inside a byte of packed ") + what +
                          ": no tensor-parallel slice of this layout");
  return count * bits / 8;
}

// [begin, end) along `dim` of a row-major tensor, then `pad_to` rows (dim 0) of zeros.
ShardTensor slice(const std::string& name, const TensorInfo& info, std::span<const uint8_t> src,
                  int dim, int64_t begin, int64_t end, int64_t pad_to = 0) {
  ShardTensor t{name, info.dtype, info.shape, {}};
  const unsigned bits = dtype_bits(info.dtype);
  uint64_t outer = 1, inner = 1;
  for (int d = 0; d < dim; ++d)
    outer *= info.shape[static_cast<size_t>(d)];
  for (size_t d = static_cast<size_t>(dim) + 1; d < info.shape.size(); ++d)
    inner *= info.shape[d];
  const uint64_t extent = info.shape[static_cast<size_t>(dim)];
  if (begin < 0 || end < begin || static_cast<uint64_t>(end) > extent)
    throw Error(name, "shard [" + std::to_string(begin) + ", " + std::to_string(end) +
                          ") outside dimension " + std::to_string(dim) + " of extent " +
                          std::to_string(extent));
  const uint64_t row = whole_bytes(extent * inner, bits, name, "elements");
  const uint64_t first = whole_bytes(static_cast<uint64_t>(begin) * inner, bits, name, "elements");
  const uint64_t len =
      whole_bytes(static_cast<uint64_t>(end - begin) * inner, bits, name, "elements");
  t.shape[static_cast<size_t>(dim)] = static_cast<uint64_t>(std::max(end - begin, pad_to));
  t.bytes.assign(
      outer * whole_bytes(t.shape[static_cast<size_t>(dim)] * inner, bits, name, "elements"), 0);
  const uint64_t out_row = t.bytes.size() / std::max<uint64_t>(outer, 1);
  for (uint64_t o = 0; o < outer; ++o)
    std::memcpy(t.bytes.data() + o * out_row, src.data() + o * row + first, len);
  return t;
}

ShardTensor whole(const std::string& name, const TensorInfo& info, std::span<const uint8_t> src) {
  return {name, info.dtype, info.shape, std::vector<uint8_t>(src.begin(), src.end())};
}

// The plan entry that owns `name`: the longest prefix of it the plan has (nullptr for none).
const PlanEntry* owner(const QuantPlan& plan, const std::string& name, std::string* rel) {
  for (size_t dot = name.rfind('.'); dot != std::string::npos && dot > 0;
       dot = name.rfind('.', dot - 1)) {
    if (const PlanEntry* e = plan.find(std::string_view(name).substr(0, dot))) {
      *rel = name.substr(dot + 1);
      return e;
    }
  }
  return nullptr;
}

ShardTensor shard_one(const Checkpoint& full, const ModelConfig& cfg, const QuantPlan& plan,
                      const std::string& name, const TensorRef& ref, int rank, int tp) {
  const TensorInfo& info = *ref.info;
  const auto src = ref.bytes();
  std::string rel;
  const PlanEntry* e = owner(plan, name, &rel);
  if (e && !e->sparsity.empty())
    throw Error(name, "a " + e->sparsity + " weight (" + e->prefix +
                          ") has no tensor-parallel rule: its bitmask rows are not sliced; run "
                          "it at tp 1");
  if (e && (e->format == "gptq" || e->format == "gptq_v2" || e->format == "awq"))
    throw Error(name, "a " + e->format + " linear (" + e->prefix +
                          ") has no tensor-parallel rule: its tensors are [K.., N] and [G, N], "
                          "not sliced here; run it at tp 1");
  const bool plain = ends_with(name, "norm.weight") || ends_with(name, "embed_tokens.weight") ||
                     ends_with(name, "lm_head.weight") || ends_with(name, "mlp.gate.weight");
  if (!e || e->role == ModuleRole::kNorm || (plain && !(e->quantized() && rel != "weight"))) {
    if (e && e->quantized() && e->role == ModuleRole::kLinear)
      throw Error(name, "a quantized " + e->prefix + " has no tensor-parallel rule");
    const TensorShard s = tensor_shard(cfg, name, info.shape, rank, tp);
    if (s.kind == ShardKind::kReplicated) return whole(name, info, src);
    return slice(name, info, src, s.dim, s.begin, s.end,
                 s.kind == ShardKind::kVocab ? s.padded : 0);
  }
  if (e->role == ModuleRole::kLinear && !e->quantized()) {
    if (rel != "weight")
      throw Error(name, "an unquantized linear stores '" + rel +
                            "' beside its weight: no tensor-parallel rule (biases are not on the "
                            "GPU engine)");
    const TensorShard s = tensor_shard(cfg, name, info.shape, rank, tp);
    if (s.kind == ShardKind::kReplicated) return whole(name, info, src);
    return slice(name, info, src, s.dim, s.begin, s.end);
  }
  // A quantized linear's tensors, a KV cache's parameters.
  std::string linear = e->prefix, tensor = rel;
  const PlanEntry* scheme_entry = e;
  if (rel.rfind("kv_cache_", 0) == 0) {  // msModelSlim C8 on k_proj / v_proj: the attention's
    const size_t dot = e->prefix.rfind('.');
    linear = e->prefix.substr(0, dot);
    tensor = e->prefix.substr(dot + 1) + "." + rel;
    scheme_entry = &plan.method_for(linear);
  }
  if (!scheme_entry->scheme) throw Error(name, "no scheme in the plan for " + scheme_entry->prefix);
  if (full.contains(e->prefix + ".weight_g_idx"))
    throw Error(name, "act-order (weight_g_idx) checkpoints are not sharded by the engine yet");
  const int64_t n = e->out_features, k = e->in_features;
  if (rel == "weight_shape" && e->role == ModuleRole::kLinear) {
    // The shard's own [N, K], in the stored integer type.
    const TensorShard w = tensor_shard(
        cfg, e->prefix + ".weight", {static_cast<uint64_t>(n), static_cast<uint64_t>(k)}, rank, tp);
    const int64_t nl = w.kind == ShardKind::kColumn ? w.end - w.begin : n;
    const int64_t kl = w.kind == ShardKind::kRow ? w.end - w.begin : k;
    if (info.numel() != 2 || (info.dtype != DType::kI64 && info.dtype != DType::kI32))
      throw Error(name, "weight_shape must hold two I64 / I32 values");
    ShardTensor t{name, info.dtype, info.shape, {}};
    if (info.dtype == DType::kI64) {
      const int64_t v[2] = {nl, kl};
      t.bytes.assign(reinterpret_cast<const uint8_t*>(v), reinterpret_cast<const uint8_t*>(v) + 16);
    } else {
      const int32_t v[2] = {static_cast<int32_t>(nl), static_cast<int32_t>(kl)};
      t.bytes.assign(reinterpret_cast<const uint8_t*>(v), reinterpret_cast<const uint8_t*>(v) + 8);
    }
    return t;
  }
  const QuantTensorShard q =
      quant_tensor_shard(cfg, *scheme_entry->scheme, linear, tensor, info.shape, n, k, rank, tp);
  switch (q.kind) {
    case QuantShardKind::kWhole:
      return whole(name, info, src);
    case QuantShardKind::kZeros:
      return {name, info.dtype, info.shape, std::vector<uint8_t>(src.size(), 0)};
    case QuantShardKind::kSlice:
      return slice(name, info, src, q.dim, q.begin, q.end);
  }
  return whole(name, info, src);
}

}  // namespace

Checkpoint shard_checkpoint(const Checkpoint& full, const ModelConfig& cfg, const QuantPlan& plan,
                            int rank, int tp) {
  const std::filesystem::path root =
      full.root() / ("tp" + std::to_string(rank) + "of" + std::to_string(tp));
  // Images of about 1 GiB each: a slice is held twice only until its image is serialized.
  constexpr uint64_t kImageBytes = uint64_t{1} << 30;
  std::vector<SafetensorsFile> files;
  std::vector<ShardTensor> pending;
  uint64_t pending_bytes = 0;
  const auto flush = [&] {
    if (pending.empty()) return;
    std::vector<TensorToWrite> w;
    for (const ShardTensor& t : pending)
      w.push_back({t.name, t.dtype, t.shape, std::span<const uint8_t>(t.bytes)});
    std::vector<uint8_t> image = serialize_safetensors(std::move(w), std::nullopt);
    pending.clear();
    pending_bytes = 0;
    files.push_back(SafetensorsFile::from_image(
        std::move(image), root / ("shard-" + std::to_string(files.size()) + ".safetensors")));
  };
  for (const auto& [name, ref] : full.tensors()) {
    pending.push_back(shard_one(full, cfg, plan, name, ref, rank, tp));
    pending_bytes += pending.back().bytes.size();
    if (pending_bytes >= kImageBytes) flush();
  }
  flush();
  return Checkpoint::from_files(root, std::move(files));
}

}  // namespace qparity
