// Weight-only quantized linears against bf16 cuBLASLt on the same shapes, in one process on one
// device: the Llama-3-8B decoder linears (qkv, o_proj, gate_up, down) at M = 1, 16, 64, 256 and
// 4096 tokens. The tensor-core kernel (weight_only_mma.h) at every M: w4a16-g32 (bf16 scales),
// w4a16-g128-asym (int8 zeros), w8a16-ch, fp8-channel-a16 and fp8-block-a16 (fp32 scales). The
// CUDA-core kernel (weight_only_gemm.h, what the experts of a stack and msModelSlim's F32 offsets
// still run) at M <= 64: w8a16-ch (int8, fp32 scale per row, symmetric), w8a16-g128 (int8, fp32
// scale and offset per 128 columns), w4a16-g32. Each time is the mean of 200 launches captured
// in one CUDA graph, cycling through copies of the weight (256 MiB in all) so every launch reads
// its weight from DRAM, as a forward does. Printed per row: microseconds, GB/s of the bytes the
// kernel must read (codes, scales, zeros), and the speedup over cuBLASLt bf16 (issue 53's
// targets: w4a16 >= 2.5x at M = 1-16, >= 1.5x at M = 64, >= 0.95x at M >= 256; w8a16 and fp8
// >= 1.8x at M = 1-16, >= 1.3x at M = 64).
// fp8 W8A8 (fp8-channel, fp8-block): the CUDA-core GEMM and cuBLASLt's scaled fp8 tensor-core
// GEMM, and their activation quantizer (issue 53's targets: >= 1.8x at M = 1-16, >= 1.3x at
// M = 64, >= 1.5x at M = 4096; tools/device/bench_int_mm.py times torch._scaled_mm beside).
// Emulated W4A4 (Hopper has no FP4 MMA): nvfp4 (packed e2m1, e4m3 scale per 16, static input
// global scale) and mxfp4 (packed e2m1, E8M0 per 32), each as its GPU method runs it: the
// activation quantizer (codes, doubled codes, scales) then the packed fp4 GEMM, and the GEMM alone
// (issue 26's target: >= 3x cuBLASLt bf16 at M = 1).
#include <cuda_runtime_api.h>

#include <algorithm>
#include <iostream>
#include <string>
#include <vector>

#include "gpu_engine/device_buffer.h"
#include "gpu_engine/device_info.h"
#include "gpu_engine/gpu_model.h"
#include "gpu_engine/kernels/fp4_gemm.h"
#include "gpu_engine/kernels/fp8_blas.h"
#include "gpu_engine/kernels/fp8_gemm.h"
#include "gpu_engine/kernels/gemm.h"
#include "gpu_engine/kernels/int8_gemm.h"
#include "gpu_engine/kernels/random_init.h"
#include "gpu_engine/kernels/weight_only_gemm.h"
#include "gpu_engine/kernels/weight_only_mma.h"

using namespace qparity;

namespace {

struct Variant {
  const char* name;
  int bits;
  int64_t group;  // 0: per channel
  bool scale_bf16, zeros;
};

double bytes_of(const Variant& v, int64_t n, int64_t k) {
  const int64_t g = v.group ? v.group : k;
  const double groups = static_cast<double>(n) * static_cast<double>(k / g);
  return static_cast<double>(n) * static_cast<double>(k) * v.bits / 8 +
         groups * (v.scale_bf16 ? 2 : 4) + (v.zeros ? groups * 4 : 0);
}

struct MmaVariant {
  const char* name;
  gpu::MmaCodes codes;
  int64_t group;  // 0: per channel
  bool scale_bf16, zeros;
};

}  // namespace

