// The floor under batch-1 decode: what a chain of dependent kernels costs per kernel on this
// device when nothing else runs and no weights stream, at the decode step's grid sizes.
//
// A Qwen3-0.6B decode step is ~142 kernels in a dependent chain; bench_engine's timeline shows
// each costing 2.5-10 us after its predecessor, far above its bytes. This bench separates the
// parts of that cost. Each variant is a CUDA graph of --chain kernels, each depending on the one
// before, replayed --reps times; reported in us per kernel and as a ratio against the baseline
// measured in the same run: empty kernels launched in plain stream order.
//   empty           nothing but the boundary (plain stream order: the baseline)
//   empty+pdl       the same with programmatic dependent launch (pdl.h): early start, wait
//   relay           every block reads the whole 4 KiB vector the previous kernel wrote (one
//                   dependent round trip through L2), reduces it and writes its slice: the shape
//                   of a skinny GEMM's X staging with no weights
//   relay+pdl       the same with programmatic dependent launch
//   relay+merge+pdl the same, then the attention's cross-block merge: an acq_rel count, and the
//                   last block reloads every block's slice and writes the result (finish_chunk)
//   relay+w+pdl /S relay+pdl with 128 bytes a thread of independent loads issued before the wait
//                   (a skinny GEMM's weights, 4 MiB at 128 blocks), one set for the chain (S = 1,
//                   L2-resident) or one per pair of kernels (streamed from DRAM)
//   relay+w+smem /S the same kernel allowed 160 KiB of dynamic shared memory and launched with
//                   4 KiB, as the skinny GEMM is: whether the carveout the driver picks matters
//   code NK x1 / x4 relay+pdl, then about N KiB of straight-line integer code after the release,
//                   one copy of the kernel for the whole chain (its code stays in the SM's
//                   instruction caches) or four copies in turn (fetched again each time, as a
//                   decode layer's five kernels are): x4 - x1 is what fetching the code costs
// and then the engine's own skinny GEMM (skinny_gemm.h, batch 1, PDL) in chains shaped like the
// 0.6B layer's linears, against the relay floor:
//   attn pair       o_proj (N 1024, K 2048) then its transpose (N 2048, K 1024), alternating
//   mlp pair        gate_up with SiLU-and-mul (N 6144, K 1024) then down (N 1024, K 3072)
// each with one weight set for the whole chain (L2-resident after the first pass) and with a
// distinct set per pair of kernels (streamed from DRAM, as in a forward).
// Output: a table on stdout. Numbers hold for the device they ran on; compare rows of one run.
#include <cuda_runtime.h>

#include <CLI/CLI.hpp>
#include <cstdio>
#include <cuda/atomic>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "gpu_engine/cuda_check.h"
#include "gpu_engine/device_info.h"
#include "gpu_engine/kernels/pdl.h"
#include "gpu_engine/kernels/random_init.h"
#include "gpu_engine/kernels/skinny_gemm.h"

