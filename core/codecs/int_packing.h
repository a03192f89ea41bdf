#pragma once
// Bit-exact integer packings used by quantized checkpoints.
//  * Nibbles in bytes (NVFP4/MXFP4 e2m1 codes, msModelSlim W4A8, SGLang MxINT4 repack): byte j
//    holds element 2j in bits 0-3 and element 2j+1 in bits 4-7.
//  * int4 as a nibble: two's complement (q & 0xF) or offset binary "uint4b8" (q + 8, the GPTQ /
//    compressed-tensors convention).
//  * compressed-tensors pack-quantized int32 words (FORMATS.md 2.6(b)): each b-bit value q is
//    stored unsigned, u = q + 2^(b-1). Two layouts exist:
//      kDenseStream (compressed-tensors >= 3f01c782, 2026-05): element i occupies bits
//        [i*b, i*b+b) of a little-endian stream of 32-bit words; values may straddle words.
//      kPerWord (older): 32/b elements per word, element j of a word at bits [j*b, j*b+b), the
//        high 32 mod b bits unused.
//    For b in {1,2,4,8} the two are bit-identical.
// Unused (padding) bits must be zero on unpack: a nonzero padding bit means the layout or the
// element count is wrong, and the error says so rather than returning plausible numbers.
#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <vector>

namespace qparity::codec {

std::vector<uint8_t> pack_nibbles(std::span<const uint8_t> nibbles, const std::string& where = "");
std::vector<uint8_t> unpack_nibbles(std::span<const uint8_t> bytes, size_t count,
                                    const std::string& where = "");

uint8_t int4_to_nibble(int q);        // two's complement, q in [-8, 7]
int nibble_to_int4(uint8_t nibble);   // sign-extends bit 3
uint8_t int4_to_uint4b8(int q);       // q + 8, q in [-8, 7]
int uint4b8_to_int4(uint8_t nibble);  // nibble - 8

// msModelSlim W4A8_DYNAMIC (v1 `save/utils/pack.py::w4a8_pack_int4`: transpose, `_pack_int4`
// over pairs, transpose back): signed int4 codes q [rows, cols] -> int8 bytes [rows/2, cols],
// pairs along the ROWS (the output dim N): byte[j, c] = (q[2j, c] & 0xF) | (q[2j+1, c] << 4),
// i.e. row 2j in the low nibble, two's complement. rows must be even; codes outside [-8, 7] and
// byte/shape mismatches are Errors naming `where`.
std::vector<int8_t> pack_int4_row_pairs(std::span<const int8_t> q, size_t rows, size_t cols,
                                        const std::string& where = "");
std::vector<int8_t> unpack_int4_row_pairs(std::span<const int8_t> bytes, size_t rows, size_t cols,
                                          const std::string& where = "");

enum class CtPackLayout { kDenseStream, kPerWord };

size_t ct_packed_len(size_t count, int bits, CtPackLayout layout);
std::vector<int32_t> ct_pack(std::span<const int8_t> values, int bits, CtPackLayout layout,
                             const std::string& where = "");
std::vector<int8_t> ct_unpack(std::span<const int32_t> words, size_t count, int bits,
                              CtPackLayout layout, const std::string& where = "");

}  // namespace qparity::codec
