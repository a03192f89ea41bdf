#pragma once
// The baseline of bench_reference_forward: Eigen's fp64 GEMM, compiled alone with AVX2 + FMA
// (bench/CMakeLists.txt) so it runs at its best on the CPUs the reference's AVX2 kernel runs on;
// the only translation unit of the bench that includes Eigen, so no Eigen template is compiled
// twice with different instruction sets.
namespace qparity::bench {

// Best-of-`repeats` GFLOP/s of an n x n x n fp64 GEMM (2 n^3 flops). Needs AVX2 and FMA.
double eigen_gemm_gflops(int n, int repeats, int threads);
// The instruction sets Eigen was compiled to use ("SSE, SSE2, ..., AVX2, FMA").
const char* eigen_simd();

}  // namespace qparity::bench