int main() {
  std::string why;
  const auto dev = gpu::query_device(0, &why);
  if (!dev) {
    std::cerr << "bench_quant_linears: no GPU: " << why << "\n";
    return 1;
  }
  std::cout << "device: " << dev->name << " " << dev->sm() << "\n";
  struct Shape {
    const char* what;
    int64_t n, k;
  };
  const std::vector<Shape> shapes = {
      {"qkv", 6144, 4096}, {"o_proj", 4096, 4096}, {"gate_up", 28672, 4096}, {"down", 4096, 14336}};
  const std::vector<Variant> variants = {{"w8a16-ch", 8, 0, false, false},
                                         {"w8a16-g128", 8, 128, false, true},
                                         {"w4a16-g32", 4, 32, true, false}};
  const std::vector<MmaVariant> mma_variants = {
      {"w4a16-g32", gpu::MmaCodes::kInt4, 32, true, false},
      {"w4a16-g128-asym", gpu::MmaCodes::kInt4, 128, true, true},
      {"w8a16-ch", gpu::MmaCodes::kInt8, 0, true, false},
      {"fp8-channel-a16", gpu::MmaCodes::kE4m3, 0, false, false},
      {"fp8-block-a16", gpu::MmaCodes::kE4m3, 128, false, false}};
  gpu::BlasLtGemm gemm;
  cudaStream_t s;
  QPARITY_CUDA_CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  cudaEvent_t e0, e1;
  QPARITY_CUDA_CHECK(cudaEventCreate(&e0));
  QPARITY_CUDA_CHECK(cudaEventCreate(&e1));
  constexpr size_t kCycle = size_t{256} << 20;
  // launch(copy index) 200 times in one graph; microseconds per launch.
  const auto time = [&](auto&& launch) {
    for (int i = 0; i < 3; ++i)
      launch(i);
    const int reps = 200;
    cudaGraph_t graph;
    cudaGraphExec_t exec;
    QPARITY_CUDA_CHECK(cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal));
    for (int i = 0; i < reps; ++i)
      launch(i);
    QPARITY_CUDA_CHECK(cudaStreamEndCapture(s, &graph));
    QPARITY_CUDA_CHECK(cudaGraphInstantiate(&exec, graph, 0));
    QPARITY_CUDA_CHECK(cudaGraphLaunch(exec, s));
    QPARITY_CUDA_CHECK(cudaEventRecord(e0, s));
    QPARITY_CUDA_CHECK(cudaGraphLaunch(exec, s));
    QPARITY_CUDA_CHECK(cudaEventRecord(e1, s));
    QPARITY_CUDA_CHECK(cudaEventSynchronize(e1));
    float ms = 0;
    QPARITY_CUDA_CHECK(cudaEventElapsedTime(&ms, e0, e1));
    cudaGraphExecDestroy(exec);
    cudaGraphDestroy(graph);
    return ms * 1e3 / reps;
  };
  for (const Shape& sh : shapes) {
    const size_t wsize = static_cast<size_t>(sh.n * sh.k);
    const int copies = static_cast<int>(std::max<size_t>(1, kCycle / (wsize * 2)));
    gpu::Bf16Buffer w(wsize * static_cast<size_t>(copies)), x(static_cast<size_t>(4096 * sh.k)),
        y(static_cast<size_t>(4096 * sh.n));
    gpu::launch_fill_random_bf16(w.get(), static_cast<int64_t>(w.size()), 0.f, 0.02f, 7, s);
    gpu::launch_fill_random_bf16(x.get(), static_cast<int64_t>(x.size()), 0.f, 1.f, 8, s);
    for (const int64_t m : {1, 16, 64, 256, 4096}) {
      const double us_blas = time([&](int i) {
        gemm.nt(x.get(), w.get() + static_cast<size_t>(i % copies) * wsize, y.get(),
                gpu::GemmOut::kBf16, m, sh.n, sh.k, s);
      });
      std::cout << "llama3-8b " << sh.what << " M=" << m << " N=" << sh.n << " K=" << sh.k
                << ": cuBLASLt bf16 " << us_blas << " us ("
                << static_cast<double>(wsize) * 2 / us_blas / 1e3 << " GB/s)\n";
      // The tensor-core weight-only kernel (weight_only_mma.h) on its tile layout: random code
      // bytes are random codes in any layout; scales a constant bf16 / fp32 pattern, zeros 1.
      for (const MmaVariant& v : mma_variants) {
        const int64_t g = v.group ? v.group : sh.k;
        const size_t code_bytes =
            static_cast<size_t>(gpu::weight_only_mma_code_bytes(v.codes, sh.n, sh.k));
        const size_t groups = static_cast<size_t>(gpu::weight_only_mma_scale_count(sh.n, sh.k, g));
        const size_t per = code_bytes + groups * (v.scale_bf16 ? 2 : 4) + (v.zeros ? groups : 0);
        const int vcopies = static_cast<int>(std::max<size_t>(1, kCycle / per));
        gpu::DeviceBuffer<uint8_t> codes(code_bytes * static_cast<size_t>(vcopies));
        gpu::DeviceBuffer<float> scales(groups * static_cast<size_t>(vcopies));
        gpu::DeviceBuffer<int8_t> zeros(v.zeros ? groups * static_cast<size_t>(vcopies) : 0);
        gpu::launch_fill_random_bf16(reinterpret_cast<__nv_bfloat16*>(codes.get()),
                                     static_cast<int64_t>(codes.size() / 2), 0.f, 1.f, 9, s);
        QPARITY_CUDA_CHECK(cudaMemsetAsync(scales.get(), 0x3c, scales.bytes(), s));
        if (v.zeros) QPARITY_CUDA_CHECK(cudaMemsetAsync(zeros.get(), 0x01, zeros.bytes(), s));
        // Around the switch between the tilings both are timed; elsewhere the one m picks.
        std::vector<gpu::MmaTiling> tilings = {gpu::MmaTiling::kAuto};
        if (m >= 64 && m <= 256) tilings = {gpu::MmaTiling::kSplitK, gpu::MmaTiling::kTiled};
        for (const gpu::MmaTiling tiling : tilings) {
          const double us = time([&](int i) {
            const size_t c = static_cast<size_t>(i % vcopies);
            gpu::WeightOnlyMmaParams p;
            p.x = x.get();
            p.w = codes.get() + c * code_bytes;
            p.scales = v.scale_bf16
                           ? static_cast<const void*>(
                                 reinterpret_cast<const __nv_bfloat16*>(scales.get() + c * groups))
                           : static_cast<const void*>(scales.get() + c * groups);
            p.scale_bf16 = v.scale_bf16;
            p.zeros = v.zeros ? zeros.get() + c * groups : nullptr;
            p.y = y.get();
            p.m = m, p.n = sh.n, p.k = sh.k, p.group = g, p.codes = v.codes;
            p.tiling = tiling;
            gpu::launch_weight_only_mma(p, s);
          });
          const char* how = tiling == gpu::MmaTiling::kAuto     ? "tensor cores"
                            : tiling == gpu::MmaTiling::kSplitK ? "tensor cores, split-k tiling"
                                                                : "tensor cores, prefill tiling";
          std::cout << "  " << v.name << " (" << how << "): " << us << " us ("
                    << static_cast<double>(per) / us / 1e3
                    << " GB/s of packed bytes), speedup over cuBLASLt bf16 " << us_blas / us
                    << "x\n";
        }
      }
      // fp8 W8A8, fp8-channel (per-token x per-channel scales) and fp8-block (1 x 128 x
      // 128 x 128): the CUDA-core GEMM (fp8_gemm.h) up to M = 256, cuBLASLt's scaled fp8 GEMM
      // (fp8_blas.h) at M's multiples of 4 (M = 1 timed as 4 tokens), each the GEMM alone; then
      // the activation quantizer alone, as the method runs it at that M.
      for (const bool block : {false, true}) {
        const char* name = block ? "fp8-block" : "fp8-channel";
        const int64_t groups = (sh.k + 127) / 128;
        const size_t grid = static_cast<size_t>(block ? (sh.n + 127) / 128 * groups : sh.n);
        const size_t blas_grid = static_cast<size_t>(
            block ? (sh.n + 127) / 128 * gpu::fp8_blas_block_cols(sh.k) : groups * sh.n);
        const size_t per = wsize + grid * 4;
        const int vcopies = static_cast<int>(std::max<size_t>(1, kCycle / per));
        gpu::DeviceBuffer<uint8_t> codes(wsize * static_cast<size_t>(vcopies)),
            a8(static_cast<size_t>(4096 * sh.k));
        gpu::DeviceBuffer<float> sb(grid), sb_blas(blas_grid),
            sa(static_cast<size_t>(4096 * groups));
        // Random bf16 bits as e4m3 bytes (any byte is a code); scales a constant finite pattern.
        gpu::launch_fill_random_bf16(reinterpret_cast<__nv_bfloat16*>(codes.get()),
                                     static_cast<int64_t>(codes.size() / 2), 0.f, 1.f, 12, s);
        gpu::launch_fill_random_bf16(reinterpret_cast<__nv_bfloat16*>(a8.get()),
                                     static_cast<int64_t>(a8.size() / 2), 0.f, 1.f, 13, s);
        QPARITY_CUDA_CHECK(cudaMemsetAsync(sb.get(), 0x3c, sb.bytes(), s));
        QPARITY_CUDA_CHECK(cudaMemsetAsync(sb_blas.get(), 0x3c, sb_blas.bytes(), s));
        QPARITY_CUDA_CHECK(cudaMemsetAsync(sa.get(), 0x3c, sa.bytes(), s));
        const auto report = [&](const char* how, int64_t tokens, double us) {
          std::cout << "  " << name << " (" << how << (tokens != m ? ", as M=4" : "") << "): " << us
                    << " us (" << static_cast<double>(per) / us / 1e3
                    << " GB/s of weight bytes), speedup over cuBLASLt bf16 " << us_blas / us
                    << "x\n";
        };
        if (m <= 256) {
          const double us = time([&](int i) {
            gpu::Fp8GemmParams p;
            p.a = a8.get(), p.a_scales = sa.get(), p.a_group = block ? 128 : sh.k;
            p.b = codes.get() + static_cast<size_t>(i % vcopies) * wsize, p.b_scales = sb.get();
            p.b_block_rows = block ? 128 : 1, p.b_block_cols = block ? 128 : sh.k;
            p.y = y.get(), p.m = m, p.n = sh.n, p.k = sh.k;
            gpu::launch_fp8_scaled_gemm(p, s);
          });
          report("CUDA cores", m, us);
        }
        // Per-row scales in both of cuBLASLt's forms (the method runs the per-128-column one).
        std::vector<gpu::Fp8BlasScales> modes = {gpu::Fp8BlasScales::kBlock128};
        if (!block) modes = {gpu::Fp8BlasScales::kOuterVector, gpu::Fp8BlasScales::kRow128};
        for (const gpu::Fp8BlasScales mode : modes) {
          gpu::Fp8BlasParams bp;
          bp.a = a8.get(), bp.a_scales = sa.get(), bp.b = codes.get(), bp.b_scales = sb_blas.get();
          bp.y = y.get(), bp.m = std::max<int64_t>(4, m / 4 * 4), bp.n = sh.n, bp.k = sh.k;
          bp.scales = mode;
          const char* how = mode == gpu::Fp8BlasScales::kOuterVector
                                ? "fp8 tensor cores, cuBLASLt outer-vector scales"
                            : mode == gpu::Fp8BlasScales::kRow128
                                ? "fp8 tensor cores, cuBLASLt per-128-column scales"
                                : "fp8 tensor cores, cuBLASLt block scales";
          if (!gpu::fp8_blas_gemm(bp, s)) {
            std::cout << "  " << name << " (" << how << "): no algorithm for M=" << bp.m << "\n";
            continue;
          }
          const double us = time([&](int i) {
            gpu::Fp8BlasParams q = bp;
            q.b = codes.get() + static_cast<size_t>(i % vcopies) * wsize;
            gpu::fp8_blas_gemm(q, s);
          });
          report(how, bp.m, us);
        }
        gpu::QuantizeFp8Params qp;
        qp.x = x.get(), qp.q = a8.get(), qp.scales = sa.get(), qp.m = m, qp.k = sh.k;
        qp.mode = block ? gpu::Fp8ActMode::kDynamicGroup : gpu::Fp8ActMode::kDynamicToken;
        qp.group = 128;
        gpu::DeviceBuffer<float> by_group(static_cast<size_t>(4096 * groups));
        qp.scales_group_major = by_group.get(), qp.group_major_rows = (m + 3) / 4 * 4;
        if (!block) qp.group_major_repeat = groups;
        const double us_q = time([&](int) { gpu::launch_quantize_fp8(qp, s); });
        std::cout << "  " << name << " activation quantizer: " << us_q << " us\n";
      }
      if (m > 64) continue;  // the CUDA-core and fp4 kernels below are decode paths
      for (const Variant& v : variants) {
        const int64_t g = v.group ? v.group : sh.k;
        const size_t code_bytes = wsize * static_cast<size_t>(v.bits) / 8;
        const size_t groups = static_cast<size_t>(sh.n * (sh.k / g));
        const size_t per = code_bytes + groups * 8;
        const int vcopies = static_cast<int>(std::max<size_t>(1, kCycle / per));
        gpu::DeviceBuffer<uint8_t> codes(code_bytes * static_cast<size_t>(vcopies));
        gpu::DeviceBuffer<float> scales(groups * static_cast<size_t>(vcopies)),
            zeros(v.zeros ? groups * static_cast<size_t>(vcopies) : 0);
        // Arbitrary codes; scales and zeros a constant byte pattern (finite values).
        gpu::launch_fill_random_bf16(reinterpret_cast<__nv_bfloat16*>(codes.get()),
                                     static_cast<int64_t>(codes.size() / 2), 0.f, 1.f, 9, s);
        QPARITY_CUDA_CHECK(cudaMemsetAsync(scales.get(), 0x3c, scales.bytes(), s));
        if (v.zeros) QPARITY_CUDA_CHECK(cudaMemsetAsync(zeros.get(), 0x3c, zeros.bytes(), s));
        const double us = time([&](int i) {
          const size_t c = static_cast<size_t>(i % vcopies);
          gpu::WeightOnlyGemmParams p;
          p.x = x.get();
          p.w = codes.get() + c * code_bytes;
          // bf16 scales: the same buffer read as bf16 (half the bytes of each fp32 copy used).
          p.scales = v.scale_bf16 ? static_cast<const void*>(reinterpret_cast<const __nv_bfloat16*>(
                                        scales.get() + c * groups))
                                  : static_cast<const void*>(scales.get() + c * groups);
          p.scale_bf16 = v.scale_bf16;
          p.zeros_f32 = v.zeros ? zeros.get() + c * groups : nullptr;
          p.y = y.get();
          p.m = m, p.n = sh.n, p.k = sh.k, p.group = g, p.bits = v.bits;
          gpu::launch_weight_only_gemm(p, s);
        });
        const double bytes = bytes_of(v, sh.n, sh.k);
        std::cout << "  " << v.name << ": " << us << " us (" << bytes / us / 1e3
                  << " GB/s of packed bytes), speedup over cuBLASLt bf16 " << us_blas / us << "x\n";
      }
      for (const bool nv : {true, false}) {
        const int64_t g = nv ? 16 : 32;
        const size_t code_bytes = wsize / 2, scale_bytes = static_cast<size_t>(sh.n * sh.k / g);
        const size_t per = code_bytes + scale_bytes;
        const int vcopies = static_cast<int>(std::max<size_t>(1, kCycle / per));
        gpu::DeviceBuffer<uint8_t> codes(code_bytes * static_cast<size_t>(vcopies)),
            sb(scale_bytes * static_cast<size_t>(vcopies)), q(static_cast<size_t>(m * sh.k));
        gpu::DeviceBuffer<int8_t> q2(static_cast<size_t>(m * sh.k));
        gpu::DeviceBuffer<float> sa(static_cast<size_t>(m * sh.k / g)),
            rep(static_cast<size_t>(m * sh.k / g));
        gpu::launch_fill_random_bf16(reinterpret_cast<__nv_bfloat16*>(codes.get()),
                                     static_cast<int64_t>(codes.size() / 2), 0.f, 1.f, 11, s);
        // Scale bytes: e4m3 0.5 (0x30) or E8M0 2^-8 (119): finite either way.
        QPARITY_CUDA_CHECK(cudaMemsetAsync(sb.get(), nv ? 0x30 : 119, sb.bytes(), s));
        gpu::QuantizeFp8Params qp;
        qp.x = x.get(), qp.q = q.get(), qp.q_doubled = q2.get(), qp.scales = sa.get();
        qp.m = m, qp.k = sh.k, qp.mode = gpu::Fp8ActMode::kDynamicGroup, qp.group = g;
        if (nv) {
          qp.nvfp4_global = 672.f;  // 2688 / 4: a calibrated amax of 4
          qp.reported_scales = rep.get();
        } else {
          qp.mx_bump = qp.mx_e2m1 = true;
        }
        const auto gemm_params = [&](int i) {
          const size_t c = static_cast<size_t>(i % vcopies);
          gpu::Fp4GemmParams p;
          p.a = q2.get(), p.a_scales = sa.get(), p.a_group = g;
          p.b = codes.get() + c * code_bytes, p.b_scales = sb.get() + c * scale_bytes;
          p.b_scale = nv ? gpu::Fp4BlockScale::kE4m3Group16 : gpu::Fp4BlockScale::kE8m0Group32;
          p.alpha = nv ? 1.f / (672.f * 672.f) : 1.f;
          p.y = y.get(), p.m = m, p.n = sh.n, p.k = sh.k;
          return p;
        };
        gpu::launch_quantize_fp8(qp, s);
        const double us_gemm = time([&](int i) { gpu::launch_fp4_scaled_gemm(gemm_params(i), s); });
        const double us = time([&](int i) {
          gpu::launch_quantize_fp8(qp, s);
          gpu::launch_fp4_scaled_gemm(gemm_params(i), s);
        });
        std::cout << "  " << (nv ? "nvfp4" : "mxfp4") << " (emulated W4A4): quantize + GEMM " << us
                  << " us, " << us_blas / us << "x cuBLASLt bf16; GEMM alone " << us_gemm << " us ("
                  << static_cast<double>(per) / us_gemm / 1e3 << " GB/s of packed bytes), "
                  << us_blas / us_gemm << "x\n";
      }
    }
  }
  // Large M: the int8 GEMM of w8a8 (cuBLASLt int8 -> int32, then the fp32 epilogue kernel) and
  // bf16 cuBLASLt on M = 4096 (activation quantization not included; tools/device/
  // bench_int_mm.py times torch._int_mm on the same shapes in the same device call).
  for (const Shape& sh : shapes) {
    const int64_t m = 4096;
    gpu::Bf16Buffer w(static_cast<size_t>(sh.n * sh.k)), x(static_cast<size_t>(m * sh.k)),
        y(static_cast<size_t>(m * sh.n));
    gpu::DeviceBuffer<int8_t> a8(static_cast<size_t>(m * sh.k)),
        b8(static_cast<size_t>(sh.n * sh.k));
    gpu::DeviceBuffer<float> sa(static_cast<size_t>(m)), sb(static_cast<size_t>(sh.n));
    gpu::DeviceBuffer<int32_t> acc(static_cast<size_t>(m * sh.n));
    gpu::launch_fill_random_bf16(w.get(), static_cast<int64_t>(w.size()), 0.f, 0.02f, 7, s);
    gpu::launch_fill_random_bf16(x.get(), static_cast<int64_t>(x.size()), 0.f, 1.f, 8, s);
    gpu::launch_fill_random_bf16(reinterpret_cast<__nv_bfloat16*>(a8.get()),
                                 static_cast<int64_t>(a8.size() / 2), 0.f, 1.f, 9, s);
    gpu::launch_fill_random_bf16(reinterpret_cast<__nv_bfloat16*>(b8.get()),
                                 static_cast<int64_t>(b8.size() / 2), 0.f, 1.f, 10, s);
    QPARITY_CUDA_CHECK(cudaMemsetAsync(sa.get(), 0x3c, sa.bytes(), s));
    QPARITY_CUDA_CHECK(cudaMemsetAsync(sb.get(), 0x3c, sb.bytes(), s));
    const double us_blas = time(
        [&](int) { gemm.nt(x.get(), w.get(), y.get(), gpu::GemmOut::kBf16, m, sh.n, sh.k, s); });
    const double us_i8 = time([&](int) {
      gpu::Int8GemmParams p;
      p.a = a8.get(), p.a_scales = sa.get(), p.b = b8.get(), p.b_scales = sb.get();
      p.y = y.get(), p.m = m, p.n = sh.n, p.k = sh.k;
      gpu::int8_scaled_gemm(p, acc.get(), s);
    });
    const double flops =
        2.0 * static_cast<double>(m) * static_cast<double>(sh.n) * static_cast<double>(sh.k);
    std::cout << "llama3-8b " << sh.what << " M=" << m << " N=" << sh.n << " K=" << sh.k
              << ": cuBLASLt bf16 " << us_blas << " us (" << flops / us_blas / 1e6
              << " TFLOP/s); w8a8 int8 GEMM + epilogue " << us_i8 << " us (" << flops / us_i8 / 1e6
              << " TOP/s), " << us_blas / us_i8 << "x bf16\n";
  }
  cudaEventDestroy(e0);
  cudaEventDestroy(e1);
  cudaStreamDestroy(s);
  return 0;
}
