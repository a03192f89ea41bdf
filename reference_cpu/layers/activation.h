#pragma once
// The gated MLP activation: act = silu(gate) * up, elementwise, in fp64.
//
// silu(x) is computed as x / (1 + std::exp(-x)): that is the expression PyTorch's CPU SiLU kernel
// evaluates (aten/src/ATen/native/cpu/Activation.cpp, silu_kernel: x / (1 + exp(-x)), scalar and
// vectorized), which is what HF's nn.SiLU (x * sigmoid(x)) runs. The form x * (1 / (1 + exp(-x)))
// differs from it by one extra rounding (<= 1 ulp of the result), and the only other difference
// from torch is its vectorized exp against libm's (each within ~1 ulp), so the two agree to a few
// ulp, far inside the 1e-12 contract. Extremes behave: x -> -inf gives -0 (exp overflows to inf),
// x -> +inf gives x. Then act = silu(gate) * up, one more rounding. Elementwise, no reductions.
#include "schemes/math/matmul.h"

namespace qparity::reference {

// silu(x) = x / (1 + exp(-x)) in fp64.
double silu(double x);

// gate_up [T, 2I] = [gate | up] (the fused gate_up_proj output, gate first) -> [T, I].
// Throws qparity::Error ("silu_and_mul") for an odd or zero width.
Matrix silu_and_mul(const Matrix& gate_up);

// gate [T, I], up [T, I] -> [T, I]. Throws qparity::Error ("silu_and_mul") when the shapes differ.
Matrix silu_and_mul(const Matrix& gate, const Matrix& up);

// gpt-oss's experts (HF GptOssExperts.forward; vLLM's swigluoai_and_mul), gate_up [T, 2I] =
// [gate | up] -> [T, I], elementwise in fp64:
//   g = min(gate, limit)               (torch clamp(max=limit))
//   u = min(max(up, -limit), limit)
//   out = (u + 1) * (g * (1 / (1 + std::exp(-(g * alpha)))))   (g * torch.sigmoid(g * alpha))
// Throws qparity::Error ("clamped_swiglu") for an odd or zero width, or alpha / limit not > 0.
Matrix clamped_swiglu(const Matrix& gate_up, double alpha, double limit);

}  // namespace qparity::reference
