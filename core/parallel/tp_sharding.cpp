#include "core/parallel/tp_sharding.h"

#include <algorithm>

#include "core/error.h"

namespace qparity {

namespace {

bool ends_with(const std::string& s, const std::string& suffix) {
  return s.size() >= suffix.size() &&
         s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}

void require(bool ok, const std::string& name, const std::string& what) {
  if (!ok) throw Error(name, what);
}

// Equal split of n along dim; n must divide by tp.
TensorShard even(const std::string& name, ShardKind kind, int dim, int64_t n, int rank, int tp,
                 const char* what) {
  require(
      n % tp == 0, name,
      std::string(what) + " " + std::to_string(n) + " does not divide by tp " + std::to_string(tp));
  const int64_t part = n / tp;
  return {kind, dim, rank * part, (rank + 1) * part, part};
}

}  // namespace

int64_t padded_vocab(int64_t vocab, int tp) {
  const int64_t m = int64_t{64} * tp;
  return (vocab + m - 1) / m * m;
}

ModelConfig tp_rank_config(const ModelConfig& c, int tp) {
  const std::string where = "config.json";
  require(tp >= 1, where, "tp " + std::to_string(tp) + " must be at least 1");
  if (tp == 1) return c;
  require(c.layer_types.empty() && !c.attn_output_gate, where,
          c.arch_name +
              ": Gated DeltaNet / gated-attention layers are not sharded for tensor "
              "parallelism yet");
  const auto divides = [&](int64_t n, const char* key) {
    require(n % tp == 0, where,
            std::string(key) + " " + std::to_string(n) + " does not divide by tp " +
                std::to_string(tp));
    return n / tp;
  };
  ModelConfig r = c;
  r.num_heads = divides(c.num_heads, "num_attention_heads");
  if (c.num_kv_heads >= tp) {
    r.num_kv_heads = divides(c.num_kv_heads, "num_key_value_heads");
  } else {
    require(tp % c.num_kv_heads == 0, where,
            "tp " + std::to_string(tp) + " is not a multiple of num_key_value_heads " +
                std::to_string(c.num_kv_heads) +
                " (KV heads are replicated when tp > their count)");
    r.num_kv_heads = 1;
  }
  if (c.intermediate > 0) r.intermediate = divides(c.intermediate, "intermediate_size");
  if (c.moe_intermediate_size > 0)
    r.moe_intermediate_size = divides(c.moe_intermediate_size, "moe_intermediate_size");
  r.vocab = padded_vocab(c.vocab, tp) / tp;
  return r;
}

TensorShard tensor_shard(const ModelConfig& c, const std::string& name,
                         const std::vector<uint64_t>& shape, int rank, int tp) {
  require(tp >= 1 && rank >= 0 && rank < tp, name,
          "rank " + std::to_string(rank) + " of tp " + std::to_string(tp) + " is out of range");
  require(!shape.empty(), name, "a tensor with no dimensions");
  const int64_t rows = static_cast<int64_t>(shape[0]);
  const int64_t cols = shape.size() > 1 ? static_cast<int64_t>(shape[1]) : 0;
  TensorShard full{ShardKind::kReplicated, 0, 0, rows, rows};
  if (ends_with(name, "norm.weight") || ends_with(name, "norm.bias") ||
      ends_with(name, "mlp.gate.weight"))
    return full;
  if (ends_with(name, "embed_tokens.weight") || ends_with(name, "lm_head.weight")) {
    const int64_t per = padded_vocab(rows, tp) / tp;
    const int64_t b = std::min(rows, rank * per), e = std::min(rows, (rank + 1) * per);
    return {ShardKind::kVocab, 0, b, e, per};
  }
  if (ends_with(name, "q_proj.weight")) {
    require(c.num_heads % tp == 0, name,
            "num_heads " + std::to_string(c.num_heads) + " does not divide by tp " +
                std::to_string(tp));
    return even(name, ShardKind::kColumn, 0, rows, rank, tp, "q_proj rows");
  }
  if (ends_with(name, "k_proj.weight") || ends_with(name, "v_proj.weight")) {
    const int64_t kv = c.num_kv_heads, d = c.head_dim;
    require(rows == kv * d, name, "rows " + std::to_string(rows) + " != num_kv_heads x head_dim");
    if (kv >= tp) {
      require(
          kv % tp == 0, name,
          "num_kv_heads " + std::to_string(kv) + " does not divide by tp " + std::to_string(tp));
      return even(name, ShardKind::kColumn, 0, rows, rank, tp, "k/v rows");
    }
    require(tp % kv == 0, name,
            "tp " + std::to_string(tp) + " is not a multiple of num_kv_heads " +
                std::to_string(kv) + " (KV heads are replicated when tp > num_kv_heads)");
    const int64_t head = rank / (tp / kv);
    return {ShardKind::kColumn, 0, head * d, (head + 1) * d, d};
  }
  if (ends_with(name, "gate_proj.weight") || ends_with(name, "up_proj.weight"))
    return even(name, ShardKind::kColumn, 0, rows, rank, tp, "intermediate rows");
  if (ends_with(name, "o_proj.weight") || ends_with(name, "down_proj.weight")) {
    require(shape.size() == 2, name, "a row-parallel weight must be 2-D");
    return even(name, ShardKind::kRow, 1, cols, rank, tp, "input columns");
  }
  throw Error(name, "no tensor-parallel rule for this tensor");
}

}  // namespace qparity
