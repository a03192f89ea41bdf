#include "gpu_engine/kernels/fp8_blas.h"

#include <cublasLt.h>

#include <map>
#include <optional>
#include <string>
#include <tuple>

#include "gpu_engine/cuda_check.h"
#include "gpu_engine/kernels/launch_check.h"

namespace qparity::gpu {

namespace {

constexpr const char* kName = "fp8_blas_gemm";

void check_blas(cublasStatus_t s, const char* call) {
  if (s != CUBLAS_STATUS_SUCCESS)
    throw_launch_error(kName, std::string(call) + " failed: " + cublasLtGetStatusName(s) + " (" +
                                  cublasLtGetStatusString(s) + ")");
}

template <typename T>
void set(cublasLtMatmulDesc_t d, cublasLtMatmulDescAttributes_t attr, const T& v,
         const char* what) {
  check_blas(cublasLtMatmulDescSetAttribute(d, attr, &v, sizeof v), what);
}

// One thread's handle, workspace and plans. Row-major y[m, n] = A[m, k] B[n, k]^T is
// column-major y^T[n, m] = B[n, k] A^T, so cuBLASLt's first operand ("A", M = n) is the weight
// and its second ("B", N = m) the activations, as in gemm.cpp.
class Fp8Blas {
 public:
  Fp8Blas() {
    check_blas(cublasLtCreate(&handle_), "cublasLtCreate");
    QPARITY_CUDA_CHECK(cudaMalloc(&workspace_, kWorkspaceBytes));
  }
  ~Fp8Blas() {
    for (auto& [key, p] : plans_)
      if (p) destroy(*p);
    cudaFree(workspace_);
    cublasLtDestroy(handle_);
  }
  Fp8Blas(const Fp8Blas&) = delete;
  Fp8Blas& operator=(const Fp8Blas&) = delete;

  bool run(const Fp8BlasParams& p, cudaStream_t stream) {
    Plan* plan = find(p);
    if (!plan) return false;
    // The pointers change per call; the descriptor is this thread's alone.
    set(plan->op, CUBLASLT_MATMUL_DESC_A_SCALE_POINTER, static_cast<const void*>(p.b_scales),
        "weight scale pointer");
    set(plan->op, CUBLASLT_MATMUL_DESC_B_SCALE_POINTER, static_cast<const void*>(p.a_scales),
        "activation scale pointer");
    if (p.bias)
      set(plan->op, CUBLASLT_MATMUL_DESC_BIAS_POINTER, static_cast<const void*>(p.bias),
          "bias pointer");
    const float beta = 0.f;
    check_blas(
        cublasLtMatmul(handle_, plan->op, &p.alpha, p.b, plan->w, p.a, plan->x, &beta, p.y, plan->y,
                       p.y, plan->y, &plan->algo, workspace_, kWorkspaceBytes, stream),
        "cublasLtMatmul (fp8)");
    return true;
  }

 private:
  static constexpr size_t kWorkspaceBytes = size_t{32} << 20;
  struct Plan {
    cublasLtMatmulDesc_t op = nullptr;
    cublasLtMatrixLayout_t w = nullptr, x = nullptr, y = nullptr;
    cublasLtMatmulAlgo_t algo{};
  };
  using Key = std::tuple<int64_t, int64_t, int64_t, int, bool>;

  static void destroy(Plan& p) {
    cublasLtMatrixLayoutDestroy(p.w);
    cublasLtMatrixLayoutDestroy(p.x);
    cublasLtMatrixLayoutDestroy(p.y);
    cublasLtMatmulDescDestroy(p.op);
  }

  // The plan of p's shape and mode; nullptr (remembered) when cuBLASLt has no algorithm for it.
  Plan* find(const Fp8BlasParams& p) {
    const Key key{p.m, p.n, p.k, static_cast<int>(p.scales), p.bias != nullptr};
    if (auto it = plans_.find(key); it != plans_.end()) return it->second ? &*it->second : nullptr;
    Plan plan;
    std::optional<Plan> made;
    if (make(p, plan)) made = plan;
    auto& slot = plans_.emplace(key, made).first->second;
    return slot ? &*slot : nullptr;
  }

