// GPU engine throughput on synthetic Qwen3-0.6B- and Llama-3-8B-shaped models (random bf16
// weights made on the device), each number beside a baseline measured in the same run:
//   - device-to-device copy bandwidth (cudaMemcpyAsync of 1 GiB, counted as bytes read + bytes
//     written, the convention of bandwidthTest), the roofline for memory-bound decode;
//   - decode tokens/s at batch 1, 8, 64 (every sequence prefilled with --context tokens, then
//     --steps decode steps through CUDA graphs, greedy argmax on the device included), and the
//     achieved bytes/s of weights + KV cache read per step as a fraction of the copy bandwidth;
//   - prefill tokens/s (--prefill tokens per forward).
// Output: a table on stdout and --json FILE. HF transformers on the same shapes runs from
// tools/device/bench_hf.py; the device script puts both in one report.
#include <cuda_runtime_api.h>

#include <CLI/CLI.hpp>
#include <chrono>
#include <fstream>
#include <iostream>

#include "core/json_util.h"
#include "gpu_engine/cuda_check.h"
#include "gpu_engine/device_info.h"
#include "gpu_engine/engine.h"

namespace {

using namespace qparity;

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

struct Options {
  int64_t context = 512, steps = 64, prefill = 2048;
  std::string models = "qwen3-0.6b,llama3-8b", json;
};

Json bench_model(const std::string& name, const ModelConfig& cfg, const Options& o, double bw) {
  auto model = gpu::random_gpu_model(cfg, 1);
  const double weight_bytes = static_cast<double>(model->weight_bytes);
  gpu::EngineOptions eo;
  eo.max_tokens = std::max<int64_t>({o.prefill, o.context, 64});
  eo.max_seqs = 64;
  eo.max_context = o.context + o.steps + 16;
  gpu::Engine e(std::move(model), eo);
  Json out = {{"model", name}, {"weight_bytes", weight_bytes}};
  const double kv_per_token = 2.0 * 2 * static_cast<double>(cfg.num_layers * cfg.kv_size());
  Json decode = Json::array();
  for (const int64_t batch : {1, 8, 64}) {
    // Prefill every sequence (one forward per sequence keeps the token count in bounds).
    const auto prefill_all = [&] {
      for (int32_t s = 0; s < batch; ++s) {
        gpu::Batch b;
        for (int64_t i = 0; i < o.context; ++i) {
          b.tokens.push_back(static_cast<int32_t>((s * 7919 + i * 104729) % cfg.vocab));
          b.slots.push_back(s);
          b.positions.push_back(static_cast<int32_t>(i));
        }
        e.forward(b);
      }
    };
    prefill_all();
    std::vector<int32_t> next(static_cast<size_t>(batch), 1);
    const auto step = [&](int64_t k) {
      gpu::Batch b;
      for (int32_t s = 0; s < batch; ++s) {
        b.tokens.push_back(next[static_cast<size_t>(s)]);
        b.slots.push_back(s);
        b.positions.push_back(static_cast<int32_t>(o.context + k));
      }
      e.forward_graph(b);
      next = e.greedy(batch);
    };
    step(0);  // captures the graph for this batch size
    for (int32_t s = 0; s < batch; ++s)
      e.cache().release(s);
    prefill_all();  // again, so the timed steps start at the same positions
    const auto t0 = std::chrono::steady_clock::now();
    for (int64_t k = 0; k < o.steps; ++k)
      step(k);
    const double secs = seconds(t0);
    double kv_bytes = 0;
    for (int64_t k = 0; k < o.steps; ++k)
      kv_bytes +=
          static_cast<double>(batch) * static_cast<double>(o.context + k + 1) * kv_per_token;
    const double bytes = weight_bytes * static_cast<double>(o.steps) + kv_bytes;
    const double tps = static_cast<double>(batch * o.steps) / secs;
    decode.push_back({{"batch", batch},
                      {"tokens_per_s", tps},
                      {"ms_per_step", secs / static_cast<double>(o.steps) * 1e3},
                      {"bytes_per_s", bytes / secs},
                      {"fraction_of_copy_bandwidth", bytes / secs / bw}});
    std::cout << name << " decode batch " << batch << ": " << tps << " tokens/s, "
              << secs / static_cast<double>(o.steps) * 1e3 << " ms/step, weights+KV "
              << bytes / secs / 1e9 << " GB/s = " << 100 * bytes / secs / bw
              << " % of copy bandwidth\n";
    for (int32_t s = 0; s < batch; ++s)
      e.cache().release(s);
  }
  out["decode"] = decode;
  {
    gpu::Batch b;
    const int64_t per = 512, seqs = std::max<int64_t>(1, o.prefill / per);
    for (int32_t s = 0; s < seqs; ++s)
      for (int64_t i = 0; i < per; ++i) {
        b.tokens.push_back(static_cast<int32_t>((s * 31 + i * 17) % cfg.vocab));
        b.slots.push_back(s);
        b.positions.push_back(static_cast<int32_t>(i));
      }
    e.forward(b);  // warm-up (GEMM plans)
    for (int32_t s = 0; s < seqs; ++s)
      e.cache().release(s);
    const auto t0 = std::chrono::steady_clock::now();
    const int reps = 3;
    for (int r = 0; r < reps; ++r) {
      e.forward(b);
      for (int32_t s = 0; s < seqs; ++s)
        e.cache().release(s);
    }
    const double tps = static_cast<double>(b.size() * reps) / seconds(t0);
    out["prefill"] = {{"tokens", b.size()}, {"sequences", seqs}, {"tokens_per_s", tps}};
    std::cout << name << " prefill " << b.size() << " tokens (" << seqs << " x " << per
              << "): " << tps << " tokens/s\n";
  }
  return out;
}

}  // namespace

int main(int argc, char** argv) {
  Options o;
  CLI::App app("GPU engine decode / prefill throughput against the device's copy bandwidth");
  app.add_option("--context", o.context, "prefilled tokens per sequence before decode")
      ->capture_default_str();
  app.add_option("--steps", o.steps, "timed decode steps")->capture_default_str();
  app.add_option("--prefill", o.prefill, "prefill tokens per forward")->capture_default_str();
  app.add_option("--models", o.models, "qwen3-0.6b,llama3-8b")->capture_default_str();
  app.add_option("--json", o.json, "write the results here");
  CLI11_PARSE(app, argc, argv);
  try {
    std::string why;
    const auto dev = gpu::query_device(0, &why);
    if (!dev) {
      std::cerr << "bench_engine: no CUDA device: " << why << "\n";
      return 2;
    }
    const double bw = copy_bandwidth();
    std::cout << "device " << dev->name << " " << dev->sm() << ": device-to-device copy "
              << bw / 1e9 << " GB/s (read + write)\n";
    Json j = {{"device", dev->name + " " + dev->sm()}, {"copy_bytes_per_s", bw}};
    Json models = Json::array();
    if (o.models.find("qwen3-0.6b") != std::string::npos)
      models.push_back(bench_model("qwen3-0.6b", qwen3_06b(), o, bw));
    if (o.models.find("llama3-8b") != std::string::npos)
      models.push_back(bench_model("llama3-8b", llama3_8b(), o, bw));
    j["models"] = models;
    if (!o.json.empty()) std::ofstream(o.json) << j.dump(2) << "\n";
  } catch (const std::exception& e) {
    std::cerr << "bench_engine: " << e.what() << "\n";
    return 1;
  }
  return 0;
}
