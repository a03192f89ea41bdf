#include "reference_cpu/layers/activation.h"

#include <algorithm>
#include <cmath>
#include <string>

#include "core/error.h"

namespace qparity::reference {

double silu(double x) {
  return x / (1.0 + std::exp(-x));
}

Matrix silu_and_mul(const Matrix& gate_up) {
  if (gate_up.cols <= 0 || gate_up.cols % 2 != 0)
    throw Error("silu_and_mul", "gate_up width " + std::to_string(gate_up.cols) +
                                    " must be positive and even ([gate | up])");
  const int64_t inter = gate_up.cols / 2;
  Matrix y(gate_up.rows, inter);
  for (int64_t t = 0; t < gate_up.rows; ++t)
    for (int64_t i = 0; i < inter; ++i)
      y(t, i) = silu(gate_up(t, i)) * gate_up(t, inter + i);
  return y;
}

Matrix silu_and_mul(const Matrix& gate, const Matrix& up) {
  if (gate.rows != up.rows || gate.cols != up.cols)
    throw Error("silu_and_mul", "gate is [" + std::to_string(gate.rows) + ", " +
                                    std::to_string(gate.cols) + "], up is [" +
                                    std::to_string(up.rows) + ", " + std::to_string(up.cols) + "]");
  Matrix y(gate.rows, gate.cols);
  for (size_t i = 0; i < y.data.size(); ++i)
    y.data[i] = silu(gate.data[i]) * up.data[i];
  return y;
}

Matrix clamped_swiglu(const Matrix& gate_up, double alpha, double limit) {
  if (gate_up.cols <= 0 || gate_up.cols % 2 != 0)
    throw Error("clamped_swiglu", "gate_up width " + std::to_string(gate_up.cols) +
                                      " must be positive and even ([gate | up])");
  if (!(alpha > 0.0) || !(limit > 0.0) || !std::isfinite(alpha) || !std::isfinite(limit))
    throw Error("clamped_swiglu", "alpha and limit must be finite and > 0");
  const int64_t inter = gate_up.cols / 2;
  Matrix y(gate_up.rows, inter);
  for (int64_t t = 0; t < gate_up.rows; ++t)
    for (int64_t i = 0; i < inter; ++i) {
      const double g = std::min(gate_up(t, i), limit);
      const double u = std::min(std::max(gate_up(t, inter + i), -limit), limit);
      const double sig = 1.0 / (1.0 + std::exp(-(g * alpha)));
      y(t, i) = (u + 1.0) * (g * sig);
    }
  return y;
}

}  // namespace qparity::reference
