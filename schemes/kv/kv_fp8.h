#pragma once
// KV scheme `kv-fp8`: the cache holds e4m3fn codes with one scale per tensor for K and for V
// (compressed-tensors kv_cache_scheme; FORMATS.md §1.1, §2.9, card C17).
//
// Tensors (on the attention module, names relative to it):
//   k_scale, v_scale  [1]  model dtype, or F32/BF16/F16 (scale_dtype)
//   k_proj.output_scale, v_proj.output_scale  [1]  older llm-compressor names, accepted instead
// Exactly one of each pair must be present; scales finite and > 0.
// kv-fp8-head (kv_cache_scheme strategy attn_head): k_scale / v_scale [Hkv, 1, 1] (compressed-
// tensors' initialize_qparams shape; [Hkv] accepted as well), no older names; head h's
// channels h*D .. h*D+D-1 are stored and read with scale h, by the same per-dialect rules.
// (vLLM runs per-head scales on FlashAttention 3, which also quantizes the query to fp8 for
// its fp8 attention; the vllm dialect here reads the cache dequantized, as for per-tensor.)
//
// Store / read per dialect (the value x is a cache row element, s its tensor scale):
//   ideal               q = e4m3(clamp(x/s, +-448)) in fp64 (RNE);   read q*s exact
//   compressed-tensors  x/s in the model dtype, clamp, RNE (QDQ §2.5); read q*s in the model dtype
//   vllm                x/s in fp32 then __nv_cvt_float_to_fp8(SATFINITE, RNE) - a division,
//                       not a reciprocal multiply (csrc/quantization/fp8/nvidia/quant_utils.cuh,
//                       scaled_vec_conversion<uint8_t, *>, vllm-project/vllm @ 03476e5c);
//                       read: fp8 -> fp32 times s in fp32, rounded to the model dtype
//                       (scaled_vec_conversion<__nv_bfloat16, uint8_t>)
//   sglang              cache_k.div_(k_scale) in the model dtype (fp32 quotient rounded to bf16),
//                       then .to(float8_e4m3fn) WITHOUT a clamp (python/sglang/srt/mem_cache/
//                       memory_pool.py, MHATokenToKVPool.set_kv_buffer): torch's cast is
//                       non-saturating, so |x/s| > 464 would be stored as NaN - the reference
//                       reports that as an Error; 448 < |x/s| <= 464 rounds to 448. Read: q*s in
//                       fp32 (attention backends take k_scale as a descale factor).
//   msmodelslim         no fp8 KV of its own here: vLLM's rule.
// quantize_kv_fp8: k_scale = amax_k/448 (v likewise) computed like the producer's weight scale
// (compressed-tensors: in the model dtype; zero -> eps), stored in `scale_dtype`; per head
// with one amax per head.
#include <memory>

#include "schemes/fp8/fp8_common.h"
#include "schemes/kv/kv_cache_method.h"

namespace qparity::reference {

struct KvFp8Rules {
  Dialect dialect = Dialect::kIdeal;
  bool store_in_model_dtype = false;  // compressed-tensors, sglang
  Arith store_arith = Arith::kFp64;   // otherwise
  bool store_saturates = true;        // false: sglang (NaN beyond 464 -> Error)
  bool read_in_model_dtype = false;   // compressed-tensors
  bool read_fp32_then_model = false;  // vllm
  Arith read_arith = Arith::kFp64;
};
KvFp8Rules kv_fp8_rules(Dialect d);

// k_scale / v_scale from calibration amax (FORMATS.md §2.4 rule of the dialect).
TensorMap quantize_kv_fp8(double k_amax, double v_amax, DType scale_dtype, DType model_dtype,
                          Dialect dialect);
// kv-fp8-head: one amax per KV head for K and for V (equal lengths); [Hkv, 1, 1] scales.
TensorMap quantize_kv_fp8_per_head(const std::vector<double>& k_amax,
                                   const std::vector<double>& v_amax, DType scale_dtype,
                                   DType model_dtype, Dialect dialect);

class KvFp8CacheMethod final : public KvCacheMethod {
 public:
  KvFp8CacheMethod(KvShape shape, MethodConfig config);
  std::vector<ParamSpec> create_weights() const override;
  // The per-tensor scale (kv-fp8); for kv-fp8-head an Error naming the layer.
  double scale(KvWhich which) const;
  // The scale of KV head h (every head the same for kv-fp8).
  double head_scale(KvWhich which, int64_t h) const;
  bool per_head() const { return config().scheme.kv_per_head; }
  const KvFp8Rules& rules() const { return rules_; }

 protected:
  void process() override;
  QuantizedMatrix do_store(KvWhich which, const Matrix& x) const override;
  Matrix do_read(KvWhich which, const QuantizedMatrix& stored) const override;

 private:
  KvFp8Rules rules_;
  std::vector<double> k_scale_, v_scale_;  // [1] per tensor, [Hkv] per head
};

std::unique_ptr<KvCacheMethod> make_kv_fp8_method(KvShape shape, MethodConfig config);

}  // namespace qparity::reference
