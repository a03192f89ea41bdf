#pragma once
// The reference's vector kernels (the products behind matmul.h and the widening of stored weights
// they read), one set per instruction set, each in its own translation unit
// compiled for that set alone (schemes/CMakeLists.txt). They take raw pointers only and include
// nothing but intrinsics, so no inline function of a shared header is ever compiled for AVX-512 and
// then picked by the linker for a CPU without it.
//
// A panel is `rows` weight rows transposed over a column block [j0, j1):
//   panel[(j - j0) * rows + r] = w[r][j].
// dot(x, tokens, panel, j0, j1, fresh, out) continues, for every token t and panel row r,
//   out[t * rows + r] = fma(x[t][j], panel[(j - j0) * rows + r], out[t * rows + r]), j ascending,
// from 0.0 when `fresh`. Storing a partial sum and loading it back changes no bit, so cutting K
// into blocks changes nothing but the cache traffic.
#include <cstdint>

namespace qparity::reference::kernels {

using DotPanel = void (*)(const double* const* x, int64_t tokens, const double* panel, int64_t j0,
                          int64_t j1, bool fresh, double* out);

// panel[c * rows + r] = block[r * w + c] for the kernel's `rows` rows and c < w: a block of rows
// decoded side by side, transposed into a panel (rows past the decoded ones are zeros in block).
using TransposeBlock = void (*)(const double* block, int64_t w, double* panel);

// Panel rows and column block of each kernel: the block of the panel and a token tile's x stay in
// the first-level cache while every token tile passes over them.
inline constexpr int64_t kPortableRows = 4, kPortableBlock = 256;
inline constexpr int64_t kAvx2Rows = 8, kAvx2Block = 256;       // 2 ymm x 6 tokens of 16 registers
inline constexpr int64_t kAvx512Rows = 24, kAvx512Block = 128;  // 3 zmm x 8 tokens of 32

void transpose_portable(const double* block, int64_t w, double* panel);
void transpose_avx2(const double* block, int64_t w, double* panel);
void transpose_avx512(const double* block, int64_t w, double* panel);

void dot_panel_portable(const double* const* x, int64_t tokens, const double* panel, int64_t j0,
                        int64_t j1, bool fresh, double* out);
void dot_panel_avx2(const double* const* x, int64_t tokens, const double* panel, int64_t j0,
                    int64_t j1, bool fresh, double* out);
void dot_panel_avx512(const double* const* x, int64_t tokens, const double* panel, int64_t j0,
                      int64_t j1, bool fresh, double* out);

// out[i] = the bf16 code at bytes[2 i] (little-endian) as a double, i < n: exact (a bf16 is the top
// half of an fp32, which widens to fp64 exactly; a NaN stays a NaN).
using WidenBf16 = void (*)(const uint8_t* bytes, double* out, int64_t n);
void widen_bf16_portable(const uint8_t* bytes, double* out, int64_t n);
void widen_bf16_avx2(const uint8_t* bytes, double* out, int64_t n);
void widen_bf16_avx512(const uint8_t* bytes, double* out, int64_t n);
// The fastest of them this CPU runs (the values are the same with any).
WidenBf16 widen_bf16();

}  // namespace qparity::reference::kernels
