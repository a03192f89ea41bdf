#pragma once
// What every GPU method's upload (process_weights_after_loading on the device) shares: the
// processed integer weight of a reference method, and exact fp64 -> fp32 narrowing.
#include <string>
#include <vector>

#include "reference_cpu/quant/linear_method.h"

namespace qparity::gpu {

// The method's ProcessedIntWeight (expert 0 of a dense layer); an Error naming the layer for an
// expert stack (not on the GPU yet) or a scheme without an integer weight.
reference::ProcessedIntWeight processed_int_weight_of(const reference::LinearMethod& host);

// fp64 values that are fp32 values, as fp32; an Error naming `where` and the first element that
// would round (the GPU holds scales, zeros and biases exactly or not at all).
std::vector<float> exact_f32(const std::vector<double>& v, const std::string& where);

}  // namespace qparity::gpu
