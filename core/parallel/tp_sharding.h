#pragma once
// Tensor-parallel sharding rules for Llama / Qwen3 / Qwen3-MoE checkpoints: which slice of each
// HF tensor rank r of tp holds, the Megatron / vLLM way.
//   column  q/k/v_proj, gate/up_proj (dense and experts): output rows split; q by heads, k/v by
//           KV heads, replicated when tp > num_kv_heads (rank r holds KV head r / (tp / kv));
//   row     o_proj, down_proj (dense and experts): input columns split; the outputs are partial
//           sums that an all-reduce completes;
//   vocab   embed_tokens, lm_head: vocabulary rows split after padding the vocabulary to a
//           multiple of 64 * tp (vLLM's VocabParallelEmbedding); a rank's last rows may be
//           padding beyond the checkpoint's vocabulary;
//   replicated  norms (incl. q_norm / k_norm), the MoE router.
// Errors name the tensor and the divisibility that fails.
#include <cstdint>
#include <string>
#include <vector>

#include "core/config/model_config.h"

namespace qparity {

enum class ShardKind { kReplicated, kColumn, kRow, kVocab };

struct TensorShard {
  ShardKind kind = ShardKind::kReplicated;
  int dim = 0;        // the dimension split (0 rows, 1 columns); unused when replicated
  int64_t begin = 0;  // [begin, end) along dim, within the checkpoint tensor
  int64_t end = 0;
  int64_t padded = 0;  // vocab: rows this rank allocates (end - begin plus padding)
};

// The shard of HF tensor `name` (shape as in the checkpoint) held by `rank` of `tp`.
TensorShard tensor_shard(const ModelConfig& cfg, const std::string& name,
                         const std::vector<uint64_t>& shape, int rank, int tp);

// Padded vocabulary size for tp ranks (a multiple of 64 * tp).
int64_t padded_vocab(int64_t vocab, int tp);

// The shapes one rank of tp computes, as a config: num_heads / tp q heads, num_kv_heads / tp KV
// heads (1 when replicated), intermediate_size and moe_intermediate_size / tp, padded_vocab / tp
// vocabulary rows; everything else (hidden, head_dim, experts, RoPE, eps) as cfg. tp = 1 gives
// cfg. Throws naming the config key whose size does not divide (the rules above).
ModelConfig tp_rank_config(const ModelConfig& cfg, int tp);

}  // namespace qparity
