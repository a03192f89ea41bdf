#pragma once
// Checkpoint bytes -> fp64, element range by element range, so that the reference can convert
// weights tile by tile from the mmap instead of holding an fp64 copy of the model.
// Precision: every float dtype here decodes exactly (fp64 holds all of them); I64/U64 values
// beyond 2^53 are not exactly representable and are rejected rather than rounded.
#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "core/dtype.h"

namespace qparity::reference {

// Decodes elements [first, first + out.size()) of a tensor of `dtype` stored in `bytes`.
// F4 elements are nibbles (low nibble = even element). Throws naming `where` for dtypes with no
// numeric meaning here (BOOL is 0/1, F6 and C64 are rejected) and for out-of-range spans.
void decode_to_double(DType dtype, std::span<const uint8_t> bytes, uint64_t first,
                      std::span<double> out, const std::string& where);

// Throws naming `where` and the first element that is NaN or Inf, as require_finite does, decoding
// a chunk at a time (a whole lm_head in fp64 would be 8 bytes per weight at once).
void require_finite_elements(DType dtype, std::span<const uint8_t> bytes, uint64_t numel,
                             const std::string& where);

std::vector<double> decode_all(DType dtype, std::span<const uint8_t> bytes, uint64_t numel,
                               const std::string& where);

// Streaming summary of a tensor: finite min/max/absmax, mean and RMS over finite values, and the
// counts and first index of NaN and +-inf (bad input is reported, never averaged in).
struct TensorStats {
  uint64_t count = 0;
  uint64_t nan_count = 0;
  uint64_t inf_count = 0;
  int64_t first_nonfinite = -1;
  double min = 0, max = 0, absmax = 0, mean = 0, rms = 0;
};
TensorStats tensor_stats(DType dtype, std::span<const uint8_t> bytes, uint64_t numel,
                         const std::string& where);

}  // namespace qparity::reference
