#pragma once
// What every GPU method's upload (process_weights_after_loading on the device) shares: the
// processed integer weight of a reference method, and exact fp64 -> fp32 narrowing.
#include <cuda_bf16.h>
#include <cuda_runtime_api.h>

#include <string>
#include <vector>

#include "schemes/method/linear_method.h"

namespace qparity::gpu {

// Which weight of `host` a GPU method takes: expert -1 a dense layer's (the host must not be an
// expert stack), expert e >= 0 expert e of a stack. Returns the reference's expert index (0 for a
// dense layer); an Error naming the layer otherwise.
int64_t method_expert(const reference::LinearMethod& host, int64_t expert);
// The GPU method's name: the layer's prefix, "<prefix>.experts.<e>" for expert e of a stack.
std::string method_prefix(const reference::LinearMethod& host, int64_t expert);

// The method's ProcessedIntWeight (method_expert's); an Error naming the layer for a scheme
// without an integer weight.
reference::ProcessedIntWeight processed_int_weight_of(const reference::LinearMethod& host,
                                                      int64_t expert = -1);

// A processed weight of rows x cols must be the layer's [n, k]: an Error naming `where` otherwise.
void require_processed_shape(int64_t rows, int64_t cols, int64_t n, int64_t k,
                             const std::string& where);

// Act order's column permutation (ProcessedIntWeight::perm) as the int32 sources of a column
// gather: empty when the weight is in column order; an Error naming `where` unless it is a
// permutation of [0, k).
std::vector<int32_t> gather_columns_of(const std::vector<int64_t>& perm, int64_t k,
                                       const std::string& where);
// Workspace bytes of t gathered bf16 rows of k columns (256-byte aligned).
size_t gathered_input_bytes(int64_t t, int64_t k);
// dst[r, j] = x[r, perm[j]] for t rows of k columns on `stream`; returns dst (workspace, at least
// gathered_input_bytes(t, k); an Error naming `where` when absent).
const __nv_bfloat16* gather_input(const __nv_bfloat16* x, const int32_t* perm, int64_t t, int64_t k,
                                  void* dst, const std::string& where, cudaStream_t stream);

// fp64 values that are fp32 values, as fp32; an Error naming `where` and the first element that
// would round (the GPU holds scales, zeros and biases exactly or not at all).
std::vector<float> exact_f32(const std::vector<double>& v, const std::string& where);
// Whether every value is exactly a bf16 value (the GPU then holds the scales in bf16).
bool all_bf16_values(const std::vector<double>& v);

}  // namespace qparity::gpu
