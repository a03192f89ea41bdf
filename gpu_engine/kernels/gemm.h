#pragma once
// bf16 GEMM through cuBLASLt, the layout every linear of the engine uses:
//   C[M, N] = A[M, K] · B[N, K]^T     (row-major; B is the weight as checkpoints store it)
// fp32 accumulation (CUBLAS_COMPUTE_32F), C rounded once to bf16 (or kept fp32). The algorithm
// for each (M, N, K, output) comes from cuBLASLt's heuristic once and is then reused, so one
// shape always runs the same algorithm: bit-identical run to run.
#include <cublasLt.h>
#include <cuda_bf16.h>
#include <cuda_runtime_api.h>

#include <cstdint>
#include <map>
#include <optional>
#include <tuple>

namespace qparity::gpu {

enum class GemmOut { kBf16, kF32 };

class BlasLtGemm {
 public:
  explicit BlasLtGemm(size_t workspace_bytes = size_t{32} << 20);
  ~BlasLtGemm();
  BlasLtGemm(const BlasLtGemm&) = delete;
  BlasLtGemm& operator=(const BlasLtGemm&) = delete;

  // Pointers 16-byte aligned, K a multiple of 8 (16-byte rows for cuBLASLt's tensor-core paths).
  void nt(const __nv_bfloat16* a, const __nv_bfloat16* b, void* c, GemmOut out, int64_t m,
          int64_t n, int64_t k, cudaStream_t stream);
  // The exact int8 product C[M, N] = A[M, K] · B[N, K]^T into int32 (CUBLAS_COMPUTE_32I: every
  // sum exact, so any algorithm gives the same bits). Returns false, launching nothing, when
  // cuBLASLt has no algorithm for the shape (the caller then uses its own kernel). K and N
  // multiples of 4, pointers 16-byte aligned.
  bool nt_i8(const int8_t* a, const int8_t* b, int32_t* c, int64_t m, int64_t n, int64_t k,
             cudaStream_t stream);

 private:
  struct Plan {
    cublasLtMatmulDesc_t op = nullptr;
    cublasLtMatrixLayout_t a = nullptr, b = nullptr, c = nullptr;
    cublasLtMatmulAlgo_t algo{};
  };
  // The descriptors of C = A B^T (row-major, see gemm.cpp) and cuBLASLt's first heuristic
  // algorithm; false (p destroyed) when there is none. fp32_split_k: split-K partial sums stay in
  // the fp32 compute type.
  bool make_plan(Plan& p, cublasComputeType_t compute, cudaDataType_t scale, cudaDataType_t ab,
                 cudaDataType_t c, int64_t m, int64_t n, int64_t k, bool fp32_split_k) const;
  static void destroy_plan(Plan& p);
  const Plan& plan(int64_t m, int64_t n, int64_t k, GemmOut out);
  // nullptr when cuBLASLt has no int8 algorithm for the shape.
  const Plan* plan_i8(int64_t m, int64_t n, int64_t k);

  cublasLtHandle_t handle_ = nullptr;
  void* workspace_ = nullptr;
  size_t workspace_bytes_ = 0;
  std::map<std::tuple<int64_t, int64_t, int64_t, int>, Plan> plans_;
  std::map<std::tuple<int64_t, int64_t, int64_t>, std::optional<Plan>> plans_i8_;
};

}  // namespace qparity::gpu
