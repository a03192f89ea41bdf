#pragma once
// compressed-tensors' sparse weight storage (sparsity_config formats sparse-24-bitmask and
// sparse-bitmask, compressed-tensors <= 0.12 compressors/sparse_compressors): a `weight` tensor
// [N, K] of any dtype stored as its kept elements plus a bitmask, decompressed here exactly
// (bytes are moved, never converted) so that the scheme's method loads the dense tensor it
// would have found uncompressed.
//
//   sparse-24-bitmask: <m>.compressed [N, K/2] (the weight's dtype: the 2 kept elements of each
//     group of 4 along K, in row-major order), <m>.bitmask U8 [N, ceil(K/8)] (numpy packbits,
//     bitorder little: bit j%8 of byte j/8 marks column j), <m>.shape I64 [2, 1] = (N, K).
//     Every group of 4 has exactly 2 bits set (the compressor's topk(2)).
//   sparse-bitmask: <m>.compressed [nnz] (the elements != 0, row-major), <m>.bitmask as above,
//     <m>.shape I64 [2], <m>.row_offsets I64 [N] (the index of each row's first element).
#include <map>
#include <string>
#include <string_view>
#include <vector>

#include "schemes/method/host_tensor.h"

namespace qparity::reference {

// The tensor names (relative to the module) a sparse format stores in place of "weight".
const std::vector<std::string>& sparse_weight_parts(std::string_view format);

// The dense `weight` of one module from its parts (keyed by the names above). Every rule of the
// format is checked (dtypes, shapes, the shape tensor's values, popcounts, row offsets): an
// Error naming `where` + "." + the tensor and the rule.
HostTensor decompress_sparse_weight(std::string_view format,
                                    const std::map<std::string, TensorView>& parts,
                                    const std::string& where);

// What the compressor writes for a dense [N, K] tensor (quantize's writer). sparse-24-bitmask:
// the kept elements of each group of 4 are its nonzero ones (a zero is an all-zero bit pattern
// or an fp8 / float negative zero), filled up to 2 with the group's first zeros; a group with
// more than 2 nonzero elements is an Error (prune first). sparse-bitmask: the nonzero elements.
TensorMap compress_sparse_weight(std::string_view format, const TensorView& dense,
                                 const std::string& where);

}  // namespace qparity::reference
