#pragma once
// The AutoAWQ GEMM checkpoint layout (quant_method "awq", version "gemm"; docs/GPTQ-AWQ.md has
// the sources) of one linear [N, K] with 4-bit codes, as a reader and a writer onto the IntWeight
// of the pack-quantized method:
//   qweight  I32 [K, N/8]   word (k, c) holds the unsigned codes u[k, 8c .. 8c+7]: nibble i
//                           (bits 4i..4i+3) is column 8c + AWQ_ORDER[i], AWQ_ORDER =
//                           [0, 2, 4, 6, 1, 3, 5, 7] (WQLinear_GEMM.from_linear; vLLM undoes it
//                           with AWQ_REVERSE_ORDER)
//   qzeros   I32 [G, N/8]   the zero points z in [0, 15], packed the same way (no offset)
//   scales   F16 [G, N]     (BF16 / F32 accepted)
//   bias     optional [N]
// w[n, k] = (u[k, n] - z[k / group_size, n]) * scales[k / group_size, n]; no act order.
// In IntWeight terms q = u - 8 and zero = z - 8.
#include <functional>
#include <string>
#include <vector>

#include "schemes/int/pack_quantized_int.h"

namespace qparity::reference {

inline constexpr int kAwqOrder[8] = {0, 2, 4, 6, 1, 3, 5, 7};

std::vector<ParamSpec> awq_specs(const QuantArgs& a, int64_t n, int64_t k,
                                 std::vector<DType> scale_dtypes);

IntWeight decode_awq(const std::function<const HostTensor*(const std::string&)>& get,
                     const std::function<std::string(const std::string&)>& where,
                     const QuantArgs& a, int64_t n, int64_t k);

// The tensors of `w` (4-bit, asymmetric, groups in column order) in the GEMM layout.
TensorMap encode_awq(const IntWeight& w, int bits, DType scale_dtype, const std::string& where);

// AutoAWQ's pseudo_quantize_tensor with zero_point true (the only kind its GEMM packing takes):
// per row and group of K, max = amax, min = amin (not clamped to 0, unlike GPTQ);
// scale = max(max - min, 1e-5) / 15; z = clamp(-round(min / scale), 0, 15);
// u = clamp(round(x / s) + z, 0, 15) with s the scale as stored in `scale_dtype` (from_linear
// recomputes the codes from the stored fp16 scales). AWQ's activation-aware scale search is out
// of scope: these are plain round-to-nearest codes in AWQ's layout. `exact`: fp64 and exact
// rounding decisions (the ideal dialect); otherwise in fp16 from the weight rounded to fp16, as
// AutoAWQ runs it (_apply_quant calls .half() on the layer first).
IntWeight quantize_awq_rtn(const Matrix& weight, int bits, int64_t group_size, bool symmetric,
                           DType scale_dtype, bool exact, const std::string& where);

}  // namespace qparity::reference