namespace {

using namespace qparity;

constexpr int kThreads = 256;
constexpr int kVector = 1024;  // floats: the 4 KiB a decode kernel reads from its predecessor

__global__ void empty_kernel() {
  gpu::pdl_launch_dependents();
  gpu::pdl_wait();
}

// Every block: the whole input vector (a float4 a thread), summed; then its slice of the output
// (the vector split over the blocks), so the next kernel depends on every block of this one.
__device__ __forceinline__ float relay_body(const float* in, float* out) {
  __shared__ float warp_sum[kThreads / 32];
  const float4 v = reinterpret_cast<const float4*>(in)[threadIdx.x];
  float s = v.x + v.y + v.z + v.w;
  for (int o = 16; o > 0; o >>= 1)
    s += __shfl_xor_sync(0xffffffffu, s, o);
  if (threadIdx.x % 32 == 0) warp_sum[threadIdx.x / 32] = s;
  __syncthreads();
  float total = 0.f;
  for (int w = 0; w < kThreads / 32; ++w)
    total += warp_sum[w];
  const int per_block = (kVector + gridDim.x - 1) / gridDim.x;
  const int e = blockIdx.x * per_block + threadIdx.x;
  if (threadIdx.x < per_block && e < kVector) out[e] = total * 1e-3f + static_cast<float>(e);
  return total;
}

__global__ void relay_kernel(const float* in, float* out) {
  gpu::pdl_launch_dependents();
  gpu::pdl_wait();
  relay_body(in, out);
}

// relay, with kWeightChunks 16-byte "weight" loads a thread issued before the wait (as the skinny
// GEMM does) and folded into the output after it: 128 bytes a thread, 4 MiB over 128 blocks.
constexpr int kWeightChunks = 8;
__global__ void relay_weights_kernel(const float* in, float* out, const uint4* w) {
  uint4 r[kWeightChunks];
  const uint4* mine = w + (static_cast<size_t>(blockIdx.x) * kThreads + threadIdx.x);
#pragma unroll
  for (int j = 0; j < kWeightChunks; ++j)
    r[j] = __ldg(mine + static_cast<size_t>(j) * gridDim.x * kThreads);
  gpu::pdl_launch_dependents();
  gpu::pdl_wait();
  const float total = relay_body(in, out);
  unsigned x = 0;
#pragma unroll
  for (int j = 0; j < kWeightChunks; ++j)
    x ^= r[j].x ^ r[j].y ^ r[j].z ^ r[j].w;
  if (x == 0x9e3779b9u && total == 0.f) out[0] = 1.f;  // keeps the loads; practically never true
}

// relay, then finish_chunk's merge: count the block on `done` (acq_rel), and the last block to
// count reloads every block's slice (__ldcg, through L2) and writes their sum to out[0].
__global__ void relay_merge_kernel(const float* in, float* out, unsigned* done, float* merged) {
  gpu::pdl_launch_dependents();
  gpu::pdl_wait();
  relay_body(in, out);
  __shared__ bool last;
  __syncthreads();
  if (threadIdx.x == 0) {
    cuda::atomic_ref<unsigned, cuda::thread_scope_device> count(*done);
    last = count.fetch_add(1u, cuda::memory_order_acq_rel) == gridDim.x - 1;
    if (last) count.store(0u, cuda::memory_order_relaxed);
  }
  __syncthreads();
  if (!last) return;
  const float4 v = __ldcg(reinterpret_cast<const float4*>(out) + threadIdx.x);
  float s = v.x + v.y + v.z + v.w;
  for (int o = 16; o > 0; o >>= 1)
    s += __shfl_xor_sync(0xffffffffu, s, o);
  if (threadIdx.x % 32 == 0) atomicAdd(merged, s);
}

// relay, then kInstr / 2 steps of x = (x ^ a) + b on eight independent registers, fully unrolled
// (constants that differ per step, so the compiler cannot fold them: about kInstr instructions,
// 16 bytes of code each). kId makes distinct copies of the code. A chain cycling over four copies
// cannot find the code still in the SM's instruction caches, as a decode layer's five different
// kernels cannot; a chain of one copy can. The difference is what fetching a kernel's code costs
// after its release.
template <int kId, int kInstr>
__global__ void relay_code_kernel(const float* in, float* out) {
  gpu::pdl_launch_dependents();
  gpu::pdl_wait();
  const float total = relay_body(in, out);
  unsigned r[8];
#pragma unroll
  for (int j = 0; j < 8; ++j)
    r[j] = threadIdx.x + j + kId;
#pragma unroll
  for (int i = 0; i < kInstr / 16; ++i)
#pragma unroll
    for (int j = 0; j < 8; ++j)
      r[j] = (r[j] ^ (0x9e3779b9u * (i * 8 + j + 1) + kId)) + (0x85ebca6bu * (i * 8 + j + 7));
  unsigned x = 0;
#pragma unroll
  for (int j = 0; j < 8; ++j)
    x ^= r[j];
  if (x == 0x9e3779b9u && total == 0.f) out[0] = 1.f;  // keeps the work; practically never true
}

struct Options {
  int chain = 280;
  int reps = 50;
  std::vector<int> grids = {128, 384};
};

// One variant: a graph of o.chain launches of `launch(i)`, replayed o.reps times after a warm-up;
// us per kernel.
double us_per_kernel(const Options& o, cudaStream_t s, const std::function<void(int)>& launch) {
  cudaGraph_t graph;
  cudaGraphExec_t exec;
  QPARITY_CUDA_CHECK(cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal));
  for (int i = 0; i < o.chain; ++i)
    launch(i);
  QPARITY_CUDA_CHECK(cudaStreamEndCapture(s, &graph));
  QPARITY_CUDA_CHECK(cudaGraphInstantiate(&exec, graph, 0));
  for (int w = 0; w < 3; ++w)
    QPARITY_CUDA_CHECK(cudaGraphLaunch(exec, s));
  cudaEvent_t a, b;
  QPARITY_CUDA_CHECK(cudaEventCreate(&a));
  QPARITY_CUDA_CHECK(cudaEventCreate(&b));
  QPARITY_CUDA_CHECK(cudaEventRecord(a, s));
  for (int r = 0; r < o.reps; ++r)
    QPARITY_CUDA_CHECK(cudaGraphLaunch(exec, s));
  QPARITY_CUDA_CHECK(cudaEventRecord(b, s));
  QPARITY_CUDA_CHECK(cudaEventSynchronize(b));
  float ms = 0.f;
  QPARITY_CUDA_CHECK(cudaEventElapsedTime(&ms, a, b));
  QPARITY_CUDA_CHECK(cudaEventDestroy(a));
  QPARITY_CUDA_CHECK(cudaEventDestroy(b));
  QPARITY_CUDA_CHECK(cudaGraphExecDestroy(exec));
  QPARITY_CUDA_CHECK(cudaGraphDestroy(graph));
  return 1e3 * ms / (static_cast<double>(o.reps) * o.chain);
}

