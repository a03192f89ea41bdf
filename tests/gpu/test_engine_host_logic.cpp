// The fused greedy argmax's 64-bit key (skinny_gemm.h), host side: needs no device, so it runs in
// CI too. Its order must be launch_argmax's order on every float.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdint>
#include <limits>
#include <vector>

#include "gpu_engine/kernels/skinny_gemm.h"

namespace qparity {
namespace {

// launch_argmax's order: larger value first, ties (-0 == +0 included) to the lowest index.
bool better(float a, uint32_t ia, float b, uint32_t ib) {
  return a > b || (a == b && ia < ib);
}

TEST(FusedArgmaxKey, OrdersEveryFloatClassAsTheArgmaxKernel) {
  const float inf = std::numeric_limits<float>::infinity();
  std::vector<float> v = {-inf, -3.4e38f, -1.5f,  -1.0f, -1e-38f, -1e-45f, -0.0f,
                          0.0f, 1e-45f,   1e-38f, 1.0f,  1.5f,    3.4e38f, inf};
  for (const float a : v)
    for (const float b : v)
      for (const uint32_t ia : {0u, 1u, 7u, 151935u})
        for (const uint32_t ib : {0u, 2u, 7u, 4000000000u}) {
          if (ia == ib) continue;
          EXPECT_EQ(gpu::argmax_key(a, ia) > gpu::argmax_key(b, ib), better(a, ia, b, ib))
              << a << "@" << ia << " vs " << b << "@" << ib;
        }
  // NaN (any payload, either sign) outranks every number and decodes to -1.
  for (const uint32_t bits : {0x7fc00000u, 0xffc00000u, 0x7f800001u, 0xffffffffu}) {
    const float nan = std::bit_cast<float>(bits);
    EXPECT_GT(gpu::argmax_key(nan, 5), gpu::argmax_key(inf, 0));
    EXPECT_EQ(gpu::argmax_id(gpu::argmax_key(nan, 5)), -1);
  }
  EXPECT_EQ(gpu::argmax_id(0), -1);  // a key no block set
  for (const uint32_t i : {0u, 1u, 151935u, 1u << 30})
    EXPECT_EQ(gpu::argmax_id(gpu::argmax_key(-inf, i)), static_cast<int32_t>(i));
}

// Monotone over the float line: every float whose low 12 bits are zero, and its two neighbours,
// in numeric order, map to non-decreasing value bits, strictly increasing except across -0 / +0.
TEST(FusedArgmaxKey, ValueBitsAreMonotoneOverTheFloatLine) {
  std::vector<float> line;
  for (uint64_t hi = 0; hi < (uint64_t{1} << 20); ++hi)
    for (const int d : {-1, 0, 1}) {
      const int64_t bits = static_cast<int64_t>(hi << 12) + d;
      if (bits < 0 || bits > 0xffffffffll) continue;
      const float f = std::bit_cast<float>(static_cast<uint32_t>(bits));
      if (!std::isnan(f)) line.push_back(f);
    }
  std::sort(line.begin(), line.end());
  line.erase(std::unique(line.begin(), line.end(),
                         [](float a, float b) {
                           return std::bit_cast<uint32_t>(a) == std::bit_cast<uint32_t>(b);
                         }),
             line.end());
  ASSERT_GT(line.size(), size_t{3100000});
  for (size_t i = 1; i < line.size(); ++i) {
    const uint64_t a = gpu::argmax_key(line[i - 1], 0) >> 32, b = gpu::argmax_key(line[i], 0) >> 32;
    if (line[i - 1] == line[i])  // -0 and +0
      EXPECT_EQ(a, b);
    else
      ASSERT_LT(a, b) << line[i - 1] << " vs " << line[i];
  }
}

}  // namespace
}  // namespace qparity
