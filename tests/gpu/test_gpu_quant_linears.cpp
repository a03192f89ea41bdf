// The GPU's quantized linear methods against the fp64 reference's own apply(): each scheme's
// checkpoint tensors from the reference quantizer, loaded and processed by the reference method
// (the lifecycle both engines share), uploaded by the GPU method, applied to fresh random bf16
// inputs with the output poisoned (NaN) first. Judged like every kernel (kernel_test_util.h):
// rel_l2 against the fp64 result rounded once to bf16 within kFlipBound. Then the runtime's
// promises: bit-identical reruns, batch invariance (a token's row the same alone or in a batch
// of 64), and a deliberate group-index fault that the same check catches. Launcher and factory
// refusals run without a device.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <iostream>
#include <random>

#include "../unit/error_of.h"
#include "../unit/test_seed.h"
#include "core/codecs/float_format.h"
#include "gpu_engine/device_buffer.h"
#include "gpu_engine/kernels/fp4_gemm.h"
#include "gpu_engine/kernels/fp8_blas.h"
#include "gpu_engine/kernels/int_group_gemm.h"
#include "gpu_engine/kernels/weight_only_gemm.h"
#include "gpu_engine/kernels/weight_only_mma.h"
#include "gpu_engine/quant/fp8_gemm_runtime.h"
#include "gpu_engine/quant/gpu_linear_method.h"
#include "gpu_engine/quant/weight_only_int.h"
#include "gpu_engine/quant/weight_only_mma_layout.h"
#include "gpu_test.h"
#include "kernel_test_util.h"
#include "schemes/method/method_factory.h"

