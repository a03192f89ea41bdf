#pragma once
// What an Engine is sized for, and the switches of timing studies.
#include <cstdint>

namespace qparity::gpu {

struct EngineOptions {
  int64_t max_tokens = 2048;  // tokens per forward (longer prefills go in chunks)
  int64_t max_seqs = 64;
  int64_t max_context = 4096;
  int64_t block_size = 16;
  // Timing studies only (bench_engine --ablate): leave these kernels out of every forward, to
  // measure what they cost inside a decode step. The results are then meaningless.
  // Keys per block of the decode attention (decode_attention.h), a multiple of 64.
  int64_t decode_attention_chunk = 64;
  bool ablate_attention = false, ablate_linears = false;
  // Decode-sized forwards stamp their main kernels' start, wait release and end (kernel_probe.h),
  // read back by timeline(): where a step's time goes inside its CUDA graph.
  bool kernel_timeline = false;
  // Decode-sized forwards stamp the decode attention's stages per block (decode_attention.h);
  // the last layer's are read with read_decode_attention_stages().
  bool attention_stages = false;
  // Quantized MoE experts of decode-sized batches as grouped launches on the device
  // (quant/grouped_experts.h); false keeps every batch on the per-expert host path (the tests
  // compare the two).
  bool grouped_experts = true;
};

}  // namespace qparity::gpu