  bool make(const Fp8BlasParams& p, Plan& plan) const {
    check_blas(cublasLtMatmulDescCreate(&plan.op, CUBLAS_COMPUTE_32F, CUDA_R_32F), "DescCreate");
    set(plan.op, CUBLASLT_MATMUL_DESC_TRANSA, CUBLAS_OP_T, "TRANSA");
    set(plan.op, CUBLASLT_MATMUL_DESC_TRANSB, CUBLAS_OP_N, "TRANSB");
    set(plan.op, CUBLASLT_MATMUL_DESC_FAST_ACCUM, int8_t{0}, "FAST_ACCUM");
    int32_t w_mode = CUBLASLT_MATMUL_MATRIX_SCALE_OUTER_VEC_32F, x_mode = w_mode;
    if (p.scales == Fp8BlasScales::kRow128)
      w_mode = x_mode = CUBLASLT_MATMUL_MATRIX_SCALE_VEC128_32F;
    if (p.scales == Fp8BlasScales::kBlock128) {
      w_mode = CUBLASLT_MATMUL_MATRIX_SCALE_BLK128x128_32F;
      x_mode = CUBLASLT_MATMUL_MATRIX_SCALE_VEC128_32F;
    }
    set(plan.op, CUBLASLT_MATMUL_DESC_A_SCALE_MODE, w_mode, "A_SCALE_MODE");
    set(plan.op, CUBLASLT_MATMUL_DESC_B_SCALE_MODE, x_mode, "B_SCALE_MODE");
    set(plan.op, CUBLASLT_MATMUL_DESC_A_SCALE_POINTER, static_cast<const void*>(p.b_scales),
        "weight scale pointer");
    set(plan.op, CUBLASLT_MATMUL_DESC_B_SCALE_POINTER, static_cast<const void*>(p.a_scales),
        "activation scale pointer");
    if (p.bias) {
      set(plan.op, CUBLASLT_MATMUL_DESC_EPILOGUE, CUBLASLT_EPILOGUE_BIAS, "EPILOGUE");
      set(plan.op, CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE, int32_t{CUDA_R_16BF}, "BIAS_DATA_TYPE");
      set(plan.op, CUBLASLT_MATMUL_DESC_BIAS_POINTER, static_cast<const void*>(p.bias),
          "bias pointer");
    }
    const auto u = [](int64_t v) { return static_cast<uint64_t>(v); };
    check_blas(cublasLtMatrixLayoutCreate(&plan.w, CUDA_R_8F_E4M3, u(p.k), u(p.n), p.k),
               "weight layout");
    check_blas(cublasLtMatrixLayoutCreate(&plan.x, CUDA_R_8F_E4M3, u(p.k), u(p.m), p.k),
               "activation layout");
    check_blas(cublasLtMatrixLayoutCreate(&plan.y, CUDA_R_16BF, u(p.n), u(p.m), p.n),
               "output layout");
    cublasLtMatmulPreference_t pref;
    check_blas(cublasLtMatmulPreferenceCreate(&pref), "PreferenceCreate");
    const size_t ws = kWorkspaceBytes;
    check_blas(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES,
                                                    &ws, sizeof ws),
               "workspace preference");
    // Split-K partial sums stay fp32 (not rounded to the bf16 output between splits).
    const uint32_t reduction = CUBLASLT_REDUCTION_SCHEME_COMPUTE_TYPE;
    check_blas(cublasLtMatmulPreferenceSetAttribute(
                   pref, CUBLASLT_MATMUL_PREF_REDUCTION_SCHEME_MASK, &reduction, sizeof reduction),
               "reduction scheme preference");
    cublasLtMatmulHeuristicResult_t result{};
    int found = 0;
    const cublasStatus_t s = cublasLtMatmulAlgoGetHeuristic(
        handle_, plan.op, plan.w, plan.x, plan.y, plan.y, pref, 1, &result, &found);
    cublasLtMatmulPreferenceDestroy(pref);
    if (s != CUBLAS_STATUS_SUCCESS || found == 0) {
      destroy(plan);
      return false;
    }
    plan.algo = result.algo;
    return true;
  }

  cublasLtHandle_t handle_ = nullptr;
  void* workspace_ = nullptr;
  std::map<Key, std::optional<Plan>> plans_;
};

Fp8Blas& this_thread_blas() {
  thread_local Fp8Blas blas;
  return blas;
}

}  // namespace

void fp8_blas_prepare() {
  this_thread_blas();
}

bool fp8_blas_gemm(const Fp8BlasParams& p, cudaStream_t stream) {
  require(p.a && p.a_scales && p.b && p.b_scales && p.y, kName,
          "a, a_scales, b, b_scales and y are required");
  require(p.m >= 0 && p.n > 0 && p.k > 0, kName, "m >= 0, n > 0, k > 0");
  if (p.m == 0) return true;
  if (p.m % 4 != 0 || p.n % 4 != 0 || p.k % 16 != 0) return false;
  if (!aligned(p.a, 16) || !aligned(p.b, 16) || !aligned(p.y, 16) || !aligned(p.a_scales, 16) ||
      !aligned(p.b_scales, 16) || (p.bias && !aligned(p.bias, 16)))
    return false;
  return this_thread_blas().run(p, stream);
}

}  // namespace qparity::gpu