namespace qparity {
namespace {

using gpu::DeviceBuffer;
using test::Bf16;
using test::kFlipBound;
using ::testing::HasSubstr;

struct Case {
  std::string scheme;
  bool symmetric = true;
  std::vector<int64_t> partitions;  // out_features of each fused partition
  int64_t k = 0;
  Dialect dialect = Dialect::kIdeal;
  bool weight_only = false;  // the W4A16 / A16 presets (no activation quantization)
  bool bias = false;         // a bf16 bias on every partition
};

std::string name_of(const Case& c) {
  std::string n = c.scheme + (c.symmetric ? " sym" : " asym") + " " +
                  std::string(qparity::to_string(c.dialect)) + " N=[";
  for (int64_t p : c.partitions)
    n += std::to_string(p) + ",";
  return n + "] K=" + std::to_string(c.k) + (c.weight_only ? " weight-only" : "") +
         (c.bias ? " bias" : "");
}

// The processed reference method of one case, its weights from the reference quantizer.
std::unique_ptr<reference::LinearMethod> reference_method(const Case& c, std::mt19937_64& rng) {
  const SchemeId id = parse_scheme_id(c.scheme);
  reference::MethodConfig mc = reference::method_config(id, c.dialect);
  if (mc.weights) mc.weights->symmetric = c.symmetric;
  if (c.weight_only) mc.input_activations.reset();
  reference::LinearShape shape;
  shape.prefix = "model.layers.0.self_attn";
  shape.partitions = c.partitions;
  shape.partition_names.clear();
  for (size_t p = 0; p < c.partitions.size(); ++p)
    shape.partition_names.push_back(c.partitions.size() == 1 ? "" : "p" + std::to_string(p));
  // w4a8-dyn's scale_bias shape follows the linear's name (q/k/v: [N, 1]; o_proj: [N, 16]).
  if (c.scheme == "w4a8-dyn") {
    if (c.partitions.size() == 3)
      shape.partition_names = {"q_proj", "k_proj", "v_proj"};
    else
      shape.prefix += ".o_proj";
  }
  shape.in_features = c.k;
  shape.has_bias = c.bias;
  auto m = reference::make_linear_method(shape, mc);
  std::normal_distribution<double> d(0.0, 0.05);
  // Act order: per-column activation magnitudes order the columns (the quantizer's proxy for
  // GPTQ's Hessian diagonal), the same for every fused partition, as their shared input gives.
  std::vector<double> channel_absmax;
  if (id.kind == SchemeKind::kPackedInt && id.int_weights.actorder) {
    std::uniform_real_distribution<double> u(0.1, 4.0);
    for (int64_t k = 0; k < c.k; ++k)
      channel_absmax.push_back(u(rng));
  }
  for (size_t p = 0; p < c.partitions.size(); ++p) {
    reference::QuantizeRequest r;
    r.weight = Matrix(c.partitions[p], c.k);
    for (double& w : r.weight.data)
      w = d(rng) + (c.symmetric ? 0.0 : 0.03);  // an offset range for the asymmetric cases
    r.weights = mc.weights;
    r.where = shape.shard_prefix(0, static_cast<int64_t>(p));
    r.input_activations = mc.input_activations;
    // Static input scales; an off-centre range for asymmetric inputs, so the zero point is not 0.
    const bool asym_inputs = mc.input_activations && !mc.input_activations->symmetric;
    r.activations = reference::ActivationStats{asym_inputs ? -1.5 : -4.0, 4.0, channel_absmax};
    r.group_size = effective_group_size(id);
    if (c.bias) {
      r.bias.emplace();
      for (int64_t i = 0; i < c.partitions[p]; ++i)
        r.bias->push_back(d(rng) * 10);  // stored as bf16 values
    }
    reference::TensorMap t = reference::quantize_linear(id, r);
    // quantize_linear fills in the scheme's default activations: a weight-only checkpoint has
    // no input scale (NVFP4A16).
    if (c.weight_only) t.erase("input_global_scale");
    m->load_all(t, static_cast<int64_t>(p));
  }
  m->process_weights_after_loading();
  return m;
}

// The GPU method's output for x [t, k] (bf16 values), poisoned first, with the activation codes
// and scales it fed its GEMM (activation-quantized schemes).
struct GpuRun {
  std::vector<double> y, codes, scales;
};
GpuRun run_gpu_full(const gpu::GpuLinearMethod& g, const std::vector<Bf16>& hx, int64_t t) {
  DeviceBuffer<Bf16> x(hx), y(static_cast<size_t>(t * g.out_features()));
  DeviceBuffer<uint8_t> ws(std::max<size_t>(g.workspace_bytes(t), 1));
  y.poison();
  ws.poison();
  g.apply(x.get(), y.get(), t, nullptr, ws.get());
  QPARITY_CUDA_CHECK(cudaDeviceSynchronize());
  GpuRun r;
  r.y = test::to_doubles(y.download());
  const auto c = g.activation_codes(ws.get(), t);
  if (c.values) {
    std::vector<uint8_t> q(static_cast<size_t>(t * g.in_features()));
    QPARITY_CUDA_CHECK(cudaMemcpy(q.data(), c.values, q.size(), cudaMemcpyDeviceToHost));
    const bool fp8 = c.kind == gpu::GpuLinearMethod::ActivationCodes::Kind::kFp8E4m3;
    for (uint8_t b : q)
      r.codes.push_back(fp8 ? codec::e4m3fn_to_double(b) : static_cast<int8_t>(b) - c.zero_point);
    std::vector<float> s(static_cast<size_t>(t * c.scale_cols));
    QPARITY_CUDA_CHECK(cudaMemcpy(s.data(), c.scales, s.size() * 4, cudaMemcpyDeviceToHost));
    r.scales.assign(s.begin(), s.end());
  }
  return r;
}

std::vector<double> run_gpu(const gpu::GpuLinearMethod& g, const std::vector<Bf16>& hx, int64_t t) {
  return run_gpu_full(g, hx, t).y;
}

std::vector<Case> cases() {
  return {
      {"w8a16-ch", true, {192}, 512},
      {"w8a16-ch", false, {192}, 512},
      {"w8a16-g64", true, {128}, 384},
      {"w8a16-g64", false, {96, 32, 32}, 256},
      {"w8a16-g128", false, {256}, 1024},
      {"w4a16-g32", true, {192}, 512},
      {"w4a16-g32", false, {192}, 512},
      {"w4a16-g32", true, {64, 32, 32}, 2048},
      // Points of compressed-tensors' integer weight space (its W4A16 / W4A16_ASYM / W8A16
      // presets among them): group 128 and 64, per channel, symmetric and with zero points.
      {"ct-w4a16-g128", true, {192}, 512},
      {"ct-w4a16-g128-asym", false, {64, 32, 32}, 1024},
      {"ct-w4a16-g64", true, {128}, 384},
      {"ct-w4a16-ch-asym", false, {192}, 512},
      {"ct-w8a16-g128", true, {256}, 1024},
      {"ct-w8a16-g128-asym", false, {96, 32, 32}, 256},
      {"ct-w8a16-ch", true, {96, 32, 32}, 256},
      {"w8a8-int8-dyn", true, {192}, 512, Dialect::kVllm},
      {"w8a8-int8-dyn", true, {96, 32, 32}, 256, Dialect::kSglang},
      // compressed-tensors' INT8 W8A8 space: static per-tensor inputs (vLLM's static and azp
      // kernels; SGLang ignores the scales and quantizes per token), per-tensor weights.
      {"ct-w8a8-int8-static", true, {192}, 512, Dialect::kVllm},
      {"ct-w8a8-int8-static-asym", true, {96, 32, 32}, 256, Dialect::kVllm},
      {"ct-w8a8-int8-wtensor-static-asym", true, {64, 32, 32}, 256, Dialect::kVllm},
      {"ct-w8a8-int8-static-asym", true, {128}, 256, Dialect::kSglang},
      {"ct-w8a8-int8-wtensor-dyn", true, {96, 32, 32}, 256, Dialect::kVllm},
      {"w4a8-dyn", true, {192}, 512, Dialect::kVllm},
      {"w4a8-dyn", true, {96, 32, 32}, 256, Dialect::kMsModelSlim},
      {"w8a8-static", true, {192}, 512, Dialect::kVllm},
      {"w8a8s", true, {96, 32, 32}, 256, Dialect::kSglang},
      {"fp8-tensor", true, {192}, 512, Dialect::kVllm},
      {"fp8-tensor", true, {128, 64, 64}, 256, Dialect::kSglang},
      {"fp8-channel", true, {192}, 512, Dialect::kVllm},
      {"fp8-channel", true, {96, 32, 32}, 256, Dialect::kSglang},
      {"fp8-block", true, {200}, 384, Dialect::kVllm},
      {"fp8-block", true, {256, 128}, 512, Dialect::kSglang},
      {"mxfp8", true, {192}, 512, Dialect::kVllm},
      {"mxfp8", true, {96, 32, 32}, 256, Dialect::kSglang},
      {"mxfp4", true, {192}, 512, Dialect::kVllm},
      {"mxfp4", true, {64, 32, 32}, 256, Dialect::kSglang},
      {"nvfp4", true, {192}, 512, Dialect::kVllm},
      {"nvfp4", true, {64, 32, 32}, 256, Dialect::kSglang},
      {"nvfp4", true, {96}, 256, Dialect::kCompressedTensors},
      {"nvfp4", true, {192}, 512, Dialect::kVllm, true},  // NVFP4A16
      {"nvfp4", true, {64, 32, 32}, 256, Dialect::kSglang, true},
      {"mxfp4", true, {192}, 512, Dialect::kVllm, true},  // MXFP4A16
      {"mxfp4", true, {64, 32, 32}, 256, Dialect::kIdeal, true},
      // Act order (actorder=group, GPTQ desc_act): codes in the stable g_idx sort's column
      // order, the inputs gathered into it before the GEMM.
      {"ct-w4a16-g128-actorder", true, {64, 32, 32}, 512},
      {"ct-w4a16-g32-asym-actorder", false, {192}, 256},
      {"ct-w8a16-g64-actorder", true, {128}, 384},
      // FP8 weights with bf16 inputs (vLLM's W8A16Fp8; MXFP8A16): per tensor (fused, each
      // partition's scale), per channel, 128 x 128 blocks ragged in N, and in K (320: the block
      // scales repeated every 64 columns).
      {"fp8-tensor-a16", true, {128, 64, 64}, 256},
      {"fp8-channel-a16", true, {192}, 512},
      {"fp8-block-a16", true, {200}, 384},
      {"fp8-block-a16", true, {256, 128}, 320},
      {"mxfp8a16", true, {96, 32, 32}, 256},
      // compressed-tensors' WnA8 / WnAFP8 (W4A8, W4AFP8): group-scaled integer weights with
      // per-token int8 / fp8 inputs; asymmetric weights and act order among them.
      {"ct-w4a8-g128", true, {192}, 512, Dialect::kVllm},
      {"ct-w4a8-g128", true, {64, 32, 32}, 256, Dialect::kSglang},
      {"ct-w4a8-g32-asym-actorder", false, {64, 32, 32}, 512, Dialect::kVllm},
      {"ct-w8a8-g64", true, {96}, 256, Dialect::kVllm},
      {"ct-w8a8-ch-asym", false, {128}, 384, Dialect::kSglang},
      {"ct-w4afp8-g128", true, {192}, 512, Dialect::kVllm},
      {"ct-w4afp8-g64-asym-actorder", false, {64, 32, 32}, 256, Dialect::kSglang},
      {"ct-w8afp8-g32", true, {128}, 256, Dialect::kVllm},
      // The tensor-core weight-only kernel's edges: rows not a multiple of its 32, k not a
      // multiple of its 64-column (int4) / 32-column (int8, e4m3) chunk.
      {"w4a16-g32", true, {40, 24, 24}, 96},
      {"ct-w4a16-g128-asym", false, {200}, 384},
      {"ct-w8a16-ch", true, {72}, 80},
      {"ct-w8a16-g128-asym", false, {50}, 640},
      {"fp8-channel-a16", true, {40}, 80},
  };
}

// The fp8 layers cuBLASLt runs (fp8_blas.h) from `runs_blas` tokens on.
const gpu::Fp8GemmRuntime* fp8_blas_runtime(const gpu::GpuLinearMethod& g) {
  const auto* f = dynamic_cast<const gpu::Fp8RuntimeMethod*>(&g);
  return f && f->runtime().blas ? &f->runtime() : nullptr;
}

// The bound for rows computed on Hopper's fp8 tensor cores. Their MMA does not round each
// addition to fp32: it keeps about 14 bits while it accumulates (DeepSeek-V3 report, section
// 3.3.2), until cuBLASLt promotes the partial sum to fp32. A row's error relative to its norm then
// grows with the cancellation sum |a w| / |sum a w|: measured on the H200 (this file's fp8 cases,
// ENGINE.md), random rows up to 9.4e-4 and rows of one sign (a constant input, the tie row) up to
// 2.1e-3, above kFlipBound's 9.8e-4. kFp8TensorCoreBound = 2^-8 is ~2x the worst; a wrong scale
// index or block layout stays far outside it (the planted faults give > 0.1). It no longer tells
// one extra bf16 rounding (RMS ~1.6e-3) from none: the CUDA-core rows keep kFlipBound for that.
constexpr double kFp8TensorCoreBound = 0x1p-8;
double bound_for(const gpu::GpuLinearMethod& g, int64_t t) {
  const auto* rt = fp8_blas_runtime(g);
  return rt && rt->runs_blas(t) ? kFp8TensorCoreBound : kFlipBound;
}

class GpuQuantLinears : public test::GpuTest {
 protected:
  std::mt19937_64 rng{test::test_seed()};
};

TEST_F(GpuQuantLinears, MatchTheReferenceApplyForEveryWeightOnlyScheme) {
  for (const Case& c : cases()) {
    SCOPED_TRACE(name_of(c));
    const auto host = reference_method(c, rng);
    const auto g = gpu::make_gpu_linear_method(*host);
    for (const int64_t t : {1, 3, 8, 17, 64}) {
      std::vector<Bf16> hx;
      const Matrix x = test::random_bf16(rng, t, c.k, 1.0, hx);
      const std::vector<double> want = test::round_bf16(host->apply(x).data);
      const std::vector<double> got = run_gpu(*g, hx, t);
      EXPECT_LE(test::rel_l2(got, want), bound_for(*g, t)) << "t = " << t;
    }
  }
}

TEST_F(GpuQuantLinears, AreDeterministicAndBatchInvariant) {
  for (const Case& c : cases()) {
    SCOPED_TRACE(name_of(c));
    const auto host = reference_method(c, rng);
    const auto g = gpu::make_gpu_linear_method(*host);
    const int64_t n = g->out_features();
    std::vector<Bf16> h64;
    test::random_bf16(rng, 64, c.k, 1.0, h64);
    EXPECT_EQ(run_gpu(*g, h64, 64), run_gpu(*g, h64, 64)) << "rerun";
    // cuBLASLt's fp8 layers promise reruns, not batch invariance (fp8_blas.h).
    if (fp8_blas_runtime(*g)) continue;
    const int64_t t = 64;
    const std::vector<Bf16>& hx = h64;
    const std::vector<double> batch = run_gpu(*g, hx, t);
    for (int64_t r : {int64_t{0}, int64_t{5}, t - 1}) {
      const std::vector<Bf16> row(hx.begin() + r * c.k, hx.begin() + (r + 1) * c.k);
      const std::vector<double> alone = run_gpu(*g, row, 1);
      EXPECT_TRUE(std::equal(alone.begin(), alone.end(), batch.begin() + r * n))
          << "token " << r << " alone differs from the batch of " << t;
    }
  }
}

// fp8 W8A8 on the fp8 tensor cores through cuBLASLt (fp8_blas.h; opt-in, GpuMethodOptions), token
// counts padded to a multiple of 4 (the per-row-scale layers' single tokens on the CUDA-core
// kernel): every token count against the reference's apply (per-tensor, per-channel and 128 x 128
// block scales, fused partitions with their own scales, a bias, 200 rows: a ragged row of blocks).
TEST_F(GpuQuantLinears, Fp8TensorCoresTakeEveryTokenCount) {
  for (const Case& c : {Case{"fp8-tensor", true, {192}, 512, Dialect::kVllm},
                        Case{"fp8-tensor", true, {128, 64, 64}, 256, Dialect::kSglang},
                        Case{"fp8-channel", true, {96, 32, 32}, 256, Dialect::kSglang, false, true},
                        Case{"fp8-block", true, {200}, 384, Dialect::kVllm},
                        Case{"fp8-block", true, {256, 128}, 512, Dialect::kSglang, false, true}}) {
    SCOPED_TRACE(name_of(c));
    const auto host = reference_method(c, rng);
    gpu::GpuMethodOptions tc;
    tc.fp8_tensor_cores = true;
    const auto g = gpu::make_gpu_linear_method(*host, tc);
    const auto* f = dynamic_cast<const gpu::Fp8RuntimeMethod*>(g.get());
    ASSERT_TRUE(f && f->runtime().blas) << "a dense fp8 layer must have cuBLASLt's operands";
    ASSERT_FALSE(fp8_blas_runtime(*gpu::make_gpu_linear_method(*host)))
        << "the fp8 tensor cores are opt-in";
    EXPECT_EQ(*f->runtime().blas, c.scheme == "fp8-block" ? gpu::Fp8BlasScales::kBlock128
                                                          : gpu::Fp8BlasScales::kRow128);
    // Per-row scales: per-128-column vectors below 256 (padded) tokens, outer vectors from it
    // (t = 253 is the first to pad to 256); both modes are judged below.
    if (c.scheme != "fp8-block") {
      EXPECT_EQ(f->runtime().blas_mode(252), gpu::Fp8BlasScales::kRow128);
      EXPECT_EQ(f->runtime().blas_mode(256), gpu::Fp8BlasScales::kOuterVector);
    }
    std::vector<Bf16> all;
    const Matrix xall = test::random_bf16(rng, 4096, c.k, 1.0, all);
    double worst = 0, worst_flips = 0;
    for (const int64_t t : {1, 3, 15, 16, 17, 19, 64, 127, 252, 253, 255, 1031, 4096}) {
      const std::vector<Bf16> hx(all.begin(), all.begin() + t * c.k);
      Matrix x(t, c.k);
      std::copy(xall.data.begin(), xall.data.begin() + t * c.k, x.data.begin());
      const std::vector<double> got = run_gpu(*g, hx, t);
      const std::vector<double> want = test::round_bf16(host->apply(x).data);
      const double e = test::rel_l2(got, want);
      worst = std::max(worst, e);
      // The fraction of outputs whose bf16 rounding differs from the reference's: what the
      // engine policies' flip model (tools/policies/make_policies.py) is built on.
      int64_t flips = 0;
      for (size_t i = 0; i < got.size(); ++i)
        flips += got[i] != want[i];
      worst_flips =
          std::max(worst_flips, static_cast<double>(flips) / static_cast<double>(got.size()));
      EXPECT_LE(e, bound_for(*g, t)) << "t = " << t;
      if (t == 1031) EXPECT_EQ(got, run_gpu(*g, hx, t)) << "rerun, t = " << t;
    }
    std::cout << "[ measured ] " << name_of(c) << ": worst rel_l2 " << worst << " (bound "
              << kFp8TensorCoreBound << "), worst fraction of bf16 flips " << worst_flips << "\n";
  }
}

TEST_F(GpuQuantLinears, TheGroupIndexFaultIsCaught) {
  const Case c{"w4a16-g32", true, {128}, 512};
  const auto host = reference_method(c, rng);
  gpu::GpuMethodOptions faulty;
  faulty.fault_group_off_by_one = true;
  const auto g = gpu::make_gpu_linear_method(*host, faulty);
  std::vector<Bf16> hx;
  const Matrix x = test::random_bf16(rng, 4, c.k, 1.0, hx);
  const double e = test::rel_l2(run_gpu(*g, hx, 4), test::round_bf16(host->apply(x).data));
  EXPECT_GT(e, 100 * kFlipBound) << "the planted fault must be far outside the bound";
}

// The tensor-core weight-only kernel (weight_only_mma.h) on every token count a forward gives it
// (primes, one and several token tiles, several waves of blocks, both tilings): each against the
// reference's apply, and a token's row bit-identical in every batch of one tiling (its row alone
// below kWeightOnlyMmaTiledFrom tokens, its row in the batch of 4096 from there on).
TEST_F(GpuQuantLinears, TensorCoreWeightOnlyTakesEveryTokenCount) {
  for (const Case& c :
       {Case{"ct-w4a16-g128-asym", false, {160}, 512},
        Case{"ct-w8a16-g128", true, {96, 32, 32}, 256}, Case{"fp8-block-a16", true, {136}, 384}}) {
    SCOPED_TRACE(name_of(c));
    const auto host = reference_method(c, rng);
    const auto g = gpu::make_gpu_linear_method(*host);
    if (const auto* w = dynamic_cast<const gpu::WeightOnlyIntMethod*>(g.get())) {
      ASSERT_TRUE(w->tensor_cores()) << "a dense layer must run on the tensor-core kernel";
    }
    std::vector<Bf16> all;
    const Matrix xall = test::random_bf16(rng, 4096, c.k, 1.0, all);
    const std::vector<double> want_all = test::round_bf16(host->apply(xall).data);
    const int64_t n = g->out_features();
    std::vector<double> alone;
    for (int64_t r : {0L, 1000L, 4095L}) {
      const std::vector<Bf16> row(all.begin() + r * c.k, all.begin() + (r + 1) * c.k);
      const std::vector<double> y = run_gpu(*g, row, 1);
      alone.insert(alone.end(), y.begin(), y.end());
    }
    const std::vector<double> full = run_gpu(*g, all, 4096);
    for (const int64_t t : {1, 2, 7, 9, 16, 31, 33, 63, 65, 127, 128, 257, 1031, 4096}) {
      const std::vector<Bf16> hx(all.begin(), all.begin() + t * c.k);
      const std::vector<double> got = run_gpu(*g, hx, t);
      const std::vector<double> want(want_all.begin(), want_all.begin() + t * n);
      EXPECT_LE(test::rel_l2(got, want), kFlipBound) << "t = " << t;
      int slot = 0;
      for (int64_t r : {0L, 1000L, 4095L}) {
        if (r < t && t < gpu::kWeightOnlyMmaTiledFrom) {
          EXPECT_TRUE(
              std::equal(got.begin() + r * n, got.begin() + (r + 1) * n, alone.begin() + slot * n))
              << "token " << r << " of " << t << " differs from its row alone";
        }
        if (r < t && t >= gpu::kWeightOnlyMmaTiledFrom) {
          EXPECT_TRUE(
              std::equal(got.begin() + r * n, got.begin() + (r + 1) * n, full.begin() + r * n))
              << "token " << r << " of " << t << " differs from its row in the batch of 4096";
        }
        ++slot;
      }
    }
  }
}

// Every code at every position of a tile chunk, through the kernel: x the identity, so that
// y[m, n] = (q[n, m] - zero) * scale exactly (a power-of-two scale keeps it a bf16 value).
TEST_F(GpuQuantLinears, TensorCoreWeightOnlyDecodesEveryCodeExactly) {
  struct Point {
    gpu::MmaCodes codes;
    int64_t n, k, group;
    bool zeros;
  };
  for (const Point& pt : {Point{gpu::MmaCodes::kInt4, 40, 1024, 64, false},
                          Point{gpu::MmaCodes::kInt4, 32, 1024, 32, true},
                          Point{gpu::MmaCodes::kInt8, 32, 8192, 32, true},
                          Point{gpu::MmaCodes::kInt8, 24, 8192, 256, false},
                          Point{gpu::MmaCodes::kE4m3, 32, 8192, 128, false}}) {
    SCOPED_TRACE(std::to_string(static_cast<int>(pt.codes)) + " group " + std::to_string(pt.group));
    const int64_t n = pt.n, k = pt.k, groups = k / pt.group;
    const int span = pt.codes == gpu::MmaCodes::kInt4 ? 16 : 256;
    const int64_t chunk = gpu::weight_only_mma_chunk(pt.codes);
    std::vector<int8_t> q(static_cast<size_t>(n * k));
    std::vector<double> scale(static_cast<size_t>(n * groups)), zero;
    for (int64_t r = 0; r < n; ++r)
      for (int64_t c = 0; c < k; ++c) {
        // Each position of a chunk meets every code over the chunks.
        int v = static_cast<int>((r * 5 + c + c / chunk) % span);
        if (pt.codes == gpu::MmaCodes::kE4m3 && (v & 0x7F) == 0x7F) v = 0;  // NaN codes
        q[static_cast<size_t>(r * k + c)] =
            static_cast<int8_t>(pt.codes == gpu::MmaCodes::kE4m3 ? v : v - span / 2);
      }
    for (int64_t r = 0; r < n; ++r)
      for (int64_t g = 0; g < groups; ++g) {
        scale[static_cast<size_t>(r * groups + g)] =
            std::ldexp(1.0, static_cast<int>((r + g) % 5) - 2);
        if (pt.zeros) zero.push_back(static_cast<double>((r * 3 + g * 7) % span - span / 2));
      }
    const gpu::MmaWeightOnDevice w = gpu::upload_mma_weight(
        gpu::pack_weight_only_mma(pt.codes, n, k, pt.group, q, scale, zero, true, "exhaustive"));
    std::vector<Bf16> hx(static_cast<size_t>(k * k), __float2bfloat16_rn(0.f));
    for (int64_t m = 0; m < k; ++m)
      hx[static_cast<size_t>(m * k + m)] = __float2bfloat16_rn(1.f);
    DeviceBuffer<Bf16> x(hx), y(static_cast<size_t>(k * n));
    for (const auto tiling : {gpu::MmaTiling::kSplitK, gpu::MmaTiling::kTiled}) {
      SCOPED_TRACE(tiling == gpu::MmaTiling::kTiled ? "tiled" : "split k");
      y.poison();
      gpu::WeightOnlyMmaParams params = w.params(x.get(), y.get(), k, nullptr);
      params.tiling = tiling;
      gpu::launch_weight_only_mma(params, nullptr);
      QPARITY_CUDA_CHECK(cudaDeviceSynchronize());
      const std::vector<double> got = test::to_doubles(y.download());
      int64_t wrong = 0;
      for (int64_t m = 0; m < k; ++m)
        for (int64_t r = 0; r < n; ++r) {
          const size_t at = static_cast<size_t>(r * k + m);
          const int64_t g = m / pt.group;
          const double value =
              pt.codes == gpu::MmaCodes::kE4m3
                  ? codec::e4m3fn_to_double(static_cast<uint8_t>(q[at]))
                  : static_cast<double>(q[at]) -
                        (pt.zeros ? zero[static_cast<size_t>(r * groups + g)] : 0.0);
          const double want = value * scale[static_cast<size_t>(r * groups + g)];
          if (got[static_cast<size_t>(m * n + r)] != want && ++wrong <= 5)
            ADD_FAILURE() << "row " << r << " column " << m << ": "
                          << got[static_cast<size_t>(m * n + r)] << " != " << want;
        }
      EXPECT_EQ(wrong, 0);
    }
  }
}

// Rows that stress the activation quantizer: exact ties (half-integers under a maximum of 127, so
// that x * (127 / amax) is x), an all-zero row, a row of one value, huge and tiny magnitudes, a
// negative maximum; codes and scales must equal the reference's for the dialect, bit for bit.
TEST_F(GpuQuantLinears, ActivationCodesMatchTheDialectBitForBit) {
  for (const std::string scheme :
       {"w8a8-int8-dyn", "ct-w8a8-int8-static", "ct-w8a8-int8-static-asym", "w4a8-dyn",
        "w8a8-static", "fp8-tensor", "fp8-channel", "fp8-block", "mxfp8", "mxfp4", "nvfp4",
        "ct-w4a8-g128", "ct-w4a8-g64-actorder", "ct-w4afp8-g128", "ct-w4afp8-g32-actorder"})
    for (const auto dialect : {Dialect::kVllm, Dialect::kSglang, Dialect::kCompressedTensors}) {
      // compressed-tensors' own activation rule: nvfp4's (its divisions, zero blocks 0.125).
      if (dialect == Dialect::kCompressedTensors && scheme != "nvfp4") continue;
      const Case c{scheme, true, {64}, 384, dialect};
      SCOPED_TRACE(name_of(c));
      const bool fp8 = scheme.rfind("fp8", 0) == 0 || scheme.rfind("mx", 0) == 0 ||
                       scheme == "nvfp4" || scheme.find("afp8") != std::string::npos;
      const auto host = reference_method(c, rng);
      const auto g = gpu::make_gpu_linear_method(*host);
      const int64_t t = 70;
      std::vector<double> xs(static_cast<size_t>(t * c.k));
      std::normal_distribution<double> d(0.0, 1.0);
      for (int64_t r = 0; r < t; ++r)
        for (int64_t k = 0; k < c.k; ++k) {
          double& v = xs[static_cast<size_t>(r * c.k + k)];
          switch (r % 7) {
            case 0:  // ties: int8 half-integers under a maximum of 127; fp8 integers under 448
              if (fp8)
                v = k == 0 ? 448.0 : 16.0 + static_cast<double>((k * 7) % 432);
              else
                v = k == 0 ? 127.0 : std::min(126.5, static_cast<double>((k * 37) % 255) - 126.5);
              break;
            case 1:
              v = 0.0;
              break;
            case 2:
              v = -3.25;
              break;
            case 3:
              v = d(rng) * 1e30;
              break;
            case 4:
              v = d(rng) * 1e-30;
              break;
            case 5:
              v = k == 5 ? -1000.0 : d(rng);
              break;
            default:
              v = d(rng) * 3;
          }
          v = test::bf16_value(test::to_bf16(v));
        }
      std::vector<Bf16> hx(xs.size());
      for (size_t i = 0; i < xs.size(); ++i)
        hx[i] = test::to_bf16(xs[i]);
      Matrix x(t, c.k);
      x.data = xs;
      const GpuRun got = run_gpu_full(*g, hx, t);
      const auto want = host->quantize_input(x);
      ASSERT_TRUE(want.has_value());
      ASSERT_EQ(got.codes.size(), xs.size());
      int64_t code_mismatches = 0, scale_mismatches = 0, ties = 0;
      for (int64_t r = 0; r < t; ++r) {
        for (int64_t k = 0; k < c.k; ++k) {
          code_mismatches += got.codes[static_cast<size_t>(r * c.k + k)] !=
                             static_cast<double>(want->code(r, k)) * want->lattice;
          ties += r % 7 == 0 && xs[static_cast<size_t>(r * c.k + k)] !=
                                    std::floor(xs[static_cast<size_t>(r * c.k + k)]);
        }
        const int64_t sc = want->scales.cols;
        ASSERT_EQ(got.scales.size(), static_cast<size_t>(t * sc));
        // The dumps hold fp32 scales: the reference's, rounded once (NVFP4's s / gs_in is an fp64
        // quotient; every other scheme's scale is an fp32 value already).
        for (int64_t j = 0; j < sc; ++j)
          scale_mismatches += got.scales[static_cast<size_t>(r * sc + j)] !=
                              static_cast<double>(static_cast<float>(want->scales(
                                  std::min(r / want->block_rows, want->scales.rows - 1), j)));
      }
      EXPECT_EQ(code_mismatches, 0);
      EXPECT_EQ(scale_mismatches, 0);
      if (scheme == "w8a8-int8-dyn" || scheme == "w4a8-dyn" || scheme == "ct-w4a8-g128") {
        EXPECT_GT(ties, 1000) << "the tie rows must hold ties";
      }
      // Outputs: the rows whose products stay finite in fp32 (not the 1e30 row).
      for (int64_t r = 0; r < t; ++r) {
        if (r % 7 == 3) continue;
        Matrix xr(1, c.k);
        std::copy(xs.begin() + r * c.k, xs.begin() + (r + 1) * c.k, xr.data.begin());
        const auto want_y = test::round_bf16(host->apply(xr).data);
        const std::vector<double> got_y(got.y.begin() + r * g->out_features(),
                                        got.y.begin() + (r + 1) * g->out_features());
        // All-zero rows, and sglang's tiny rows (below its 1e-10 maximum floor every code is 0):
        // an exact zero output.
        if (std::all_of(want_y.begin(), want_y.end(), [](double v) { return v == 0.0; })) {
          EXPECT_EQ(got_y, want_y) << "zero row " << r;
          continue;
        }
        EXPECT_LE(test::rel_l2(got_y, want_y), bound_for(*g, t)) << "row " << r;
      }
    }
}

TEST_F(GpuQuantLinears, Int8IsRefusedOutsideTheVllmAndSglangDialects) {
  const Case st{"ct-w8a8-int8-static-asym", true, {64}, 128, Dialect::kCompressedTensors};
  const auto host_st = reference_method(st, rng);
  EXPECT_THAT(test::error_of([&] { gpu::make_gpu_linear_method(*host_st); }),
              HasSubstr("run with --dialect vllm or --dialect sglang"));
  const Case c{"w8a8-int8-dyn", true, {64}, 128, Dialect::kIdeal};
  const auto host = reference_method(c, rng);
  EXPECT_THAT(test::error_of([&] { gpu::make_gpu_linear_method(*host); }),
              HasSubstr("run with --dialect vllm or --dialect sglang"));
  const Case w4{"w4a8-dyn", true, {64}, 128, Dialect::kIdeal};
  const auto host4 = reference_method(w4, rng);
  EXPECT_THAT(test::error_of([&] { gpu::make_gpu_linear_method(*host4); }),
              HasSubstr("npu_dynamic_quant rule"));
}

// The packed fp4 GEMM's nibble decoding, exhaustively, and its scale indexing: weight row r holds
// code (r + c) mod 16 at column c of a 32-column unit (every code at every position of all four
// 32-bit words), token j is one-hot at column j (doubled code 2 = value 1). The two 16-column
// halves carry different weight scales (e4m3 1.0 / 2.0; E8M0 one per 32: 1.0) and activation
// scales (1 / 0.5 per 16-group; per 32: 2): y[j][r] must be e2m1((r + j) mod 16) * s_b * s_a
// exactly, through the token-tiled kernel (32 tokens at once) and the one-token GEMV (each token
// alone).
TEST_F(GpuQuantLinears, PackedFp4GemmDecodesEveryCodeAtEveryPosition) {
  constexpr int64_t kN = 16, kK = 32, kM = 32;
  std::vector<uint8_t> nib(kN * kK);
  for (int64_t r = 0; r < kN; ++r)
    for (int64_t c = 0; c < kK; ++c)
      nib[static_cast<size_t>(r * kK + c)] = static_cast<uint8_t>((r + c) % 16);
  std::vector<uint8_t> packed(nib.size() / 2);
  for (size_t i = 0; i < packed.size(); ++i)
    packed[i] = static_cast<uint8_t>(nib[2 * i] | (nib[2 * i + 1] << 4));
  std::vector<int8_t> a(kM * kK, 0);
  for (int64_t j = 0; j < kM; ++j)
    a[static_cast<size_t>(j * kK + j)] = 2;
  for (const auto kind : {gpu::Fp4BlockScale::kE4m3Group16, gpu::Fp4BlockScale::kE8m0Group32}) {
    const bool e4m3 = kind == gpu::Fp4BlockScale::kE4m3Group16;
    const int64_t group = e4m3 ? 16 : 32, groups = kK / group;
    std::vector<uint8_t> sb(kN * groups);
    std::vector<float> sa(kM * groups);
    for (size_t i = 0; i < sb.size(); ++i)
      sb[i] = e4m3 ? (i % 2 ? 0x40 : 0x38) : 127;  // e4m3 2.0 / 1.0; E8M0 1.0
    for (size_t i = 0; i < sa.size(); ++i)
      sa[i] = e4m3 ? (i % 2 ? 0.5f : 1.f) : 2.f;
    const auto want = [&](int64_t j, int64_t r) {
      const double s_b = e4m3 ? (j / 16 ? 2.0 : 1.0) : 1.0, s_a = e4m3 ? (j / 16 ? 0.5 : 1.0) : 2.0;
      return codec::e2m1_to_double(static_cast<uint8_t>((r + j) % 16)) * s_b * s_a;
    };
    DeviceBuffer<uint8_t> b(packed), bs(sb);
    DeviceBuffer<int8_t> da(a);
    DeviceBuffer<float> as(sa);
    DeviceBuffer<Bf16> y(static_cast<size_t>(kM * kN));
    const auto run = [&](int64_t row, int64_t m) {
      gpu::Fp4GemmParams p;
      p.a = da.get() + row * kK, p.a_scales = as.get() + row * groups, p.a_group = group;
      p.b = b.get(), p.b_scales = bs.get(), p.b_scale = kind;
      p.y = y.get() + row * kN, p.m = m, p.n = kN, p.k = kK;
      gpu::launch_fp4_scaled_gemm(p, nullptr);
    };
    for (const bool alone : {false, true}) {
      y.poison();
      if (alone)
        for (int64_t j = 0; j < kM; ++j)
          run(j, 1);
      else
        run(0, kM);
      const std::vector<double> got = test::to_doubles(y.download());
      int64_t wrong = 0;
      for (int64_t j = 0; j < kM; ++j)
        for (int64_t r = 0; r < kN; ++r)
          wrong += got[static_cast<size_t>(j * kN + r)] != want(j, r);
      EXPECT_EQ(wrong, 0) << (e4m3 ? "e4m3 scales" : "E8M0 scales")
                          << (alone ? ", one token a launch (GEMV)" : ", 32 tokens (tiles)");
    }
  }
}

// The one-token GEMV walks several steps of a row (K > 2048 columns) and several rows a warp
// (N above the grid's warps: 8 blocks of 4 a multiprocessor, 4,224 on an H100): a shape that
// needs both, for nvfp4 and mxfp4, against the reference's apply.
TEST_F(GpuQuantLinears, PackedFp4GemvWalksRowsAndSteps) {
  for (const std::string scheme : {"nvfp4", "mxfp4"}) {
    const Case c{scheme, true, {4608}, 4608 + 512, Dialect::kVllm};
    SCOPED_TRACE(name_of(c));
    const auto host = reference_method(c, rng);
    const auto g = gpu::make_gpu_linear_method(*host);
    std::vector<Bf16> hx;
    const Matrix x = test::random_bf16(rng, 1, c.k, 1.0, hx);
    EXPECT_LE(test::rel_l2(run_gpu(*g, hx, 1), test::round_bf16(host->apply(x).data)), kFlipBound);
  }
}

// No device needed below.

TEST(GpuQuantLinearRefusals, UnsupportedSchemesAreRefusedByName) {
  std::mt19937_64 rng{test::test_seed()};
  // NVFP4 in the ideal dialect: its exact element decisions are not the GPU's fp32 rule.
  EXPECT_THAT(test::error_of([&] {
                gpu::make_gpu_linear_method(
                    *reference_method({"nvfp4", true, {64}, 128, Dialect::kIdeal}, rng));
              }),
              AllOf(HasSubstr("model.layers.0.self_attn"), HasSubstr("nvfp4"),
                    HasSubstr("run with --dialect vllm")));
  // WnA8 in the ideal dialect: its fp64 per-token scales are not the GPU's fp32 rule.
  for (const char* scheme : {"ct-w4a8-g128", "ct-w4afp8-g128"})
    EXPECT_THAT(test::error_of([&] {
                  gpu::make_gpu_linear_method(
                      *reference_method({scheme, true, {64}, 256, Dialect::kIdeal}, rng));
                }),
                AllOf(HasSubstr("model.layers.0.self_attn"), HasSubstr(scheme),
                      HasSubstr("in dialect ideal"), HasSubstr("run with --dialect vllm")));
  // compressed-tensors keeps each fused partition's own global scales: one alpha cannot serve.
  EXPECT_THAT(test::error_of([&] {
                gpu::make_gpu_linear_method(*reference_method(
                    {"nvfp4", true, {64, 32, 32}, 128, Dialect::kCompressedTensors}, rng));
              }),
              AllOf(HasSubstr("model.layers.0.self_attn"),
                    HasSubstr("partitions keep different weight global scales")));
}

TEST(GpuQuantLinearRefusals, TheLauncherNamesEveryViolatedShapeRule) {
  gpu::WeightOnlyGemmParams p;
  alignas(16) static uint8_t buf[64];
  p.x = reinterpret_cast<const Bf16*>(buf);
  p.w = buf;
  p.scales = buf;
  p.y = reinterpret_cast<Bf16*>(buf);
  p.m = 1, p.n = 8, p.k = 48, p.group = 48, p.bits = 4;
  EXPECT_THAT(test::error_of([&] { gpu::launch_weight_only_gemm(p, nullptr); }),
              HasSubstr("k 48 must be a multiple of 32 for int4"));
  p.k = 128, p.group = 48, p.bits = 8;
  EXPECT_THAT(test::error_of([&] { gpu::launch_weight_only_gemm(p, nullptr); }),
              HasSubstr("group 48 must be a multiple of 16"));
  p.group = 64, p.bits = 2;
  EXPECT_THAT(test::error_of([&] { gpu::launch_weight_only_gemm(p, nullptr); }),
              HasSubstr("bits must be 4 or 8"));
  p.bits = 8;
  p.x = reinterpret_cast<const Bf16*>(buf + 2);
  EXPECT_THAT(test::error_of([&] { gpu::launch_weight_only_gemm(p, nullptr); }),
              HasSubstr("16-byte aligned"));
  p.x = reinterpret_cast<const Bf16*>(buf);
  p.fp8_codes = true;
  p.bits = 4;
  EXPECT_THAT(test::error_of([&] { gpu::launch_weight_only_gemm(p, nullptr); }),
              HasSubstr("e4m3 codes are 8 bits wide and take no zero points"));
  p.bits = 8;
  p.zeros_i8 = reinterpret_cast<const int8_t*>(buf);
  EXPECT_THAT(test::error_of([&] { gpu::launch_weight_only_gemm(p, nullptr); }),
              HasSubstr("e4m3 codes are 8 bits wide and take no zero points"));

  gpu::WeightOnlyMmaParams t;
  t.x = reinterpret_cast<const Bf16*>(buf);
  t.w = buf;
  t.scales = buf;
  t.y = reinterpret_cast<Bf16*>(buf);
  t.m = 1, t.n = 8, t.k = 40, t.group = 40;
  EXPECT_THAT(test::error_of([&] { gpu::launch_weight_only_mma(t, nullptr); }),
              AllOf(HasSubstr("weight_only_mma"), HasSubstr("k 40 must be a multiple of 16")));
  t.k = 96, t.group = 24;
  EXPECT_THAT(test::error_of([&] { gpu::launch_weight_only_mma(t, nullptr); }),
              HasSubstr("group 24 must be a multiple of 16 and divide k 96"));
  t.group = 32, t.codes = gpu::MmaCodes::kE4m3;
  t.zeros = reinterpret_cast<const int8_t*>(buf);
  EXPECT_THAT(test::error_of([&] { gpu::launch_weight_only_mma(t, nullptr); }),
              HasSubstr("e4m3 codes take no zero points"));
  t.zeros = nullptr;
  t.w = buf + 8;
  EXPECT_THAT(test::error_of([&] { gpu::launch_weight_only_mma(t, nullptr); }),
              HasSubstr("16-byte aligned"));

  gpu::IntGroupGemmParams q;
  q.a = buf;
  q.a_scales = reinterpret_cast<const float*>(buf);
  q.w = buf;
  q.scales = buf;
  q.y = reinterpret_cast<Bf16*>(buf);
  q.m = 1, q.n = 8, q.k = 48, q.group = 48, q.bits = 4;
  EXPECT_THAT(test::error_of([&] { gpu::launch_int_group_gemm(q, nullptr); }),
              AllOf(HasSubstr("int_group_gemm"), HasSubstr("k 48 must be a multiple of 32")));
  q.k = 128, q.group = 48, q.bits = 8;
  EXPECT_THAT(test::error_of([&] { gpu::launch_int_group_gemm(q, nullptr); }),
              HasSubstr("group 48 must be a multiple of 16 and divide k 128"));
  q.group = 64, q.bits = 3;
  EXPECT_THAT(test::error_of([&] { gpu::launch_int_group_gemm(q, nullptr); }),
              HasSubstr("bits must be 4 or 8"));
  q.bits = 8;
  q.a = buf + 4;
  EXPECT_THAT(test::error_of([&] { gpu::launch_int_group_gemm(q, nullptr); }),
              HasSubstr("16-byte aligned"));
  q.a = buf;
  q.a_scales = nullptr;
  EXPECT_THAT(test::error_of([&] { gpu::launch_int_group_gemm(q, nullptr); }),
              HasSubstr("a, a_scales, w, scales and y are required"));
}

}  // namespace
}  // namespace qparity
