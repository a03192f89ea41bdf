#pragma once
// What every GPU method's upload (process_weights_after_loading on the device) shares: the
// processed integer weight of a reference method, and exact fp64 -> fp32 narrowing.
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

// fp64 values that are fp32 values, as fp32; an Error naming `where` and the first element that
// would round (the GPU holds scales, zeros and biases exactly or not at all).
std::vector<float> exact_f32(const std::vector<double>& v, const std::string& where);

}  // namespace qparity::gpu
