#include "gpu_engine/random_model.h"

#include "core/error.h"
#include "gpu_engine/cuda_check.h"
#include "gpu_engine/kernels/random_init.h"
#include "gpu_engine/quant/fp8_linear.h"
#include "gpu_engine/quant/weight_only_int.h"
#include "gpu_engine/shape_padding.h"

namespace qparity::gpu {

std::unique_ptr<GpuModel> random_gpu_model(const ModelConfig& c, uint64_t seed,
                                           const std::string& expert_scheme,
                                           const std::string& dense_scheme) {
  // The weight-only integer points a dense layer can take: bits and group (0: per channel).
  struct IntPoint {
    const char* id;
    int bits;
    int64_t group;
  };
  static constexpr IntPoint kIntPoints[] = {
      {"w4a16-g32", 4, 32}, {"ct-w4a16-g128", 4, 128}, {"w8a16-ch", 8, 0}};
  const IntPoint* int_point = nullptr;
  for (const IntPoint& p : kIntPoints)
    if (dense_scheme == p.id) int_point = &p;
  if (dense_scheme != "bf16" && dense_scheme != "fp8-block" && dense_scheme != "fp8-block-tc" &&
      !int_point)
    throw Error("random model", "dense scheme '" + dense_scheme +
                                    "': random dense linears are bf16, fp8-block, fp8-block-tc "
                                    "(on the fp8 tensor cores), w4a16-g32, ct-w4a16-g128 or "
                                    "w8a16-ch");
  if (expert_scheme != "bf16" && expert_scheme != "fp8-block" && expert_scheme != "w4a16-g32")
    throw Error("random model", "expert scheme '" + expert_scheme +
                                    "': random experts are bf16, fp8-block or w4a16-g32");
  auto m = std::make_unique<GpuModel>();
  m->cfg = c;
  const size_t h = static_cast<size_t>(c.hidden), q = static_cast<size_t>(c.q_size()),
               kv = static_cast<size_t>(c.kv_size()), d = static_cast<size_t>(c.head_dim),
               in = static_cast<size_t>(c.intermediate), e = static_cast<size_t>(c.num_experts),
               mi = static_cast<size_t>(c.moe_intermediate_size), v = static_cast<size_t>(c.vocab);
  uint64_t stream_seed = seed;
  const auto make = [&](Bf16Buffer& b, size_t n, float mean) {
    b = Bf16Buffer(n);
    launch_fill_random_bf16(b.get(), static_cast<int64_t>(n), mean, 0.02f, ++stream_seed, nullptr);
    m->weight_bytes += n * 2;
  };
  make(m->embed, v * h, 0.f);
  make(m->final_norm, h, 1.f);
  if (!c.tie_word_embeddings) make(m->lm_head_own, v * h, 0.f);
  m->lm_head = c.tie_word_embeddings ? m->embed.get() : m->lm_head_own.get();
  m->layers.resize(static_cast<size_t>(c.num_layers));
  const bool fp8 = dense_scheme.rfind("fp8-block", 0) == 0, fp8_tc = dense_scheme == "fp8-block-tc";
  // A dense linear [n, k]: bf16, fp8-block codes ~ 150 sigma (weights ~ N(0, 0.04)), or random
  // integer codes in the tensor-core layout a checkpoint's dense layer loads into.
  const auto dense = [&](Bf16Buffer& b, std::unique_ptr<GpuLinearMethod>& method,
                         const std::string& name, size_t n, size_t k) {
    const auto nn = static_cast<int64_t>(n), kk = static_cast<int64_t>(k);
    if (int_point) {
      WeightOnlyIntMethod::Random r{int_point->bits, int_point->group ? int_point->group : kk,
                                    int_point->bits == 4 ? 0.005f : 0.0003f, ++stream_seed, true};
      method =
          std::make_unique<WeightOnlyIntMethod>(name, parse_scheme_id(int_point->id), nn, kk, r);
      m->weight_bytes += method->device_bytes();
      return;
    }
    if (!fp8) return make(b, n * k, 0.f);
    method = Fp8LinearMethod::random_block(name, nn, kk, 1.f / 4096, ++stream_seed, fp8_tc);
    m->weight_bytes += method->device_bytes();
  };
  for (int64_t i = 0; i < c.num_layers; ++i) {
    GpuLayerWeights& l = m->layers[static_cast<size_t>(i)];
    const std::string lp = "model.layers." + std::to_string(i) + ".";
    make(l.input_norm, h, 1.f);
    make(l.post_norm, h, 1.f);
    dense(l.qkv, l.qkv_q, lp + "self_attn.qkv_proj", q + 2 * kv, h);
    dense(l.o_proj, l.o_proj_q, lp + "self_attn.o_proj", h, q);
    if (c.has_qk_norm) {
      make(l.q_norm, d, 1.f);
      make(l.k_norm, d, 1.f);
    }
    l.moe = c.is_moe_layer(i);
    if (l.moe) {
      make(l.router, e * h, 0.f);
      if (expert_scheme == "bf16") {
        make(l.w13, e * 2 * mi * h, 0.f);
        make(l.w2, e * h * mi, 0.f);
      } else {
        const std::string p = "model.layers." + std::to_string(i) + ".mlp.experts.";
        const auto add = [&](std::vector<std::unique_ptr<GpuLinearMethod>>& stack, int64_t x,
                             int64_t n, int64_t k, const char* which) {
          const std::string name = p + std::to_string(x) + "." + which;
          if (expert_scheme == "fp8-block")  // codes ~ 150 sigma: weights ~ N(0, 0.04)
            stack.push_back(Fp8LinearMethod::random_block(name, n, k, 1.f / 4096, ++stream_seed));
          else
            stack.push_back(std::make_unique<WeightOnlyIntMethod>(
                name, parse_scheme_id("w4a16-g32"), n, k,
                WeightOnlyIntMethod::Random{4, 32, 0.005f, ++stream_seed}));
          m->weight_bytes += stack.back()->device_bytes();
        };
        for (int64_t x = 0; x < static_cast<int64_t>(e); ++x) {
          add(l.w13_q, x, static_cast<int64_t>(2 * mi), static_cast<int64_t>(h), "w13");
          add(l.w2_q, x, static_cast<int64_t>(h), static_cast<int64_t>(mi), "w2");
        }
      }
    } else {
      dense(l.gate_up, l.gate_up_q, lp + "mlp.gate_up_proj", 2 * in, h);
      dense(l.down, l.down_q, lp + "mlp.down_proj", h, in);
    }
  }
  attach_rope(*m);
  pad_for_kernels(*m);
  QPARITY_CUDA_CHECK(cudaDeviceSynchronize());
  return m;
}

}  // namespace qparity::gpu
