// Decode attention over a bf16, an int8 and an fp8 KV cache (kernels/kv_quant.h), in one process
// on one device: the Llama-3-8B attention shape (32 query heads, 8 KV heads, head_dim 128), every
// sequence at 8k positions, block size 16. Batch 64 runs the engine's path for batches above the
// decode-sized ones (paged_attention, one block per token and head over the whole context);
// batches 1 and 4 its decode-sized path (decode_attention, 64-key chunks, the prologue fused in).
// Each time is the mean of 20 launches after 3 warm-ups (CUDA events). Printed per row:
// microseconds, GB/s of the cache bytes the launch must read (each KV head's K and V rows once),
// and the bf16 cache's time over this one's (the target at batch 64: >= 1.6x for int8 and
// fp8, half the bytes). fp8 twice: vLLM's read (each element rounded to bf16) and SGLang's (fp32,
// the scale factored out of the loop, kv_quant.cuh). The cache holds constant codes: these kernels' time does not depend on
// the values.
#include <cuda_runtime_api.h>

#include <cmath>
#include <iomanip>
#include <iostream>
#include <numeric>
#include <vector>

#include "gpu_engine/cuda_check.h"
#include "gpu_engine/device_buffer.h"
#include "gpu_engine/device_info.h"
#include "gpu_engine/kernels/decode_attention.h"
#include "gpu_engine/kernels/paged_attention.h"

using namespace qparity;
using gpu::DeviceBuffer;
using gpu::KvCacheFormat;

