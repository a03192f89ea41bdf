#pragma once
// SmoothQuant / msModelSlim anti-outlier norm folding (transform `smoothquant`; FORMATS.md §5.7,
// card C16).
//
// Factors (SmoothQuant, mit-han-lab/smoothquant `smooth.py::smooth_ln_fcs`; msModelSlim's
// anti-outlier "smooth" follows the same rule, its scale search being calibration-side):
//   w_j = max(max_i max_n |W_i[n, j]|, 1e-5)             over every linear fed by the norm
//   s_j = max(max|X_j|^alpha / w_j^(1 - alpha), 1e-5)      alpha default 0.5
// The 1e-5 floors (the reference implementation's clamp(min=1e-5)) keep s finite and > 0 for
// all-zero activation or weight channels. Computed in fp64 (the tool computes in the model
// dtype; the factors are calibration choices, only the fold must be exact).
//
// Fold (exact algebra, fp64): the norm output y = rmsnorm(x)·w + b feeds linears W_i y + c_i.
//   norm weight  w' = w / s
//   linears      W_i' = W_i · diag(s)
// With an outlier-suppression+ shift z (per channel): y' = (y - z)/s, so
//   norm bias    b' = (b - z) / s            (b = 0 for a plain RMSNorm: b' = -z/s)
//   linear bias  c_i' = c_i + W_i z          (W_i' y' + c_i' = W_i (y - z) + c_i + W_i z = W_i y +
//   c_i)
// Files (msModelSlim): new layout `<norm>.weight` (w') + `<norm>.bias` (b', FLOAT); old layout
// `<norm>.module.weight` + `<norm>.module.bias` with `<norm>.weight` kept as the original weight
// for fallback layers. The forward is rmsnorm(x)·w' + b' (MindIE AntiOutlierNormMethod:
// npu_rms_norm(x, w, eps) + bias). Dialects change nothing here: the fold is exact algebra and
// the engines only read the two tensors.
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "core/dtype.h"
#include "schemes/math/matmul.h"
#include "schemes/method/host_tensor.h"

namespace qparity::reference {

inline constexpr double kSmoothQuantFloor = 1e-5;

// act_absmax [K] (max|X_j| over calibration tokens); linears each [N_i, K].
std::vector<double> smoothquant_factors(const std::vector<double>& act_absmax,
                                        const std::vector<Matrix>& linears, double alpha = 0.5);

struct SmoothFold {
  std::vector<double> norm_weight;  // w / s
  std::vector<double> norm_bias;    // (b - z) / s  (zeros without shift and original bias)
  std::vector<Matrix> linears;      // W_i · diag(s)
  std::vector<std::vector<double>> linear_biases;  // c_i + W_i z  (c_i = 0 when absent)
};

// s > 0 finite [K]; norm_bias may be empty (a plain RMSNorm); biases may be empty or one per
// linear; shift z [K] optional.
SmoothFold fold_smoothquant(const std::vector<double>& norm_weight,
                            const std::vector<double>& norm_bias,
                            const std::vector<Matrix>& linears,
                            const std::vector<std::vector<double>>& biases,
                            const std::vector<double>& s,
                            const std::optional<std::vector<double>>& shift = std::nullopt);

enum class AntiOutlierLayout : uint8_t { kNew, kOld };

// The norm's tensors under `norm_prefix` ("model.layers.0.input_layernorm"), written as `dtype`
// (msModelSlim: the model dtype for the weight, FLOAT bias). kOld also writes
// `<norm>.weight` = original_weight.
TensorMap anti_outlier_norm_tensors(const std::string& norm_prefix, const SmoothFold& fold,
                                    AntiOutlierLayout layout,
                                    const std::vector<double>& original_weight, DType dtype);

struct NormAffine {
  std::vector<double> weight;
  std::vector<double> bias;  // zeros when the file has none
  AntiOutlierLayout layout = AntiOutlierLayout::kNew;
};
// Reads either layout (old preferred when `<norm>.module.weight` exists); `hidden` checks shapes.
NormAffine read_anti_outlier_norm(const TensorMap& tensors, const std::string& norm_prefix,
                                  int64_t hidden);

// rmsnorm(x)·w + b in fp64: x [T, H], y[t, j] = x[t, j] / sqrt(mean_j x^2 + eps) · w_j + b_j.
Matrix rmsnorm_affine(const Matrix& x, const NormAffine& norm, double eps);

}  // namespace qparity::reference
