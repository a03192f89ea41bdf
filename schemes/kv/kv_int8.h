#pragma once
// msModelSlim KV-cache C8 (scheme `kv-int8`; FORMATS.md §5.2, §5.8, card C15).
//
// Tensors (relative to the attention prefix "model.layers.0.self_attn"):
//   k_proj.kv_cache_scale   F32 [Hkv·D]   (F16/BF16 accepted)   channel = head·D + d
//   k_proj.kv_cache_offset  F32 [Hkv·D]   integral, in [-128, 127] (zeros when symmetric)
//   v_proj.kv_cache_scale, v_proj.kv_cache_offset  likewise
//
// Precision contract
//   quantize_kv_int8 (producer): per-channel min/max over the calibration rows of keys and
//     values, §5.2 symmetric (/127) or asymmetric ((max/255 - min/255), offset = round(-min/s) -
//     128), FLT_EPSILON floor; dialect msmodelslim (and ct/vllm/sglang) in fp32; ideal in fp64
//     with the scale stored as F32 and the offset computed from the stored scale.
//   store: c_q = clamp(round(c/s + off), -128, 127), half-to-even, saturating.
//     dialect msmodelslim / vllm / sglang / ct: NPU npu_quantize(c, 1/s, off): c·(1/s) + off in
//     fp32 with 1/s rounded to fp32 (FORMATS.md §5.8; NPU rounding mode UNCONFIRMED §7.5);
//     ideal: c/s + off exact in fp64, then rounded.
//   read: (c_q - off)·s in fp64.
//   The stored QuantizedMatrix holds the RAW codes c_q (lattice 1, one scale row [1, Hkv·D]
//   broadcast over all rows: block_rows = T), as the cache holds them; the offset is NOT in the
//   codes, so dequantize(stored) = c_q·s is not the read value: use read() (which subtracts
//   the offset).
//   Load checks: scales finite and > 0, offsets finite, integral and in [-128, 127] (the NPU
//   casts them to int8), each naming the tensor. MindIE's C8 loader reinterprets the fp32 bits
//   of the offset as int32 (§5.8, UNCONFIRMED intent): not emulated; the file value is used.
//
// Dialect table (kv_int8_rules):
//   step          ideal                  msmodelslim / vllm / sglang / ct
//   qparams       fp64, F32 storage      fp32
//   store         c/s + off, fp64        c·(1/s) + off, fp32
//   rounding      half-even              half-even
#include <memory>
#include <string>

#include "schemes/int/msmodelslim_int.h"
#include "schemes/kv/kv_cache_method.h"

namespace qparity::reference {

struct KvInt8Rules {
  MsIntRules producer;
  ScaleUse store_use = ScaleUse::kMultiplyReciprocal;
  Arith store_arith = Arith::kFp32;
  IntRound store_round = IntRound::kHalfEven;
};
KvInt8Rules kv_int8_rules(Dialect d);

struct KvInt8Request {
  Matrix keys;    // calibration rows [T, Hkv·D]
  Matrix values;  // [T, Hkv·D]
  bool symmetric = true;
  Dialect dialect = Dialect::kIdeal;
  std::string where = "kv cache";
};

// k_proj.kv_cache_scale/offset and v_proj.kv_cache_scale/offset, F32 [Hkv·D].
TensorMap quantize_kv_int8(const KvInt8Request& request);

class KvInt8CacheMethod final : public KvCacheMethod {
 public:
  KvInt8CacheMethod(KvShape shape, MethodConfig config);
  std::vector<ParamSpec> create_weights() const override;
  const KvInt8Rules& rules() const { return rules_; }
  // Per-channel scale and offset of keys or values after processing.
  const std::vector<double>& scales(KvWhich w) const;
  const std::vector<double>& offsets(KvWhich w) const;

 protected:
  void process() override;
  QuantizedMatrix do_store(KvWhich which, const Matrix& x) const override;
  Matrix do_read(KvWhich which, const QuantizedMatrix& stored) const override;

 private:
  KvInt8Rules rules_;
  std::vector<double> scale_[2], offset_[2];
};

std::unique_ptr<KvCacheMethod> make_kv_int8_method(KvShape shape, MethodConfig config);

}  // namespace qparity::reference
