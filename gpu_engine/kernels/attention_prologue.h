#pragma once
// What runs between the qkv projection and attention, in one launch instead of four: for every
// token of a fused qkv row [q heads | k heads | v heads],
//   1. Qwen3's per-head RMSNorm of q and k (q_norm / k_norm weights; skipped when null), the
//      rms_norm.h semantics: out = bf16(w * (x * rsqrt(mean(x^2) + eps))), fp32;
//   2. RoPE of q and k (Hugging Face rotate-half, the NeoX layout), in place:
//        angle = double(pos) * inv_freq[i], c = cos(angle) * scaling, s = sin(angle) * scaling
//        out[j] = bf16(x[j] * c + rotate_half(x)[j] * s),  rotate_half(x) = cat(-x[d/2:], x[:d/2])
//      fp64 with one rounding, the reference's emulate rule. Angles are fp64 on purpose: in fp32
//      (as HF computes pos * inv_freq) the angle at position 10^5 is off by ~6e-3 rad, an error
//      larger than bf16's. inv_freq comes from reference_cpu's Rope (llama3 scaling included);
//      scaling is HF's attention_scaling (1 for default / linear / llama3);
//   3. K (rotated) and V into the paged cache at the token's position (paged_attention.h's
//      layout), quantized on write in the cache's format (kv_quant.h).
// Each stored value is the same function of its inputs as the separate kernels compute, up to
// the fp32 summation order of the norm. normed_out, when given, receives q and k after the norm
// and before RoPE (the attn.q_norm / attn.k_norm capture points).
#include <cuda_bf16.h>
#include <cuda_runtime_api.h>

#include <cstdint>

#include "gpu_engine/kernels/kv_quant.h"

namespace qparity::gpu {

struct AttentionPrologueParams {
  __nv_bfloat16* qkv = nullptr;  // token t's row at qkv + t * row_stride
  int64_t row_stride = 0;
  const __nv_bfloat16* q_norm = nullptr;  // [head_dim]; q_norm and k_norm both or neither
  const __nv_bfloat16* k_norm = nullptr;
  float eps = 1e-6f;
  // Zero-centred q/k norms (Qwen3.5: x̂ * (1 + w)): 1, added to the weight in fp32.
  float norm_offset = 0.f;
  __nv_bfloat16* normed_out = nullptr;  // optional [tokens, (num_heads + num_kv_heads) * head_dim]
  const int32_t* positions = nullptr;   // [tokens]: the cache slot (and causality)
  // Rotary positions, when they are not the sequence positions (Qwen3-VL's image prompts):
  // mrope [3, tokens] (time, height, width rows) with mrope_rows [head_dim / 2] the row each
  // frequency reads (reference_cpu/layers/mrope.h); else rope_positions [tokens] (a decode after
  // an image prompt: position + mrope_position_delta); else the positions.
  const int32_t* mrope = nullptr;
  const int32_t* mrope_rows = nullptr;
  const int32_t* rope_positions = nullptr;
  const double* inv_freq = nullptr;     // [head_dim / 2]
  double rope_scaling = 1.0;
  void* k_cache = nullptr;  // elements of kv.format
  void* v_cache = nullptr;
  KvQuant kv = {};
  const int32_t* block_table = nullptr;
  const int32_t* seq = nullptr;  // [tokens]
  int64_t tokens = 0, num_heads = 0, num_kv_heads = 0, head_dim = 0;
  int64_t block_size = 0, max_blocks_per_seq = 0;
  // The q/k norm's divisor: the head's own length when head_dim is zero-padded for the kernels
  // (shape_padding.h); 0 means head_dim. Padding adds zeros to the sum of squares, exactly.
  int64_t norm_dim = 0;
};

// head_dim even and at most 256.
void launch_attention_prologue(const AttentionPrologueParams& p, cudaStream_t stream);

}  // namespace qparity::gpu
