#pragma once
// Device side of kv_quant.h: one element's store and read per cache format, and a lane's slice
// of a cached head row (kN consecutive elements) as the attention kernels load it - raw codes
// first, so a step's loads all go out before any is used, then dequantized into a PackedRow.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_fp8.h>

#include <cstdint>
#include <type_traits>

#include "gpu_engine/kernels/attention_parts.cuh"
#include "gpu_engine/kernels/kv_quant.h"

namespace qparity::gpu {

// The launchers' dispatch to a kernel instantiated per cache format:
// f(std::integral_constant<KvCacheFormat, F>{}).
template <typename Fn>
void with_kv_format(KvCacheFormat format, Fn&& f) {
  switch (format) {
    case KvCacheFormat::kBf16:
      f(std::integral_constant<KvCacheFormat, KvCacheFormat::kBf16>{});
      break;
    case KvCacheFormat::kInt8:
      f(std::integral_constant<KvCacheFormat, KvCacheFormat::kInt8>{});
      break;
    case KvCacheFormat::kFp8E4m3:
      f(std::integral_constant<KvCacheFormat, KvCacheFormat::kFp8E4m3>{});
      break;
  }
}

// C8: fp32(fp32(x * r) + o), clamped, rounded half to even - three separately rounded steps, no
// FMA contraction (the __f*_rn intrinsics are never fused).
__device__ __forceinline__ int8_t kv_int8_encode(float x, float rcp, float offset) {
  const float y = fminf(fmaxf(__fadd_rn(__fmul_rn(x, rcp), offset), -128.f), 127.f);
  return static_cast<int8_t>(__float2int_rn(y));
}
__device__ __forceinline__ float kv_int8_decode(int8_t c, float scale, float offset) {
  return __fmul_rn(__fsub_rn(static_cast<float>(c), offset), scale);  // c - o is exact
}
__device__ __forceinline__ uint8_t kv_fp8_encode(float x, float scale, bool bf16_quotient) {
  const float y = __fdiv_rn(x, scale);
  if (bf16_quotient)  // SGLang: x.div_(s) in bf16, then .to(float8_e4m3fn), no clamp
    return __nv_cvt_float_to_fp8(__bfloat162float(__float2bfloat16_rn(y)), __NV_NOSAT, __NV_E4M3);
  return __nv_cvt_float_to_fp8(y, __NV_SATFINITE, __NV_E4M3);
}
__device__ __forceinline__ float kv_fp8_decode(uint8_t c, float scale) {
  return __fmul_rn(__half2float(__half(__nv_cvt_fp8_to_halfraw(c, __NV_E4M3))), scale);  // exact
}

// The fp8 scale of K (which = 0) or V (1) at channel ch: its head's, or the tensor's.
__device__ __forceinline__ float kv_fp8_scale(const KvQuant& q, int which, int64_t ch) {
  if (q.fp8_heads) return __ldg(q.fp8_heads + which * q.fp8_num_heads + ch / q.fp8_head_dim);
  return which ? q.v_scale : q.k_scale;
}

// One element x of K (which = 0) or V (1) at channel ch: written at element `at` of `cache`;
// returns what a read of it gives (bf16).
__device__ __forceinline__ __nv_bfloat16 kv_store(const KvQuant& q, void* cache, int64_t at,
                                                  int which, int64_t ch, __nv_bfloat16 x) {
  switch (q.format) {
    case KvCacheFormat::kInt8: {
      const float* row = q.channels + (which ? kVScale : kKScale) * q.num_channels + ch;
      const float s = row[0], r = row[q.num_channels], o = row[2 * q.num_channels];
      const int8_t c = kv_int8_encode(__bfloat162float(x), r, o);
      static_cast<int8_t*>(cache)[at] = c;
      return __float2bfloat16_rn(kv_int8_decode(c, s, o));
    }
    case KvCacheFormat::kFp8E4m3: {
      const float s = kv_fp8_scale(q, which, ch);
      const uint8_t c = kv_fp8_encode(__bfloat162float(x), s, q.fp8_bf16_quotient);
      static_cast<uint8_t*>(cache)[at] = c;
      return __float2bfloat16_rn(kv_fp8_decode(c, s));
    }
    default:
      static_cast<__nv_bfloat16*>(cache)[at] = x;
      return x;
  }
}

// What a read of element `at` gives (bf16), any format.
__device__ __forceinline__ __nv_bfloat16 kv_load(const KvQuant& q, const void* cache, int64_t at,
                                                 int which, int64_t ch) {
  switch (q.format) {
    case KvCacheFormat::kInt8: {
      const float* row = q.channels + (which ? kVScale : kKScale) * q.num_channels + ch;
      return __float2bfloat16_rn(
          kv_int8_decode(static_cast<const int8_t*>(cache)[at], row[0], row[2 * q.num_channels]));
    }
    case KvCacheFormat::kFp8E4m3:
      return __float2bfloat16_rn(
          kv_fp8_decode(static_cast<const uint8_t*>(cache)[at], kv_fp8_scale(q, which, ch)));
    default:
      return static_cast<const __nv_bfloat16*>(cache)[at];
  }
}

// A lane's kN raw cache elements of one head row. bf16: the PackedRow itself.
template <KvCacheFormat F, int kN>
struct KvCodes {
  uint32_t w[(kN + 3) / 4];  // one byte per element
  __device__ __forceinline__ void load(const void* cache, int64_t at) {
    const uint8_t* src = static_cast<const uint8_t*>(cache) + at;
    if constexpr (kN % 8 == 0) {  // at is a multiple of kN: aligned vector loads
#pragma unroll
      for (int i = 0; i < kN / 8; ++i) {
        const uint2 v = reinterpret_cast<const uint2*>(src)[i];
        w[2 * i] = v.x, w[2 * i + 1] = v.y;
      }
    } else if constexpr (kN % 4 == 0) {
#pragma unroll
      for (int i = 0; i < kN / 4; ++i)
        w[i] = reinterpret_cast<const uint32_t*>(src)[i];
    } else {
#pragma unroll
      for (int i = 0; i < (kN + 3) / 4; ++i)
        w[i] = 0u;
#pragma unroll
      for (int j = 0; j < kN; ++j)
        w[j / 4] |= static_cast<uint32_t>(src[j]) << (8 * (j % 4));
    }
  }
  __device__ __forceinline__ void zero() {
#pragma unroll
    for (int i = 0; i < (kN + 3) / 4; ++i)
      w[i] = 0u;
  }
  __device__ __forceinline__ uint8_t at(int j) const {
    return static_cast<uint8_t>(w[j / 4] >> (8 * (j % 4)));
  }
};
template <int kN>
struct KvCodes<KvCacheFormat::kBf16, kN> : PackedRow<kN> {
  __device__ __forceinline__ void load(const void* cache, int64_t at) {
    PackedRow<kN>::load(static_cast<const __nv_bfloat16*>(cache) + at);
  }
};

// A lane's read parameters for its kN channels of K or V: int8 reads each channel's scale and
// offset through the read-only cache where it is used (a few hundred bytes a layer, L1-resident;
// holding them in registers made the attention kernels spill); fp8 holds the tensor scale.
template <KvCacheFormat F, int kN>
struct KvLaneScales {
  __device__ __forceinline__ void load(const KvQuant&, int, int64_t) {}
};
template <int kN>
struct KvLaneScales<KvCacheFormat::kInt8, kN> {
  const float* row;  // the lane's first channel's scale; its offset 2 * n further
  int64_t n;
  bool round;  // KvQuant::read_bf16
  __device__ __forceinline__ void load(const KvQuant& q, int which, int64_t ch0) {
    row = q.channels + (which ? kVScale : kKScale) * q.num_channels + ch0;
    n = q.num_channels;
    round = q.read_bf16;
  }
};
template <int kN>
struct KvLaneScales<KvCacheFormat::kFp8E4m3, kN> {
  float s;
  bool round;
  __device__ __forceinline__ void load(const KvQuant& q, int which, int64_t ch0) {
    s = kv_fp8_scale(q, which, ch0);  // a lane's elements are in one head
    round = q.read_bf16;
  }
};

// Element j of a lane's raw codes as a read gives it: fp32, or rounded to bf16 where the
// format's read is (KvQuant::read_bf16).
template <KvCacheFormat F, int kN>
__device__ __forceinline__ float kv_value(const KvCodes<F, kN>& c, const KvLaneScales<F, kN>& sc,
                                          int j) {
  if constexpr (F == KvCacheFormat::kBf16) {
    return c.at(j);
  } else if constexpr (F == KvCacheFormat::kInt8) {
    const float v = kv_int8_decode(static_cast<int8_t>(c.at(j)), __ldg(sc.row + j),
                                   __ldg(sc.row + 2 * sc.n + j));
    return sc.round ? __bfloat162float(__float2bfloat16_rn(v)) : v;
  } else {
    const float v = kv_fp8_decode(c.at(j), sc.s);
    return sc.round ? __bfloat162float(__float2bfloat16_rn(v)) : v;
  }
}

// A cache whose read is fp32 (int8 C8; fp8 under SGLang's rule: KvQuant::read_bf16 false) is
// attended with its scales factored out of the inner loops:
//   q . ((c - o) * s) = (q * s) . c - (q * s) . o      sum_u e_u (c_u - o) s = s (sum_u e_u c_u - o
//   l)
// (l = sum_u e_u, rescaled online with the accumulator; fp8: o = 0, s per tensor), so the loops
// multiply raw code values, about as cheaply as bf16 ones, and load no scale per key (reading
// each element dequantized ran at 0.7x the bf16 cache's speed, bound by those loads). fp32
// throughout: the fp32 read's quantities re-associated, each product's rounding moved at the
// 2^-24 level, beside the sums' own fp32 error. A bf16 read (vLLM's fp8) rounds each element
// and is read element by element (kv_value).
template <KvCacheFormat F>
__host__ __device__ __forceinline__ bool kv_factored(const KvQuant& q) {
  return F == KvCacheFormat::kInt8 || (F == KvCacheFormat::kFp8E4m3 && !q.read_bf16);
}
template <KvCacheFormat F, int kN>
__device__ __forceinline__ float kv_raw(const KvCodes<F, kN>& c, int j) {
  if constexpr (F == KvCacheFormat::kInt8)
    return static_cast<float>(static_cast<int8_t>(c.at(j)));
  else if constexpr (F == KvCacheFormat::kFp8E4m3)
    return __half2float(__half(__nv_cvt_fp8_to_halfraw(c.at(j), __NV_E4M3)));
  else
    return c.at(j);
}
// q (the lane's kN elements of one head, pre-scaled) becomes q * s_k; returns the warp's
// (q * s_k) . o_k, the bias every dot then subtracts (0 for fp8).
template <KvCacheFormat F, int kN>
__device__ __forceinline__ float kv_scale_q(const KvQuant& kq, int64_t ch0, float (&q)[kN]) {
  if constexpr (F == KvCacheFormat::kFp8E4m3) {
#pragma unroll
    const float s = kv_fp8_scale(kq, 0, ch0);
    for (int j = 0; j < kN; ++j)
      q[j] = __fmul_rn(q[j], s);
    return 0.f;
  } else {
    const float* s = kq.channels + kKScale * kq.num_channels + ch0;
    const float* o = kq.channels + kKOffset * kq.num_channels + ch0;
    float bias = 0.f;
#pragma unroll
    for (int j = 0; j < kN; ++j) {
      q[j] = __fmul_rn(q[j], s[j]);
      bias += q[j] * o[j];
    }
#pragma unroll
    for (int off = 16; off > 0; off >>= 1)
      bias += __shfl_xor_sync(0xffffffffu, bias, off);
    return bias;
  }
}
// The accumulator of raw V code values and its weight l -> the accumulator of read values.
template <KvCacheFormat F, int kN>
__device__ __forceinline__ void kv_finish_acc(const KvQuant& kq, int64_t ch0, float l,
                                              float (&acc)[kN]) {
  if constexpr (F == KvCacheFormat::kFp8E4m3) {
    const float s = kv_fp8_scale(kq, 1, ch0);
#pragma unroll
    for (int j = 0; j < kN; ++j)
      acc[j] *= s;
  } else {
    const float* s = kq.channels + kVScale * kq.num_channels + ch0;
    const float* o = kq.channels + kVOffset * kq.num_channels + ch0;
#pragma unroll
    for (int j = 0; j < kN; ++j)
      acc[j] = s[j] * (acc[j] - o[j] * l);
  }
}

// One warp step of the online softmax over a quantized cache's raw codes (attention_parts.cuh):
// factored (kv_scale_q applied to q, k_bias its bias, kv_finish_acc after the last step) or each
// element read as the format reads it.
template <KvCacheFormat F, int kN, int kKeys>
__device__ __forceinline__ void kv_softmax_step(bool factored, const float (&q)[kN],
                                                const KvCodes<F, kN> (&kc)[kKeys],
                                                const KvCodes<F, kN> (&vc)[kKeys],
                                                const KvLaneScales<F, kN>& ksc,
                                                const KvLaneScales<F, kN>& vsc, float k_bias,
                                                int64_t base, int64_t end, float& m, float& l,
                                                float (&acc)[kN]) {
  if (factored) {
    const auto raw = [](const KvCodes<F, kN>& r, int j) { return kv_raw(r, j); };
    online_softmax_step_with(q, kc, vc, base, end, m, l, acc, raw, raw, k_bias);
  } else {
    online_softmax_step_with(
        q, kc, vc, base, end, m, l, acc,
        [&](const KvCodes<F, kN>& r, int j) { return kv_value(r, ksc, j); },
        [&](const KvCodes<F, kN>& r, int j) { return kv_value(r, vsc, j); });
  }
}

// A lane's kN freshly computed values of K or V (channels ch0..ch0+kN-1, bf16 `row`): their codes
// into `codes` (what attention then reads, as for a cached key), written to the cache at element
// `at` when `write`. bf16: the row itself.
template <KvCacheFormat F, int kN>
__device__ __forceinline__ void kv_store_codes(const KvQuant& q, const PackedRow<kN>& row,
                                               KvCodes<F, kN>& codes, void* cache, int64_t at,
                                               int which, int64_t ch0, bool write) {
  if constexpr (F == KvCacheFormat::kBf16) {
    (void)codes;  // bf16 keys stay in `row`
    if (write)
#pragma unroll
      for (int j = 0; j < kN; ++j)
        static_cast<__nv_bfloat16*>(cache)[at + j] = row.bf16_at(j);
  } else {
    KvQuant fixed = q;
    fixed.format = F;  // a compile-time format: kv_store's switch folds away
    uint8_t scratch[kN];
#pragma unroll
    for (int j = 0; j < kN; ++j)
      kv_store(fixed, scratch, j, which, ch0 + j, row.bf16_at(j));
    codes.zero();
#pragma unroll
    for (int j = 0; j < kN; ++j)
      codes.w[j / 4] |= static_cast<uint32_t>(scratch[j]) << (8 * (j % 4));
    if (write)
#pragma unroll
      for (int j = 0; j < kN; ++j)
        static_cast<uint8_t*>(cache)[at + j] = scratch[j];
  }
}

// Eight consecutive cached elements (channels ch0..ch0+7, raw 1-byte codes) -> eight bf16 as a
// read gives them, packed for a 16-byte store (the tensor-core prefill's staging).
template <KvCacheFormat F>
__device__ __forceinline__ uint4 kv_dequantize8(uint2 codes, const KvQuant& q, int which,
                                                int64_t ch0) {
  PackedRow<8> out;
  if constexpr (F == KvCacheFormat::kInt8) {
    const float* row = q.channels + (which ? kVScale : kKScale) * q.num_channels + ch0;
#pragma unroll
    for (int j = 0; j < 8; ++j) {
      const int8_t c = static_cast<int8_t>((j < 4 ? codes.x : codes.y) >> (8 * (j % 4)));
      out.set(j, __float2bfloat16_rn(
                     kv_int8_decode(c, __ldg(row + j), __ldg(row + 2 * q.num_channels + j))));
    }
  } else {
    const float s = kv_fp8_scale(q, which, ch0);
#pragma unroll
    for (int j = 0; j < 8; ++j)
      out.set(j, __float2bfloat16_rn(kv_fp8_decode(
                     static_cast<uint8_t>((j < 4 ? codes.x : codes.y) >> (8 * (j % 4))), s)));
  }
  return make_uint4(out.w[0], out.w[1], out.w[2], out.w[3]);
}

}  // namespace qparity::gpu
