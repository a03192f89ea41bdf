#pragma once
// Next-token choice from one row of logits on the host: greedy (temperature 0: the first maximal
// id, as torch.argmax), or temperature then top-p (nucleus) sampling with a seeded generator, in
// the order HF's generate applies them: logits / T, softmax (fp64), keep the smallest set of the
// most probable tokens whose mass reaches top_p (ties by id), renormalize, draw.
#include <cstdint>
#include <random>
#include <span>

namespace qparity::gpu {

struct SamplingParams {
  double temperature = 0.0;  // 0: greedy
  double top_p = 1.0;        // (0, 1]
  uint64_t seed = 0;
};

class Sampler {
 public:
  explicit Sampler(const SamplingParams& p);
  // Throws qparity::Error for bad parameters or a row with NaN.
  int32_t next(std::span<const float> logits);

 private:
  SamplingParams p_;
  std::mt19937_64 rng_;
};

}  // namespace qparity::gpu
