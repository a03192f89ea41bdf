#include "gpu_engine/kernels/gemm.h"

#include <string>

#include "gpu_engine/cuda_check.h"
#include "gpu_engine/kernels/launch_check.h"

namespace qparity::gpu {

namespace {

void check_blas(cublasStatus_t s, const char* call) {
  if (s != CUBLAS_STATUS_SUCCESS)
    throw_launch_error("cublasLt", std::string(call) + " failed: " + cublasLtGetStatusName(s) +
                                       " (" + cublasLtGetStatusString(s) + ")");
}

}  // namespace

BlasLtGemm::BlasLtGemm(size_t workspace_bytes) : workspace_bytes_(workspace_bytes) {
  check_blas(cublasLtCreate(&handle_), "cublasLtCreate");
  if (workspace_bytes_ > 0) QPARITY_CUDA_CHECK(cudaMalloc(&workspace_, workspace_bytes_));
}

void BlasLtGemm::destroy_plan(Plan& p) {
  cublasLtMatrixLayoutDestroy(p.a);
  cublasLtMatrixLayoutDestroy(p.b);
  cublasLtMatrixLayoutDestroy(p.c);
  cublasLtMatmulDescDestroy(p.op);
}

BlasLtGemm::~BlasLtGemm() {
  for (auto& [key, p] : plans_)
    destroy_plan(p);
  for (auto& [key, p] : plans_i8_)
    if (p) destroy_plan(*p);
  if (workspace_) cudaFree(workspace_);
  if (handle_) cublasLtDestroy(handle_);
}

// Row-major C[M,N] = A[M,K] B[N,K]^T is column-major C^T[N,M] = B[N,K] A^T: cuBLASLt's first
// operand is B read as column-major [K,N] and transposed, the second A as column-major [K,M].
// Returns whether cuBLASLt has an algorithm for it; `p` then holds it (else p is destroyed).
bool BlasLtGemm::make_plan(Plan& p, cublasComputeType_t compute, cudaDataType_t scale,
                           cudaDataType_t ab, cudaDataType_t c, int64_t m, int64_t n, int64_t k,
                           bool fp32_split_k) const {
  check_blas(cublasLtMatmulDescCreate(&p.op, compute, scale), "MatmulDescCreate");
  const cublasOperation_t t = CUBLAS_OP_T, nn = CUBLAS_OP_N;
  check_blas(cublasLtMatmulDescSetAttribute(p.op, CUBLASLT_MATMUL_DESC_TRANSA, &t, sizeof t),
             "TRANSA");
  check_blas(cublasLtMatmulDescSetAttribute(p.op, CUBLASLT_MATMUL_DESC_TRANSB, &nn, sizeof nn),
             "TRANSB");
  check_blas(
      cublasLtMatrixLayoutCreate(&p.a, ab, static_cast<uint64_t>(k), static_cast<uint64_t>(n), k),
      "layout B");
  check_blas(
      cublasLtMatrixLayoutCreate(&p.b, ab, static_cast<uint64_t>(k), static_cast<uint64_t>(m), k),
      "layout A");
  check_blas(
      cublasLtMatrixLayoutCreate(&p.c, c, static_cast<uint64_t>(n), static_cast<uint64_t>(m), n),
      "layout C");
  cublasLtMatmulPreference_t pref;
  check_blas(cublasLtMatmulPreferenceCreate(&pref), "PreferenceCreate");
  check_blas(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES,
                                                  &workspace_bytes_, sizeof workspace_bytes_),
             "workspace preference");
  if (fp32_split_k) {
    // Split-K partial sums must stay fp32: the in-place and output-type schemes add them in the
    // output's type (bf16), extra roundings the fp32-accumulation contract does not allow.
    const uint32_t reduction = CUBLASLT_REDUCTION_SCHEME_COMPUTE_TYPE;
    check_blas(cublasLtMatmulPreferenceSetAttribute(
                   pref, CUBLASLT_MATMUL_PREF_REDUCTION_SCHEME_MASK, &reduction, sizeof reduction),
               "reduction scheme preference");
  }
  cublasLtMatmulHeuristicResult_t result{};
  int found = 0;
  const cublasStatus_t s =
      cublasLtMatmulAlgoGetHeuristic(handle_, p.op, p.a, p.b, p.c, p.c, pref, 1, &result, &found);
  cublasLtMatmulPreferenceDestroy(pref);
  if (s != CUBLAS_STATUS_SUCCESS || found == 0) {
    destroy_plan(p);
    return false;
  }
  p.algo = result.algo;
  return true;
}

