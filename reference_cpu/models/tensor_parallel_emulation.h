#pragma once
// The reference at tensor parallelism N: the arithmetic a TP engine does at its row-parallel
// layers, emulated in fp64, so that the reference stays the spec of a TP run. Each o_proj and
// down_proj becomes a RowParallelLinear over the ranks' methods, each loaded by the shared
// loader from that rank's shard of the checkpoint (schemes/parallel/checkpoint_shard.h) and
// processed per rank, as a TP engine's are:
//   y = R(p_0 + p_1 + ... + p_N-1),  p_r = R(rank r's method on x[:, K_r])
// where R rounds to the stored dtype in emulate mode (exact mode: R is the identity and the sum
// is the TP = 1 product up to fp64 reassociation): each rank's partial stored as the engine
// stores it, their sum rounded once, which is what the engine's reduction computes (its fp32
// sum of bf16 partials is exact short of a 13-binade spread; gpu_engine/kernels/rank_sum.h) and
// vLLM's one-shot custom all-reduce. Each rank's method quantizes its own slice of the input, so
// dynamic per-token activation scales are per rank (vLLM's RowParallelLinear); msModelSlim's
// quant_bias is on rank 0 alone. The row-parallel layers' activation codes are not observed (no
// TP = 1 counterpart; tp_gather.h). MoE layers are refused: their experts' row-parallel combine
// is not emulated yet.
#include <filesystem>

#include "reference_cpu/models/causal_lm.h"

namespace qparity::reference {

// Replaces `model`'s row-parallel linears with their TP = tp emulation; `checkpoint_dir` is the
// checkpoint `model` was loaded from. Throws naming the layer (MoE, a streamed model) or the
// tensor / config key whose partition fails.
void emulate_tensor_parallel(CausalLm& model, const std::filesystem::path& checkpoint_dir,
                             const std::optional<std::string>& override_scheme, int tp);

}  // namespace qparity::reference