int main() {
  std::string why;
  const auto dev = gpu::query_device(0, &why);
  if (!dev) {
    std::cerr << "bench_kv_attention: no GPU: " << why << "\n";
    return 1;
  }
  std::cout << "device: " << dev->name << " " << dev->sm() << "\n";
  const int64_t heads = 32, kv_heads = 8, d = 128, block = 16, context = 8192;
  const int64_t max_seqs = 64, mbps = context / block, num_blocks = max_seqs * mbps;
  const size_t elems = static_cast<size_t>(num_blocks * block * kv_heads * d);
  std::vector<int32_t> table(static_cast<size_t>(num_blocks));
  std::iota(table.begin(), table.end(), 0);
  DeviceBuffer<int32_t> dt(table);
  DeviceBuffer<uint8_t> kc(elems * 2), vc(elems * 2);  // room for bf16
  const int64_t qkv_w = (heads + 2 * kv_heads) * d;
  DeviceBuffer<__nv_bfloat16> qkv(static_cast<size_t>(max_seqs * qkv_w)),
      out(static_cast<size_t>(max_seqs * heads * d));
  QPARITY_CUDA_CHECK(cudaMemset(qkv.get(), 0x3F, qkv.bytes()));
  std::vector<double> inv(static_cast<size_t>(d / 2));
  for (size_t i = 0; i < inv.size(); ++i)
    inv[i] = std::pow(1e6, -2.0 * static_cast<double>(i) / static_cast<double>(d));
  DeviceBuffer<double> dinv(inv);
  // int8 channels: scale 0.01, reciprocal 100, offset 0.
  std::vector<float> ch(static_cast<size_t>(gpu::kKvChannelRows * kv_heads * d), 0.f);
  for (int r : {gpu::kKScale, gpu::kVScale})
    std::fill_n(ch.begin() + r * kv_heads * d, kv_heads * d, 0.01f);
  for (int r : {gpu::kKRcp, gpu::kVRcp})
    std::fill_n(ch.begin() + r * kv_heads * d, kv_heads * d, 100.f);
  DeviceBuffer<float> dch(ch);
  cudaStream_t s;
  QPARITY_CUDA_CHECK(cudaStreamCreate(&s));
  cudaEvent_t e0, e1;
  QPARITY_CUDA_CHECK(cudaEventCreate(&e0));
  QPARITY_CUDA_CHECK(cudaEventCreate(&e1));
  struct Variant {
    const char* name;
    KvCacheFormat format;
    bool read_bf16;
  };
  const std::vector<Variant> variants = {{"bf16", KvCacheFormat::kBf16, false},
                                         {"int8", KvCacheFormat::kInt8, false},
                                         {"fp8 vllm", KvCacheFormat::kFp8E4m3, true},
                                         {"fp8 sglang", KvCacheFormat::kFp8E4m3, false}};
  const auto quant_of = [&](const Variant& v) {
    gpu::KvQuant q;
    q.format = v.format;
    q.read_bf16 = v.read_bf16;
    if (v.format == KvCacheFormat::kInt8) q.channels = dch.get(), q.num_channels = kv_heads * d;
    if (v.format == KvCacheFormat::kFp8E4m3) q.k_scale = q.v_scale = 0.01f;
    return q;
  };
  const int64_t max_chunks = context / 64;
  const auto scratch = gpu::paged_attention_scratch(4, heads, d, max_chunks);
  DeviceBuffer<float> pacc(static_cast<size_t>(scratch.acc)), pml(static_cast<size_t>(scratch.ml));
  DeviceBuffer<uint32_t> done(std::vector<uint32_t>(static_cast<size_t>(scratch.counters), 0u));
  std::cout << std::fixed;
  for (const int64_t batch : {int64_t{64}, int64_t{4}, int64_t{1}}) {
    std::vector<int32_t> seq(static_cast<size_t>(batch)), pos(seq.size(), context - 1);
    std::iota(seq.begin(), seq.end(), 0);
    DeviceBuffer<int32_t> ds(seq), dp(pos);
    double bf16_us = 0;
    for (const Variant& variant : variants) {
      const KvCacheFormat f = variant.format;
      const size_t eb = gpu::kv_element_bytes(f);
      QPARITY_CUDA_CHECK(cudaMemset(kc.get(), f == KvCacheFormat::kBf16 ? 0x3C : 0x30, elems * eb));
      QPARITY_CUDA_CHECK(cudaMemset(vc.get(), f == KvCacheFormat::kBf16 ? 0x3C : 0x30, elems * eb));
      const gpu::KvQuant q = quant_of(variant);
      const auto launch = [&] {
        if (batch > 4) {
          gpu::PagedAttentionParams pa;
          pa.q = qkv.get(), pa.q_stride = qkv_w, pa.k_cache = kc.get(), pa.v_cache = vc.get();
          pa.kv = q, pa.block_table = dt.get(), pa.seq = ds.get(), pa.pos = dp.get();
          pa.out = out.get(), pa.out_stride = heads * d, pa.tokens = batch, pa.num_heads = heads;
          pa.num_kv_heads = kv_heads, pa.head_dim = d, pa.block_size = block;
          pa.max_blocks_per_seq = mbps, pa.scale = 0.088f, pa.chunk = context, pa.max_chunks = 1;
          gpu::launch_paged_attention(pa, s);
        } else {
          gpu::DecodeAttentionParams da;
          da.qkv = qkv.get(), da.qkv_stride = qkv_w, da.positions = dp.get(), da.seq = ds.get();
          da.inv_freq = dinv.get(), da.k_cache = kc.get(), da.v_cache = vc.get(), da.kv = q;
          da.block_table = dt.get(), da.block_size = block, da.max_blocks_per_seq = mbps;
          da.out = out.get(), da.out_stride = heads * d, da.tokens = batch, da.num_heads = heads;
          da.num_kv_heads = kv_heads, da.head_dim = d, da.scale = 0.088f, da.chunk = 64;
          da.max_chunks = max_chunks, da.partial_acc = pacc.get(), da.partial_ml = pml.get();
          da.chunks_done = done.get();
          gpu::launch_decode_attention(da, s);
        }
      };
      for (int i = 0; i < 3; ++i)
        launch();
      QPARITY_CUDA_CHECK(cudaEventRecord(e0, s));
      const int reps = 20;
      for (int i = 0; i < reps; ++i)
        launch();
      QPARITY_CUDA_CHECK(cudaEventRecord(e1, s));
      QPARITY_CUDA_CHECK(cudaEventSynchronize(e1));
      float ms = 0;
      QPARITY_CUDA_CHECK(cudaEventElapsedTime(&ms, e0, e1));
      const double us = 1e3 * ms / reps;
      if (f == KvCacheFormat::kBf16) bf16_us = us;
      const double bytes =
          2.0 * static_cast<double>(batch * context * kv_heads * d) * static_cast<double>(eb);
      std::cout << "batch " << std::setw(2) << batch << " context " << context << " "
                << std::setw(10) << variant.name << " (" << (batch > 4 ? "paged_attention" : "decode_attention")
                << "): " << std::setprecision(1) << std::setw(8) << us << " us  "
                << std::setprecision(0) << std::setw(5) << bytes / us / 1e3 << " GB/s  bf16/this "
                << std::setprecision(2) << bf16_us / us << "x\n";
    }
  }
  QPARITY_CUDA_CHECK(cudaStreamSynchronize(s));
  return 0;
}
