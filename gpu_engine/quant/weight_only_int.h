#pragma once
// The weight-only integer family on the GPU: msModelSlim W8A16 (`w8a16-ch`, `w8a16-g<N>`, with
// offsets; schemes/int/w8a16.h) and compressed-tensors pack-quantized INT4 / INT8
// (`w4a16-g32`, symmetric or asymmetric; schemes/int/pack_quantized_int.h). Both are
// w = (q - zero) * scale per group along K with bf16 activations, so one kernel family
// (kernels/weight_only_gemm.h) serves them.
//
// Built from the processed reference method's ProcessedIntWeight (codes in column order, zeros in
// code units, fp64 scales that are the checkpoint's own F32 / BF16 values) and repacked once
// (quant/int_weight_upload.h). Act order (actorder=group, GPTQ desc_act): the codes are in the
// stable g_idx sort's column order, so each apply first gathers x[:, perm[j]] into the workspace
// (kernels/column_gather.h, bf16 bit for bit) and runs the same kernel on it, as vLLM's Marlin
// does with its sorted g_idx; the products are the reference's, the fp32 sums run in the
// permuted order. The GPU cannot run bit widths other than 4 and 8, K or group not a multiple
// of 16 (int8) / 32 (int4): each is an Error naming the layer.
//
// A dense layer runs on the tensor cores (kernels/weight_only_mma.h, the codes repacked into its
// tiles at load: quant/weight_only_mma_layout.h) when that kernel takes the weight: zero points
// integers in [-8, 7] (int4) or [-128, 127] (int8), which every compressed-tensors point has.
// msModelSlim's non-integral F32 offsets and every expert of a stack (the grouped launch reads
// the row-major layout) keep the CUDA-core kernel.
#include <memory>

#include "gpu_engine/device_buffer.h"
#include "gpu_engine/kernels/weight_only_gemm.h"
#include "gpu_engine/quant/gpu_linear_method.h"
#include "gpu_engine/quant/int_weight_upload.h"
#include "gpu_engine/quant/weight_only_mma_layout.h"
#include "schemes/method/linear_method.h"

namespace qparity::gpu {

class WeightOnlyIntMethod final : public GpuLinearMethod {
 public:
  // expert: -1 a dense layer, e >= 0 expert e of a stack (upload_util.h).
  WeightOnlyIntMethod(const reference::LinearMethod& host, const GpuMethodOptions& options,
                      int64_t expert = -1);
  // Benches only (random_model.h): a layer of arbitrary int4 / int8 codes and one bf16 scale
  // value for every group, symmetric, made on the device: real sizes without a checkpoint.
  // tensor_cores: in the tensor-core layout, as a dense layer of a checkpoint loads (random bytes
  // there are random codes too); otherwise row-major, as an expert of a stack.
  struct Random {
    int bits = 4;
    int64_t group = 32;
    float scale = 0.005f;
    uint64_t seed = 1;
    bool tensor_cores = false;
  };
  WeightOnlyIntMethod(std::string prefix, SchemeId scheme, int64_t out_features,
                      int64_t in_features, const Random& r);
  void apply(const __nv_bfloat16* x, __nv_bfloat16* y, int64_t t, cudaStream_t stream,
             void* workspace) const override;
  size_t workspace_bytes(int64_t max_tokens) const override;
  size_t device_bytes() const override;
  int bits() const { return dev_.bits; }
  int64_t group() const { return dev_.group; }
  bool scale_bf16() const { return dev_.scale_bf16; }
  bool faulty() const { return fault_; }
  // Act order: the inputs are gathered before the GEMM (no grouped launch takes that yet).
  bool permuted() const { return dev_.perm.size() > 0; }
  // Whether the layer runs on the tensor-core kernel (dense layers whose zeros it takes).
  bool tensor_cores() const { return mma_.on(); }
  // The layer's device pointers, for a grouped launch of a stack's experts (grouped_experts.h);
  // an Error for a layer in the tensor-core layout.
  WeightOnlyExpert device_view() const;

 private:
  bool fault_ = false;
  IntWeightOnDevice dev_;  // with mma_ on: bits, group, scale kind, bias and perm only
  MmaWeightOnDevice mma_;
};

}  // namespace qparity::gpu
