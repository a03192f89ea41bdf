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
// distinct set per pair of kernels (streamed from DRAM, as in a forward), through the generic
// kernel and through the single-pass one ("1-pass", skinny_gemm_single_pass.h). Last, the
// bisection that found the single pass: a minimal GEMM of the attn pair's shapes
// (mini_gemm_kernel) with the generic kernel's features added back one at a time, and the
// per-block stage stamps of the minimal GEMM and of both engine kernels in that chain.
// Output: a table on stdout. Numbers hold for the device they ran on; compare rows of one run.
#include <cuda_runtime.h>

#include <CLI/CLI.hpp>
#include <algorithm>
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

// A minimal batch-1 GEMM (y[n] = W[n, k] x[k], bf16, fp32 sums) with the skinny GEMM's mapping
// and nothing else: a warp per row pair, kKsplit warps along K (their sums meet in shared
// memory), four 16-byte chunks a row per lane, every weight load issued before the wait. It is
// the bisection's other end: what the engine's kernel costs beyond this is its own features,
// which kFlags add back one at a time:
//   kStaged      X staged in shared memory by the whole block (one round trip, then a barrier),
//                as the engine's kernel does, instead of each lane loading its chunks from L2
//   kDynSmem     the same through dynamic shared memory (k * 2 bytes, the kernel allowed 160 KiB)
//   kNoAllocate  weights loaded with ld.global.nc.L1::no_allocate (the engine's load_stream)
//   kTwoBarriers a second barrier after the slices' sums (the engine reuses slice_sum)
//   kScalarWrite the pair written as two 2-byte stores (the engine's write_pair)
//   kRuntime     the engine's loops: groups strided over the grid, chunks in unrolled steps with
//                a bound check each, 64-bit indices
// Thread 0 of each block stamps %globaltimer at entry, the release, its dot products done (X and
// its weights arrived), the sums reduced and the exit, into
// stamps[(chain index * gridDim.x + block) * kMiniStamps + s] when stamps is not null.
constexpr int kMiniChunks = 4, kMiniStamps = 5;
constexpr unsigned kStaged = 1, kDynSmem = 2, kNoAllocate = 4, kTwoBarriers = 8, kScalarWrite = 16,
                   kRuntime = 32;
