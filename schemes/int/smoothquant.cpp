#include "schemes/int/smoothquant.h"

#include <algorithm>
#include <cmath>

#include "core/error.h"
#include "schemes/math/numeric.h"

namespace qparity::reference {

std::vector<double> smoothquant_factors(const std::vector<double>& act_absmax,
                                        const std::vector<Matrix>& linears, double alpha) {
  const int64_t k = static_cast<int64_t>(act_absmax.size());
  if (k == 0 || linears.empty())
    throw Error("smoothquant", "needs activation statistics and at least one linear");
  if (!(alpha >= 0.0 && alpha <= 1.0))
    throw Error("smoothquant", "alpha " + std::to_string(alpha) + " must be in [0, 1]");
  require_finite(act_absmax, "smoothquant activation absmax");
  std::vector<double> wmax(static_cast<size_t>(k), 0.0);
  for (size_t i = 0; i < linears.size(); ++i) {
    const Matrix& w = linears[i];
    if (w.cols != k)
      throw Error(
          "smoothquant linear " + std::to_string(i),
          "has " + std::to_string(w.cols) + " input features, the norm " + std::to_string(k));
    require_finite(w.data, "smoothquant linear " + std::to_string(i));
    for (int64_t r = 0; r < w.rows; ++r)
      for (int64_t c = 0; c < k; ++c)
        wmax[static_cast<size_t>(c)] = std::max(wmax[static_cast<size_t>(c)], std::fabs(w(r, c)));
  }
  std::vector<double> s(static_cast<size_t>(k));
  for (size_t j = 0; j < s.size(); ++j) {
    if (act_absmax[j] < 0.0)
      throw Error("smoothquant", "activation absmax of channel " + std::to_string(j) + " < 0");
    const double wj = std::max(wmax[j], kSmoothQuantFloor);
    s[j] = std::max(std::pow(act_absmax[j], alpha) / std::pow(wj, 1.0 - alpha), kSmoothQuantFloor);
  }
  return s;
}

SmoothFold fold_smoothquant(const std::vector<double>& norm_weight,
                            const std::vector<double>& norm_bias,
                            const std::vector<Matrix>& linears,
                            const std::vector<std::vector<double>>& biases,
                            const std::vector<double>& s,
                            const std::optional<std::vector<double>>& shift) {
  const size_t k = s.size();
  if (norm_weight.size() != k || (!norm_bias.empty() && norm_bias.size() != k))
    throw Error("smoothquant fold", "norm weight/bias size differs from the factors");
  if (!biases.empty() && biases.size() != linears.size())
    throw Error("smoothquant fold", "one bias per linear (or none)");
  if (shift && shift->size() != k) throw Error("smoothquant fold", "shift size differs");
  for (size_t j = 0; j < k; ++j)
    if (!std::isfinite(s[j]) || !(s[j] > 0.0))
      throw Error("smoothquant fold", "factor " + std::to_string(s[j]) + " at channel " +
                                          std::to_string(j) + " (must be finite and > 0)");
  SmoothFold f;
  f.norm_weight.resize(k);
  f.norm_bias.resize(k);
  for (size_t j = 0; j < k; ++j) {
    const double b = norm_bias.empty() ? 0.0 : norm_bias[j];
    const double z = shift ? (*shift)[j] : 0.0;
    f.norm_weight[j] = norm_weight[j] / s[j];
    f.norm_bias[j] = (b - z) / s[j];
  }
  for (size_t i = 0; i < linears.size(); ++i) {
    const Matrix& w = linears[i];
    if (static_cast<size_t>(w.cols) != k)
      throw Error("smoothquant fold", "linear " + std::to_string(i) + " has the wrong K");
    Matrix ws = w;
    std::vector<double> c =
        biases.empty() ? std::vector<double>(static_cast<size_t>(w.rows), 0.0) : biases[i];
    if (static_cast<int64_t>(c.size()) != w.rows)
      throw Error("smoothquant fold", "bias " + std::to_string(i) + " has the wrong size");
    for (int64_t r = 0; r < w.rows; ++r)
      for (int64_t col = 0; col < w.cols; ++col) {
        ws(r, col) = w(r, col) * s[static_cast<size_t>(col)];
        if (shift) c[static_cast<size_t>(r)] += w(r, col) * (*shift)[static_cast<size_t>(col)];
      }
    f.linears.push_back(std::move(ws));
    f.linear_biases.push_back(std::move(c));
  }
  return f;
}

TensorMap anti_outlier_norm_tensors(const std::string& norm_prefix, const SmoothFold& fold,
                                    AntiOutlierLayout layout,
                                    const std::vector<double>& original_weight, DType dtype) {
  const int64_t k = static_cast<int64_t>(fold.norm_weight.size());
  TensorMap out;
  const std::string mid = layout == AntiOutlierLayout::kOld ? ".module" : "";
  out[norm_prefix + mid + ".weight"] =
      encode(dtype, {k}, fold.norm_weight, Encoding::kNearest, norm_prefix + mid + ".weight");
  out[norm_prefix + mid + ".bias"] =
      encode(dtype, {k}, fold.norm_bias, Encoding::kNearest, norm_prefix + mid + ".bias");
  if (layout == AntiOutlierLayout::kOld) {
    if (static_cast<int64_t>(original_weight.size()) != k)
      throw Error(norm_prefix + ".weight", "original weight has the wrong size");
    out[norm_prefix + ".weight"] =
        encode(dtype, {k}, original_weight, Encoding::kNearest, norm_prefix + ".weight");
  }
  return out;
}

NormAffine read_anti_outlier_norm(const TensorMap& tensors, const std::string& norm_prefix,
                                  int64_t hidden) {
  NormAffine n;
  const bool old = tensors.count(norm_prefix + ".module.weight") > 0;
  n.layout = old ? AntiOutlierLayout::kOld : AntiOutlierLayout::kNew;
  const std::string mid = old ? ".module" : "";
  const std::string wn = norm_prefix + mid + ".weight", bn = norm_prefix + mid + ".bias";
  const auto wit = tensors.find(wn);
  if (wit == tensors.end()) throw Error(wn, "missing: the norm has no weight");
  const std::vector<int64_t> shp = {hidden};
  require_shape(wit->second.view(), shp, wn);
  n.weight = decode(wit->second.view(), wn);
  require_finite(n.weight, wn);
  const auto bit = tensors.find(bn);
  if (bit == tensors.end()) {
    if (old) throw Error(bn, "missing: the old anti-outlier layout stores weight and bias");
    n.bias.assign(static_cast<size_t>(hidden), 0.0);
  } else {
    require_shape(bit->second.view(), shp, bn);
    n.bias = decode(bit->second.view(), bn);
    require_finite(n.bias, bn);
  }
  return n;
}

Matrix rmsnorm_affine(const Matrix& x, const NormAffine& norm, double eps) {
  if (static_cast<int64_t>(norm.weight.size()) != x.cols ||
      static_cast<int64_t>(norm.bias.size()) != x.cols)
    throw Error("rmsnorm", "norm size differs from the hidden size");
  Matrix y(x.rows, x.cols);
  for (int64_t t = 0; t < x.rows; ++t) {
    double ss = 0.0;
    for (int64_t j = 0; j < x.cols; ++j)
      ss += x(t, j) * x(t, j);
    const double inv = 1.0 / std::sqrt(ss / static_cast<double>(x.cols) + eps);
    for (int64_t j = 0; j < x.cols; ++j)
      y(t, j) =
          x(t, j) * inv * norm.weight[static_cast<size_t>(j)] + norm.bias[static_cast<size_t>(j)];
  }
  return y;
}

}  // namespace qparity::reference
