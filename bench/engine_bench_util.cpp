#include "engine_bench_util.h"

#include <cuda_runtime_api.h>

#include "core/safetensors/safetensors_writer.h"
#include "gpu_engine/cuda_check.h"
#include "gpu_engine/device_buffer.h"

namespace qparity::bench {

void write_bench_json(const std::filesystem::path& file, const Json& j) {
  const std::string text = j.dump(2) + "\n";
  write_file_atomic(
      file, std::span<const uint8_t>(reinterpret_cast<const uint8_t*>(text.data()), text.size()),
      OverwritePolicy::kRefuse);
}

void prefill_sequences(gpu::Engine& e, int64_t sequences, int64_t context) {
  const int64_t vocab = e.config().vocab;
  for (int32_t s = 0; s < sequences; ++s) {
    gpu::Batch b;
    for (int64_t i = 0; i < context; ++i) {
      b.tokens.push_back(static_cast<int32_t>((s * 7919 + i * 104729) % vocab));
      b.slots.push_back(s);
      b.positions.push_back(static_cast<int32_t>(i));
    }
    e.forward(b);
  }
}

ModelConfig qwen3_06b() {
  ModelConfig c;
  c.arch = Arch::kQwen3;
  c.num_layers = 28;
  c.hidden = 1024;
  c.num_heads = 16;
  c.num_kv_heads = 8;
  c.head_dim = 128;
  c.intermediate = 3072;
  c.vocab = 151936;
  c.rms_norm_eps = 1e-6;
  c.rope_theta = 1000000;
  c.tie_word_embeddings = true;
  c.has_qk_norm = true;
  return c;
}

ModelConfig llama3_8b() {
  ModelConfig c;
  c.arch = Arch::kLlama;
  c.num_layers = 32;
  c.hidden = 4096;
  c.num_heads = 32;
  c.num_kv_heads = 8;
  c.head_dim = 128;
  c.intermediate = 14336;
  c.vocab = 128256;
  c.rms_norm_eps = 1e-5;
  c.rope_theta = 500000;
  c.rope_scaling.type = RopeType::kLlama3;
  c.rope_scaling.factor = 8;
  c.rope_scaling.low_freq_factor = 1;
  c.rope_scaling.high_freq_factor = 4;
  c.rope_scaling.original_max_position_embeddings = 8192;
  return c;
}

ModelConfig llama3_70b() {
  ModelConfig c = llama3_8b();
  c.num_layers = 80;
  c.hidden = 8192;
  c.num_heads = 64;
  c.num_kv_heads = 8;
  c.intermediate = 28672;
  return c;
}

ModelConfig qwen3_30b_a3b() {
  ModelConfig c;
  c.arch = Arch::kQwen3Moe;
  c.num_layers = 48;
  c.hidden = 2048;
  c.num_heads = 32;
  c.num_kv_heads = 4;
  c.head_dim = 128;
  c.intermediate = 6144;
  c.num_experts = 128;
  c.num_experts_per_tok = 8;
  c.moe_intermediate_size = 768;
  c.norm_topk_prob = true;
  c.vocab = 151936;
  c.rms_norm_eps = 1e-6;
  c.rope_theta = 1000000;
  c.tie_word_embeddings = false;
  c.has_qk_norm = true;
  return c;
}

double seconds(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

double copy_bandwidth() {
  const size_t bytes = size_t{1} << 30;
  gpu::DeviceBuffer<uint8_t> a(bytes), b(bytes);
  QPARITY_CUDA_CHECK(cudaMemset(a.get(), 1, bytes));
  cudaEvent_t e0, e1;
  QPARITY_CUDA_CHECK(cudaEventCreate(&e0));
  QPARITY_CUDA_CHECK(cudaEventCreate(&e1));
  QPARITY_CUDA_CHECK(cudaMemcpy(b.get(), a.get(), bytes, cudaMemcpyDeviceToDevice));  // warm-up
  const int reps = 10;
  QPARITY_CUDA_CHECK(cudaEventRecord(e0));
  for (int i = 0; i < reps; ++i)
    QPARITY_CUDA_CHECK(cudaMemcpyAsync(b.get(), a.get(), bytes, cudaMemcpyDeviceToDevice));
  QPARITY_CUDA_CHECK(cudaEventRecord(e1));
  QPARITY_CUDA_CHECK(cudaEventSynchronize(e1));
  float ms = 0;
  QPARITY_CUDA_CHECK(cudaEventElapsedTime(&ms, e0, e1));
  cudaEventDestroy(e0);
  cudaEventDestroy(e1);
  return 2.0 * static_cast<double>(bytes) * reps / (ms * 1e-3);
}

}  // namespace qparity::bench