template <unsigned kFlags>
__device__ __forceinline__ uint4 mini_load(const uint4* p) {
  if constexpr ((kFlags & kNoAllocate) != 0) {
    uint4 v;
    asm("ld.global.nc.L1::no_allocate.v4.u32 {%0, %1, %2, %3}, [%4];"
        : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
        : "l"(p));
    return v;
  } else {
    return __ldg(p);
  }
}
template <int kKsplit, unsigned kFlags>
__global__ void __launch_bounds__(kThreads)
    mini_gemm_kernel(const __nv_bfloat16* x, __nv_bfloat16* y, const __nv_bfloat16* w, int k,
                     unsigned long long* stamps, int index) {
  extern __shared__ uint4 dyn[];
  unsigned long long st[kMiniStamps];
  const auto stamp = [&](int i) {
    if (stamps) st[i] = gpu::probe_now();
  };
  stamp(0);
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, slice = warp % kKsplit;
  constexpr int per_block = kThreads / 32 / kKsplit;
  const int64_t chunks = k / 8, step = 32 * kKsplit;
  const int64_t pairs = static_cast<int64_t>(gridDim.x) * per_block;
  const auto rows = [&](int64_t pair, const uint4*& w0, const uint4*& w1) {
    w0 = reinterpret_cast<const uint4*>(w + 2 * pair * k);
    w1 = reinterpret_cast<const uint4*>(w + (2 * pair + 1) * k);
  };
  uint4 a[kMiniChunks], b[kMiniChunks];
  const auto chunk = [&](int u) { return slice * 32 + lane + 32 * kKsplit * u; };
  const int64_t first = static_cast<int64_t>(blockIdx.x) * per_block + warp / kKsplit;
  {
    const uint4 *w0, *w1;
    rows(first, w0, w1);
#pragma unroll
    for (int u = 0; u < kMiniChunks; ++u) {
      const int64_t c = slice * 32 + lane + step * u;
      if (!(kFlags & kRuntime) || c < chunks) {
        a[u] = mini_load<kFlags>(w0 + c);
        b[u] = mini_load<kFlags>(w1 + c);
      }
    }
  }
  gpu::pdl_launch_dependents();
  gpu::pdl_wait();
  stamp(1);
  __shared__ uint4 xs_static[512];  // K <= 4096
  uint4* xs = (kFlags & kDynSmem) ? dyn : xs_static;
  if constexpr ((kFlags & (kStaged | kDynSmem)) != 0) {
    const uint4* xg = reinterpret_cast<const uint4*>(x);
    uint4 t0 = threadIdx.x < k / 8 ? xg[threadIdx.x] : make_uint4(0, 0, 0, 0);
    uint4 t1 = threadIdx.x + kThreads < k / 8 ? xg[threadIdx.x + kThreads] : make_uint4(0, 0, 0, 0);
    if (threadIdx.x < k / 8) xs[threadIdx.x] = t0;
    if (threadIdx.x + kThreads < k / 8) xs[threadIdx.x + kThreads] = t1;
    __syncthreads();
  }
  const auto x_chunk = [&](int64_t c) {
    if constexpr ((kFlags & (kStaged | kDynSmem)) != 0)
      return xs[c];
    else
      return reinterpret_cast<const uint4*>(x)[c];
  };
  __shared__ float2 slice_sum[kThreads / 32];
  for (int64_t g = first; g < pairs; g += static_cast<int64_t>(gridDim.x) * per_block) {
    float acc0 = 0.f, acc1 = 0.f;
    const auto dots = [&](const uint4& xv, const uint4& av, const uint4& bv) {
      const __nv_bfloat162* hx = reinterpret_cast<const __nv_bfloat162*>(&xv);
      const __nv_bfloat162* ha = reinterpret_cast<const __nv_bfloat162*>(&av);
      const __nv_bfloat162* hb = reinterpret_cast<const __nv_bfloat162*>(&bv);
#pragma unroll
      for (int j = 0; j < 4; ++j) {
        const float2 fx = __bfloat1622float2(hx[j]), fa = __bfloat1622float2(ha[j]),
                     fb = __bfloat1622float2(hb[j]);
        acc0 = fmaf(fa.x, fx.x, fmaf(fa.y, fx.y, acc0));
        acc1 = fmaf(fb.x, fx.x, fmaf(fb.y, fx.y, acc1));
      }
    };
    if constexpr ((kFlags & kRuntime) != 0) {
      bool preloaded = g == first;
      const uint4 *w0, *w1;
      rows(g, w0, w1);
      for (int64_t c0 = slice * 32 + lane; c0 < chunks; c0 += step * kMiniChunks) {
        if (!preloaded)
#pragma unroll
          for (int u = 0; u < kMiniChunks; ++u)
            if (c0 + step * u < chunks) {
              a[u] = mini_load<kFlags>(w0 + c0 + step * u);
              b[u] = mini_load<kFlags>(w1 + c0 + step * u);
            }
        preloaded = false;
#pragma unroll
        for (int u = 0; u < kMiniChunks; ++u)
          if (c0 + step * u < chunks) dots(x_chunk(c0 + step * u), a[u], b[u]);
      }
    } else {
#pragma unroll
      for (int u = 0; u < kMiniChunks; ++u)
        dots(x_chunk(chunk(u)), a[u], b[u]);
    }
    stamp(2);
    for (int o = 16; o > 0; o >>= 1) {
      acc0 += __shfl_xor_sync(0xffffffffu, acc0, o);
      acc1 += __shfl_xor_sync(0xffffffffu, acc1, o);
    }
    if constexpr (kKsplit > 1) {
      if (lane == 0) slice_sum[warp] = make_float2(acc0, acc1);
      __syncthreads();
      if (slice == 0 && lane == 0)
        for (int q = 1; q < kKsplit; ++q)
          acc0 += slice_sum[warp + q].x, acc1 += slice_sum[warp + q].y;
      if constexpr ((kFlags & kTwoBarriers) != 0) __syncthreads();
    }
    stamp(3);
    if (slice == 0 && lane == 0) {
      if constexpr ((kFlags & kScalarWrite) != 0) {
        y[2 * g] = __float2bfloat16_rn(acc0);
        y[2 * g + 1] = __float2bfloat16_rn(acc1);
      } else {
        reinterpret_cast<__nv_bfloat162*>(y)[g] = __floats2bfloat162_rn(acc0, acc1);
      }
    }
    if constexpr ((kFlags & kRuntime) == 0) break;
  }
  stamp(4);
  if (stamps && threadIdx.x == 0)
    for (int i = 0; i < kMiniStamps; ++i)
      stamps[(static_cast<size_t>(index) * gridDim.x + blockIdx.x) * kMiniStamps + i] = st[i];
}

