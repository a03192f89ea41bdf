#pragma once
// What a layer's paged KV cache holds and how the attention kernels write and read it (the GPU
// side of schemes/kv/kv_cache_method.h). The kernels quantize a key or value once, on
// write (the attention prologue, or decode_attention for its batch's own tokens), and dequantize
// on every read; a key this launch computes is used in its dequantized form, as if read back
// from the cache, so a token attends to what the cache holds - the reference's order.
//
//   kBf16     the element itself.
//   kInt8     msModelSlim C8 (scheme kv-int8): per channel c = kv_head * head_dim + d (the
//             kernels' head_dim) a scale s, its fp32 reciprocal r = fp32(1/s) and an integral
//             offset o. Store: code = clamp(rint_even(fp32(fp32(x * r) + o)), -128, 127), each
//             step one fp32 rounding (no FMA) - the reference's vllm / sglang / msmodelslim rule
//             (kv_int8.h: c * (1/s) + off in fp32, half-even), bit for bit.
//             Read: fp32((code - o) * s) (code - o is exact): within 2^-24 of the reference's
//             fp64 read, and used as fp32 by the CUDA-core attention kernels.
//   kFp8E4m3  one scale per tensor for K and for V (scheme kv-fp8), or per KV head (kv-fp8-head:
//             the same rules with head h's scale on its channels). Store, vLLM
//             (scaled_vec_conversion): e4m3(fp32(x / s)), saturating, RNE; SGLang
//             (set_kv_buffer): the quotient rounded to bf16 first, then a NON-saturating cast:
//             |x/s| in (448, 464] stores 448, beyond 464 NaN (the reference refuses that input
//             with an error; the GPU stores the NaN, which every later point shows).
//             Read: bf16(fp32(fp8 * s)) - vLLM's rule exactly (its attention takes the
//             dequantized cache in the model dtype); SGLang's: the fp32 product.
// Where a read is fp32 (int8, SGLang's fp8: read_bf16 false) the attention operands stay fp32,
// so only the CUDA-core kernels (paged_attention, decode_attention) read such a cache; the
// tensor-core prefill takes bf16 operands and refuses it (the engine then runs the paged kernel).
// The k_cache / v_cache capture points hold the read rounded to bf16, as every dumped point.
#include <cstddef>
#include <cstdint>
#include <string>

namespace qparity::gpu {

enum class KvCacheFormat : uint8_t { kBf16, kInt8, kFp8E4m3 };

std::string to_string(KvCacheFormat f);
// Bytes of one cached element.
size_t kv_element_bytes(KvCacheFormat f);

// One layer's cache format, passed by value to every kernel that writes or reads the cache.
struct KvQuant {
  KvCacheFormat format = KvCacheFormat::kBf16;
  // kInt8: device floats [6, channels]: rows k_scale, k_rcp, k_offset, v_scale, v_rcp, v_offset.
  const float* channels = nullptr;
  int64_t num_channels = 0;  // num_kv_heads * head_dim of the kernels' layout
  // kFp8E4m3: the per-tensor scales (> 0, finite).
  float k_scale = 1.f, v_scale = 1.f;
  // kFp8E4m3 per KV head (kv-fp8-head): device floats [2, fp8_num_heads], K's then V's, used
  // instead of k_scale / v_scale; channel ch is head ch / fp8_head_dim (the kernels' head_dim).
  const float* fp8_heads = nullptr;
  int64_t fp8_num_heads = 0, fp8_head_dim = 0;
  bool fp8_bf16_quotient = false;  // SGLang's store; false: vLLM's
  // Whether a read is rounded to bf16 before attention uses it (vLLM's fp8); else fp32.
  bool read_bf16 = false;
};

// Row r of KvQuant::channels.
enum KvChannelRow : int { kKScale = 0, kKRcp, kKOffset, kVScale, kVRcp, kVOffset, kKvChannelRows };

// The launchers' checks of a KvQuant (a qparity::Error naming `kernel`): int8 needs its
// channels for `num_kv_heads * head_dim` channels, fp8 positive finite scales.
void require_kv_quant(const char* kernel, const KvQuant& q, int64_t num_kv_heads, int64_t head_dim);

}  // namespace qparity::gpu
