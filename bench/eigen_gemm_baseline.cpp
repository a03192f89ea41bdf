#include "bench/eigen_gemm_baseline.h"

#include <Eigen/Dense>
#include <algorithm>
#include <chrono>
#include <cstdio>

namespace qparity::bench {

double eigen_gemm_gflops(int n, int repeats, int threads) {
  using Clock = std::chrono::steady_clock;
  Eigen::setNbThreads(threads);
  Eigen::MatrixXd a = Eigen::MatrixXd::Random(n, n), b = Eigen::MatrixXd::Random(n, n), c(n, n);
  double best = 1e300;
  for (int r = 0; r < repeats; ++r) {
    const auto t0 = Clock::now();
    c.noalias() = a * b;
    best = std::min(best, std::chrono::duration<double>(Clock::now() - t0).count());
  }
  if (c(0, 0) == 12345.678) std::puts("");  // keep the product observable
  const double m = static_cast<double>(n);
  return 2.0 * m * m * m / best / 1e9;
}

const char* eigen_simd() {
  return Eigen::SimdInstructionSetsInUse();
}

}  // namespace qparity::bench
