#pragma once
// Stored bits per weight element of a scheme (the index's bits-per-weight axis).
#include "schemes/description/scheme_registry.h"

namespace qparity {

// The code plus its share of the group's scale (bf16 16 bits, fp8 / E8M0 8, fp8-block's fp32 per
// 128 x 128) and zero point; per-channel and per-tensor scales count as 0 (under 0.01 bit for
// K >= 2048). 16 for unquantized weights (bf16, the KV-cache schemes). Defined beside the traits
// (scheme_registry.cpp).
double weight_bits_per_element(const SchemeId& s);

}  // namespace qparity