struct Options {
  int chain = 280;
  int reps = 50;
  std::vector<int> grids = {128, 384};
};

// The chain: o.chain launches of `launch(i)` captured as one CUDA graph, instantiated and replayed
// three times (warm-up); the graph goes with the object.
struct ChainGraph {
  cudaGraph_t graph = nullptr;
  cudaGraphExec_t exec = nullptr;
  ChainGraph(const Options& o, cudaStream_t s, const std::function<void(int)>& launch) {
    QPARITY_CUDA_CHECK(cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal));
    for (int i = 0; i < o.chain; ++i)
      launch(i);
    QPARITY_CUDA_CHECK(cudaStreamEndCapture(s, &graph));
    QPARITY_CUDA_CHECK(cudaGraphInstantiate(&exec, graph, 0));
    for (int w = 0; w < 3; ++w)
      QPARITY_CUDA_CHECK(cudaGraphLaunch(exec, s));
  }
  ChainGraph(const ChainGraph&) = delete;
  ChainGraph& operator=(const ChainGraph&) = delete;
  ~ChainGraph() {
    cudaGraphExecDestroy(exec);
    cudaGraphDestroy(graph);
  }
};

// One variant: the chain replayed o.reps times; us per kernel.
double us_per_kernel(const Options& o, cudaStream_t s, const std::function<void(int)>& launch) {
  const ChainGraph g(o, s, launch);
  cudaEvent_t a, b;
  QPARITY_CUDA_CHECK(cudaEventCreate(&a));
  QPARITY_CUDA_CHECK(cudaEventCreate(&b));
  QPARITY_CUDA_CHECK(cudaEventRecord(a, s));
  for (int r = 0; r < o.reps; ++r)
    QPARITY_CUDA_CHECK(cudaGraphLaunch(g.exec, s));
  QPARITY_CUDA_CHECK(cudaEventRecord(b, s));
  QPARITY_CUDA_CHECK(cudaEventSynchronize(b));
  float ms = 0.f;
  QPARITY_CUDA_CHECK(cudaEventElapsedTime(&ms, a, b));
  QPARITY_CUDA_CHECK(cudaEventDestroy(a));
  QPARITY_CUDA_CHECK(cudaEventDestroy(b));
  return 1e3 * ms / (static_cast<double>(o.reps) * o.chain);
}

// The chain after its warm-up, `reset` run, then one replay whose stamps are read.
void run_stamped(const Options& o, cudaStream_t s, const std::function<void(int)>& launch,
                 const std::function<void()>& reset) {
  const ChainGraph g(o, s, launch);
  QPARITY_CUDA_CHECK(cudaStreamSynchronize(s));
  reset();
  QPARITY_CUDA_CHECK(cudaGraphLaunch(g.exec, s));
  QPARITY_CUDA_CHECK(cudaStreamSynchronize(s));
}

