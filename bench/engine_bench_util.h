#pragma once
// What the engine benchmarks share: the published shapes they run (random weights made on the
// device), the device's copy bandwidth (the roofline of memory-bound decode) and a timer.
#include <chrono>

#include <filesystem>

#include "core/config/model_config.h"
#include "core/json_util.h"
#include "gpu_engine/engine.h"

namespace qparity::bench {

ModelConfig qwen3_06b();
ModelConfig llama3_8b();
// Llama-3-70B's published config: 80 layers, hidden 8192, 64 q heads, 8 KV heads, 28672.
ModelConfig llama3_70b();
// Qwen3-30B-A3B's published config: 48 layers, 128 experts, 8 active, moe_intermediate 768.
ModelConfig qwen3_30b_a3b();

// Prefills sequence slots 0..sequences-1 with `context` pseudo-random tokens each, one forward
// per sequence (which keeps the token count within max_tokens).
void prefill_sequences(gpu::Engine& e, int64_t sequences, int64_t context);

// --json FILE: the results through the one atomic writer (never over an existing file).
void write_bench_json(const std::filesystem::path& file, const Json& j);

// Seconds since t0.
double seconds(std::chrono::steady_clock::time_point t0);

// Device-to-device copy bandwidth of the current device: cudaMemcpyAsync of 1 GiB, counted as
// bytes read + bytes written (bandwidthTest's convention).
double copy_bandwidth();

}  // namespace qparity::bench
