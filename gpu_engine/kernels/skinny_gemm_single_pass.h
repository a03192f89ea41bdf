#pragma once
// The skinny GEMM's single-pass form for one token (M = 1), the batch-1 decode step's shape:
// every lane's weight chunks of its row pair fit one unrolled step, and each block computes one
// group of row pairs, so the kernel is straight-line code. After the PDL wait a lane issues all
// of its loads of X at once and keeps them in registers. The generic kernel's loop over unrolled
// steps, with a bound check per chunk, made the compiler issue each chunk's load only after the
// previous chunk's products: one dependent round trip per chunk (bench_dependent_chain, "mini
// +runtime": +0.5 us a kernel). On an H100 the attn pair of bench_dependent_chain (o_proj and
// its transpose) takes 2.2-2.5 us a kernel against 2.8-3.1 with the generic kernel, the mlp pair
// 2.8-3.9 against 3.5-4.4.
//
// The sums are skinny_gemm_kernel<1>'s to the bit: the same K split (the caller passes its
// ksplit), the same lane order, the same shuffle tree and slice order, and with the prologue the
// same sum of squares (thread t stages chunk t as stage_x does, the warps' partials are added in
// warp order) and the same normalized bf16 values. So a token's outputs are the same alone
// (this kernel) and in a batch (the generic kernel): the engine's batch-invariance test covers it.
#include <cuda_runtime_api.h>

#include "gpu_engine/kernels/skinny_gemm.h"

namespace qparity::gpu {

// Launches the single-pass kernel and returns true when it covers p (M = 1, not grouped, no
// fused argmax, at most kUnroll chunks a lane, and with the prologue K <= 2048); returns false,
// launching nothing, otherwise. p is already validated by launch_skinny_gemm.
// QPARITY_SKINNY_SINGLE_PASS=off in the environment turns it off (A/B runs).
bool launch_skinny_gemm_single_pass(const SkinnyGemmParams& p, int ksplit, cudaStream_t stream);

}  // namespace qparity::gpu