// Median and 90th percentile of v (us), as "median / p90".
std::string median_p90(std::vector<double> v) {
  if (v.empty()) return "-";
  std::sort(v.begin(), v.end());
  char buf[64];
  std::snprintf(buf, sizeof buf, "%.2f / %.2f", v[v.size() / 2], v[v.size() * 9 / 10]);
  return buf;
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
  const auto pair_chain = [&](const char* name, Linear a, Linear b, int sets, bool single_pass) {
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
      p.m = 1, p.n = l.n, p.k = l.k, p.silu_mul = l.silu, p.single_pass = single_pass;
      gpu::launch_skinny_gemm(p, s);
    });
    std::printf("  %-18s %6s %14.3f %18s  (%d weight set%s, %.1f MB each)\n", name, "-", us, "-",
                sets, sets > 1 ? "s" : "", 2e-6 * static_cast<double>(wa + wb));
    QPARITY_CUDA_CHECK(cudaFree(w));
    QPARITY_CUDA_CHECK(cudaFree(act));
  };
  const Linear o_proj{1024, 2048, false}, o_proj_t{2048, 1024, false};
  const Linear gate_up{6144, 1024, true}, down{1024, 3072, false};
  for (const bool single_pass : {false, true}) {
    const char* attn = single_pass ? "attn pair 1-pass" : "attn pair";
    const char* mlp = single_pass ? "mlp pair 1-pass" : "mlp pair";
    pair_chain(attn, o_proj, o_proj_t, 1, single_pass);
    pair_chain(attn, o_proj, o_proj_t, layers, single_pass);
    pair_chain(mlp, gate_up, down, 1, single_pass);
    pair_chain(mlp, gate_up, down, layers, single_pass);
  }
  // The bisection of the attn pair: the minimal GEMM (mini_gemm_kernel) in the same chain, X
  // staged in shared memory or loaded per lane, then one stamped replay of it and of the engine's
  // kernel (its KernelProbe), in us from each kernel's first release (medians / p90 over the
  // chain's kernels and blocks); "boundary" is a kernel's last exit to the next one's release.
  {
    const int64_t wa = o_proj.n * o_proj.k, wb = o_proj_t.n * o_proj_t.k, width = 8192;
    const int sets = layers;
    __nv_bfloat16 *w, *act;
    unsigned long long* stamps;
    gpu::KernelProbe* probes;
    const size_t nstamps = static_cast<size_t>(o.chain) * 128 * kMiniStamps;
    QPARITY_CUDA_CHECK(cudaMalloc(&w, static_cast<size_t>(sets * (wa + wb)) * 2));
    QPARITY_CUDA_CHECK(cudaMalloc(&act, static_cast<size_t>(2 * width) * 2));
    QPARITY_CUDA_CHECK(cudaMalloc(&stamps, nstamps * sizeof(unsigned long long)));
    QPARITY_CUDA_CHECK(cudaMalloc(&probes, o.chain * sizeof(gpu::KernelProbe)));
    gpu::launch_fill_random_bf16(w, sets * (wa + wb), 0.f, 0.02f, 11, s);
    gpu::launch_fill_random_bf16(act, 2 * width, 0.f, 1.f, 12, s);
    const auto weights = [&](int i, int s1) { return w + (i / 2 % s1) * (wa + wb) + (i % 2) * wa; };
    const auto x_of = [&](int i) { return act + (i % 2) * width; };
    const auto y_of = [&](int i) { return act + ((i + 1) % 2) * width; };
    // Kernel i of the chain: o_proj (K split in two) or its transpose (no split), alternating.
    const auto mini = [&]<unsigned kFlags>(int i, int s1, unsigned long long* st) {
      const auto launch = [&]<int kKsplit>(const Linear& l) {
        const auto kernel = mini_gemm_kernel<kKsplit, kFlags>;
        if (kFlags & kDynSmem)
          QPARITY_CUDA_CHECK(cudaFuncSetAttribute(
              kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, 160 * 1024));
        const size_t smem = (kFlags & kDynSmem) ? static_cast<size_t>(l.k) * 2 : 0;
        gpu::launch_pdl("mini_gemm", kernel, dim3(128), dim3(kThreads), smem, s, x_of(i), y_of(i),
                        weights(i, s1), static_cast<int>(l.k), st, i);
      };
      if (i % 2 == 0)
        launch.template operator()<2>(o_proj);
      else
        launch.template operator()<1>(o_proj_t);
    };
    const auto engine = [&](int i, int s1, gpu::KernelProbe* pr, bool single_pass) {
      const Linear& l = i % 2 ? o_proj_t : o_proj;
      gpu::SkinnyGemmParams p;
      p.x = x_of(i), p.y = y_of(i), p.w = weights(i, s1);
      p.m = 1, p.n = l.n, p.k = l.k, p.probe = pr ? pr + i : nullptr;
      p.single_pass = single_pass;
      gpu::launch_skinny_gemm(p, s);
    };
    for (const int s1 : {1, sets}) {
      const auto r = [&](const char* name, double us) {
        std::printf("  %-18s %6d %14.3f %18s  (%d weight set%s)\n", name, 128, us, "-", s1,
                    s1 > 1 ? "s" : "");
      };
      const auto m = [&]<unsigned kFlags>(const char* name) {
        r(name,
          us_per_kernel(o, s, [&](int i) { mini.template operator()<kFlags>(i, s1, nullptr); }));
      };
      m.template operator()<0>("mini, X per lane");
      m.template operator()<kStaged>("mini +staged");
      m.template operator()<kDynSmem>("mini +dynsmem");
      m.template operator()<kNoAllocate>("mini +no_allocate");
      m.template operator()<kStaged | kTwoBarriers>("mini +staged+2bar");
      m.template operator()<kScalarWrite>("mini +scalar write");
      m.template operator()<kRuntime>("mini +runtime");
      m.template operator()<kDynSmem | kNoAllocate | kTwoBarriers | kScalarWrite | kRuntime>(
          "mini +all");
    }
    const char* stage_names[kMiniStamps] = {"entry", "release", "dots", "reduced", "exit"};
    for (const bool stage : {true, false}) {
      run_stamped(
          o, s,
          [&](int i) {
            if (stage)
              mini.template operator()<kStaged>(i, sets, stamps);
            else
              mini.template operator()<0>(i, sets, stamps);
          },
          [] {});
      std::vector<unsigned long long> h(nstamps);
      QPARITY_CUDA_CHECK(cudaMemcpy(h.data(), stamps, nstamps * 8, cudaMemcpyDeviceToHost));
      const auto at = [&](int i, int b, int k2) {
        return h[(static_cast<size_t>(i) * 128 + b) * kMiniStamps + k2];
      };
      std::vector<double> st[kMiniStamps], run_after, boundary;
      for (int i = 2; i + 2 < o.chain; ++i) {
        unsigned long long rel = ~0ull, ex = 0, next_rel = ~0ull;
        for (int b = 0; b < 128; ++b) {
          rel = std::min(rel, at(i, b, 1));
          ex = std::max(ex, at(i, b, kMiniStamps - 1));
          next_rel = std::min(next_rel, at(i + 1, b, 1));
        }
        for (int b = 0; b < 128; ++b)
          for (int k2 = 0; k2 < kMiniStamps; ++k2)
            st[k2].push_back((static_cast<double>(at(i, b, k2)) - static_cast<double>(rel)) * 1e-3);
        run_after.push_back(static_cast<double>(ex - rel) * 1e-3);
        boundary.push_back((static_cast<double>(next_rel) - static_cast<double>(ex)) * 1e-3);
      }
      std::printf("  stages of mini, X %s (us from the release, median / p90):",
                  stage ? "staged" : "per lane");
      for (int k2 = 0; k2 < kMiniStamps; ++k2)
        std::printf(" %s %s,", stage_names[k2], median_p90(st[k2]).c_str());
      std::printf(" run after release %s, boundary %s\n", median_p90(run_after).c_str(),
                  median_p90(boundary).c_str());
    }
    for (const bool single_pass : {false, true}) {
      run_stamped(
          o, s, [&](int i) { engine(i, sets, probes, single_pass); },
          [&] {
            QPARITY_CUDA_CHECK(cudaMemset(probes, 0xFF, o.chain * sizeof(gpu::KernelProbe)));
          });
      std::vector<gpu::KernelProbe> hp(static_cast<size_t>(o.chain));
      QPARITY_CUDA_CHECK(cudaMemcpy(hp.data(), probes, o.chain * sizeof(gpu::KernelProbe),
                                    cudaMemcpyDeviceToHost));
      std::vector<double> entry, last_rel, run_after, boundary;
      for (int i = 2; i + 2 < o.chain; ++i) {
        const double rel = static_cast<double>(hp[i].first_release);
        const double ex = static_cast<double>(~hp[i].last_exit_complement);
        entry.push_back((static_cast<double>(hp[i].first_entry) - rel) * 1e-3);
        last_rel.push_back((static_cast<double>(~hp[i].last_release_complement) - rel) * 1e-3);
        run_after.push_back((ex - rel) * 1e-3);
        boundary.push_back((static_cast<double>(hp[i + 1].first_release) - ex) * 1e-3);
      }
      std::printf(
          "  stages of the engine's %s kernel (us from the release, median / p90): first "
          "entry %s, last release %s, run after release %s, boundary %s\n",
          single_pass ? "single-pass" : "generic", median_p90(entry).c_str(),
          median_p90(last_rel).c_str(), median_p90(run_after).c_str(),
          median_p90(boundary).c_str());
    }
    QPARITY_CUDA_CHECK(cudaFree(w));
    QPARITY_CUDA_CHECK(cudaFree(act));
    QPARITY_CUDA_CHECK(cudaFree(stamps));
    QPARITY_CUDA_CHECK(cudaFree(probes));
  }
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