const BlasLtGemm::Plan& BlasLtGemm::plan(int64_t m, int64_t n, int64_t k, GemmOut out) {
  const auto key = std::make_tuple(m, n, k, static_cast<int>(out));
  if (auto it = plans_.find(key); it != plans_.end()) return it->second;
  Plan p;
  if (!make_plan(p, CUBLAS_COMPUTE_32F, CUDA_R_32F, CUDA_R_16BF,
                 out == GemmOut::kBf16 ? CUDA_R_16BF : CUDA_R_32F, m, n, k, true))
    throw_launch_error("cublasLt", "no algorithm for M=" + std::to_string(m) +
                                       " N=" + std::to_string(n) + " K=" + std::to_string(k));
  return plans_.emplace(key, p).first->second;
}

// Exact int32 sums of int8 products; no algorithm (a shape cuBLASLt's int8 kernels refuse) is
// remembered as such, and the caller takes its own kernel.
const BlasLtGemm::Plan* BlasLtGemm::plan_i8(int64_t m, int64_t n, int64_t k) {
  const auto key = std::make_tuple(m, n, k);
  if (auto it = plans_i8_.find(key); it != plans_i8_.end())
    return it->second ? &*it->second : nullptr;
  Plan p;
  if (!make_plan(p, CUBLAS_COMPUTE_32I, CUDA_R_32I, CUDA_R_8I, CUDA_R_32I, m, n, k, false)) {
    plans_i8_.emplace(key, std::nullopt);
    return nullptr;
  }
  return &*plans_i8_.emplace(key, p).first->second;
}

bool BlasLtGemm::nt_i8(const int8_t* a, const int8_t* b, int32_t* c, int64_t m, int64_t n,
                       int64_t k, cudaStream_t stream) {
  constexpr const char* kName = "gemm_i8_nt";
  require(a && b && c, kName, "a, b and c are required");
  require(m >= 0 && n > 0 && k > 0, kName, "M >= 0, N > 0, K > 0");
  require(aligned(a, 16) && aligned(b, 16) && aligned(c, 16), kName,
          "pointers must be 16-byte aligned");
  if (k % 4 != 0 || n % 4 != 0) return false;
  if (m == 0) return true;
  const Plan* p = plan_i8(m, n, k);
  if (!p) return false;
  const int32_t alpha = 1, beta = 0;
  check_blas(cublasLtMatmul(handle_, p->op, &alpha, b, p->a, a, p->b, &beta, c, p->c, c, p->c,
                            &p->algo, workspace_, workspace_bytes_, stream),
             "cublasLtMatmul (int8)");
  return true;
}

void BlasLtGemm::nt(const __nv_bfloat16* a, const __nv_bfloat16* b, void* c, GemmOut out, int64_t m,
                    int64_t n, int64_t k, cudaStream_t stream) {
  constexpr const char* kName = "gemm_bf16_nt";
  require(a && b && c, kName, "a, b and c are required");
  require(m >= 0 && n > 0 && k > 0, kName,
          "M >= 0, N > 0, K > 0 (got " + std::to_string(m) + ", " + std::to_string(n) + ", " +
              std::to_string(k) + ")");
  require(k % 8 == 0, kName, "K must be a multiple of 8 (got " + std::to_string(k) + ")");
  require(aligned(a, 16) && aligned(b, 16) && aligned(c, 16), kName,
          "pointers must be 16-byte aligned");
  if (m == 0) return;
  const Plan& p = plan(m, n, k, out);
  const float alpha = 1.f, beta = 0.f;
  check_blas(cublasLtMatmul(handle_, p.op, &alpha, b, p.a, a, p.b, &beta, c, p.c, c, p.c, &p.algo,
                            workspace_, workspace_bytes_, stream),
             "cublasLtMatmul");
}

}  // namespace qparity::gpu