int run(const Options& o) {
  std::string why_not;
  const std::optional<gpu::DeviceInfo> dev = gpu::query_device(0, &why_not);
  if (!dev) {
    std::fprintf(stderr, "bench_dependent_chain: no CUDA device: %s\n", why_not.c_str());
    return 1;
  }
  std::printf("device %s %s (%d SMs): %d dependent kernels a graph, %d replays\n",
              dev->name.c_str(), dev->sm().c_str(), dev->multiprocessors, o.chain, o.reps);
  cudaStream_t s;
  QPARITY_CUDA_CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  float *buf, *merged;
  unsigned* done;
  QPARITY_CUDA_CHECK(cudaMalloc(&buf, 2 * kVector * sizeof(float)));
  QPARITY_CUDA_CHECK(cudaMemset(buf, 0, 2 * kVector * sizeof(float)));
  QPARITY_CUDA_CHECK(cudaMalloc(&merged, sizeof(float)));
  QPARITY_CUDA_CHECK(cudaMalloc(&done, sizeof(unsigned)));
  QPARITY_CUDA_CHECK(cudaMemset(done, 0, sizeof(unsigned)));
  const auto in = [&](int i) { return buf + (i % 2) * kVector; };
  const auto out = [&](int i) { return buf + ((i + 1) % 2) * kVector; };
  const int layers = (o.chain + 1) / 2;  // weight sets when each pair of kernels has its own
  std::printf("  %-18s %6s %14s %18s\n", "variant", "blocks", "us / kernel", "x baseline");
  for (const int blocks : o.grids) {
    const dim3 grid(static_cast<unsigned>(blocks)), block(kThreads);
    const double base = us_per_kernel(o, s, [&](int) { empty_kernel<<<grid, block, 0, s>>>(); });
    const auto row = [&](const char* name, double us) {
      std::printf("  %-18s %6d %14.3f %18.2f\n", name, blocks, us, us / base);
    };
    row("empty", base);
    row("empty+pdl", us_per_kernel(o, s, [&](int) {
          gpu::launch_pdl("empty", empty_kernel, grid, block, 0, s);
        }));
    row("relay",
        us_per_kernel(o, s, [&](int i) { relay_kernel<<<grid, block, 0, s>>>(in(i), out(i)); }));
    row("relay+pdl", us_per_kernel(o, s, [&](int i) {
          gpu::launch_pdl("relay", relay_kernel, grid, block, 0, s, in(i), out(i));
        }));
    row("relay+merge+pdl", us_per_kernel(o, s, [&](int i) {
          gpu::launch_pdl("relay_merge", relay_merge_kernel, grid, block, 0, s, in(i), out(i), done,
                          merged);
        }));
    for (const int sets : {1, layers}) {
      const size_t per = static_cast<size_t>(blocks) * kThreads * kWeightChunks;
      uint4* w;
      QPARITY_CUDA_CHECK(cudaMalloc(&w, per * sets * sizeof(uint4)));
      QPARITY_CUDA_CHECK(cudaMemset(w, 1, per * sets * sizeof(uint4)));
      // Then the same kernel allowed 160 KiB of dynamic shared memory (the skinny GEMM's
      // attribute) and launched with 4 KiB: does the carveout the driver then picks matter?
      for (const size_t smem : {size_t{0}, size_t{4096}}) {
        QPARITY_CUDA_CHECK(cudaFuncSetAttribute(relay_weights_kernel,
                                                cudaFuncAttributeMaxDynamicSharedMemorySize,
                                                smem ? 160 * 1024 : 48 * 1024));
        const std::string name =
            std::string(smem ? "relay+w+smem /" : "relay+w+pdl /") + std::to_string(sets);
        row(name.c_str(), us_per_kernel(o, s, [&](int i) {
              gpu::launch_pdl("relay_weights", relay_weights_kernel, grid, block, smem, s, in(i),
                              out(i), w + (i / 2 % sets) * per);
            }));
      }
      QPARITY_CUDA_CHECK(cudaFree(w));
    }
  }
  {
    const dim3 grid(128), block(kThreads);
    // One row a copy count: kernel i of the chain is copy i % n of the code.
    const auto code_rows = [&]<int kInstr>(const char* size) {
      using Kernel = void (*)(const float*, float*);
      const Kernel copies[4] = {relay_code_kernel<0, kInstr>, relay_code_kernel<1, kInstr>,
                                relay_code_kernel<2, kInstr>, relay_code_kernel<3, kInstr>};
      for (const int n : {1, 4}) {
        const double us = us_per_kernel(o, s, [&](int i) {
          gpu::launch_pdl("relay_code", copies[i % n], grid, block, 0, s, in(i), out(i));
        });
        const std::string name = std::string("code ") + size + " x" + std::to_string(n);
        std::printf("  %-18s %6d %14.3f %18s\n", name.c_str(), 128, us, "-");
      }
    };
    code_rows.template operator()<512>("8K");
    code_rows.template operator()<2048>("32K");
    code_rows.template operator()<8192>("128K");
  }
  // The skinny GEMM chains: (n, k, silu) of the pair's two kernels; activations alternate
  // between two buffers of the widest width.
  struct Linear {
    int64_t n, k;
    bool silu;
  };
  const auto pair_chain = [&](const char* name, Linear a, Linear b, int sets) {
    const int64_t wa = a.n * a.k, wb = b.n * b.k, width = 8192;
    __nv_bfloat16 *w, *act;
    QPARITY_CUDA_CHECK(cudaMalloc(&w, static_cast<size_t>(sets * (wa + wb)) * 2));
    QPARITY_CUDA_CHECK(cudaMalloc(&act, static_cast<size_t>(2 * width) * 2));
    gpu::launch_fill_random_bf16(w, sets * (wa + wb), 0.f, 0.02f, 11, s);
    gpu::launch_fill_random_bf16(act, 2 * width, 0.f, 1.f, 12, s);
    const double us = us_per_kernel(o, s, [&](int i) {
      const Linear& l = i % 2 ? b : a;
      gpu::SkinnyGemmParams p;
      p.x = act + (i % 2) * width, p.y = act + ((i + 1) % 2) * width;
      p.w = w + (i / 2 % sets) * (wa + wb) + (i % 2) * wa;
      p.m = 1, p.n = l.n, p.k = l.k, p.silu_mul = l.silu;
      gpu::launch_skinny_gemm(p, s);
    });
    std::printf("  %-18s %6s %14.3f %18s  (%d weight set%s, %.1f MB each)\n", name, "-", us, "-",
                sets, sets > 1 ? "s" : "", 2e-6 * static_cast<double>(wa + wb));
    QPARITY_CUDA_CHECK(cudaFree(w));
    QPARITY_CUDA_CHECK(cudaFree(act));
  };
  const Linear o_proj{1024, 2048, false}, o_proj_t{2048, 1024, false};
  const Linear gate_up{6144, 1024, true}, down{1024, 3072, false};
  pair_chain("attn pair", o_proj, o_proj_t, 1);
  pair_chain("attn pair", o_proj, o_proj_t, layers);
  pair_chain("mlp pair", gate_up, down, 1);
  pair_chain("mlp pair", gate_up, down, layers);
  QPARITY_CUDA_CHECK(cudaFree(buf));
  QPARITY_CUDA_CHECK(cudaFree(merged));
  QPARITY_CUDA_CHECK(cudaFree(done));
  QPARITY_CUDA_CHECK(cudaStreamDestroy(s));
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  Options o;
  CLI::App app{"Per-kernel cost of a chain of dependent kernels (the floor under decode)"};
  app.add_option("--chain", o.chain, "dependent kernels a graph")->check(CLI::Range(2, 100000));
  app.add_option("--reps", o.reps, "graph replays timed")->check(CLI::Range(1, 100000));
  app.add_option("--grids", o.grids, "blocks a kernel (256 threads each)")
      ->check(CLI::Range(1, 65535));
  CLI11_PARSE(app, argc, argv);
  try {
    return run(o);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "bench_dependent_chain: %s\n", e.what());
    return 1;
  }
}
