#include "gpu_engine/shape_padding.h"

#include "core/error.h"
#include "gpu_engine/cuda_check.h"

namespace qparity::gpu {

namespace {

int64_t round_up(int64_t x, int64_t m) {
  return (x + m - 1) / m * m;
}

// Element e of each of `heads` heads of `hd` values, in the padded layout of hp values a head.
ColumnMap head_positions(int64_t heads, int64_t hd, int64_t hp) {
  ColumnMap out;
  if (hd == hp) return out;
  for (int64_t h = 0; h < heads; ++h)
    for (int64_t e = 0; e < hd; ++e)
      out.push_back(h * hp + (e < hd / 2 ? e : hp / 2 + (e - hd / 2)));
  return out;
}

// [gate (n) | up (n)] -> [gate (np) | up (np)].
ColumnMap halves_positions(int64_t n, int64_t np) {
  ColumnMap out;
  if (n == np) return out;
  for (int64_t j = 0; j < 2 * n; ++j)
    out.push_back(j < n ? j : np + (j - n));
  return out;
}

ColumnMap prefix_positions(int64_t n, int64_t np) {
  ColumnMap out;
  if (n == np) return out;
  for (int64_t j = 0; j < n; ++j)
    out.push_back(j);
  return out;
}

// A [outer, n, inner] buffer -> [outer, n_out, inner], slice j of each outer row going to slice
// map[j] and every other slice zero. Runs of consecutive slices move in one 2D copy.
template <typename T>
DeviceBuffer<T> scatter(const DeviceBuffer<T>& src, int64_t outer, int64_t n, int64_t inner,
                        int64_t n_out, const ColumnMap& map) {
  DeviceBuffer<T> dst(static_cast<size_t>(outer * n_out * inner));
  QPARITY_CUDA_CHECK(cudaMemset(dst.get(), 0, dst.bytes()));
  const size_t es = sizeof(T);
  for (int64_t j = 0; j < n;) {
    int64_t run = 1;
    while (j + run < n && map[static_cast<size_t>(j + run)] == map[static_cast<size_t>(j)] + run)
      ++run;
    QPARITY_CUDA_CHECK(cudaMemcpy2D(dst.get() + map[static_cast<size_t>(j)] * inner,
                                    static_cast<size_t>(n_out * inner) * es, src.get() + j * inner,
                                    static_cast<size_t>(n * inner) * es,
                                    static_cast<size_t>(run * inner) * es,
                                    static_cast<size_t>(outer), cudaMemcpyDeviceToDevice));
    j += run;
  }
  return dst;
}

}  // namespace

ModelConfig kernel_shapes(const ModelConfig& cfg, const std::string& where) {
  if (cfg.hidden % 8 != 0)
    throw Error(where, "hidden_size " + std::to_string(cfg.hidden) +
                           ": the GPU engine needs a multiple of 8 (16-byte GEMM rows); padding "
                           "it would change every RMSNorm's divisor");
  if (cfg.head_dim <= 0 || cfg.head_dim % 2 != 0 || cfg.head_dim > 256)
    throw Error(where, "head_dim " + std::to_string(cfg.head_dim) +
                           ": the GPU engine takes an even head_dim up to 256 (RoPE pairs halves)");
  ModelConfig k = cfg;
  k.head_dim = round_up(cfg.head_dim, 32);
  if (cfg.intermediate > 0) k.intermediate = round_up(cfg.intermediate, 8);
  if (cfg.moe_intermediate_size > 0)
    k.moe_intermediate_size = round_up(cfg.moe_intermediate_size, 8);
  return k;
}

PaddedColumns padded_columns(const ModelConfig& c, const ModelConfig& k) {
  PaddedColumns p;
  p.qkv = head_positions(c.num_heads + 2 * c.num_kv_heads, c.head_dim, k.head_dim);
  p.q = head_positions(c.num_heads, c.head_dim, k.head_dim);
  p.k = head_positions(c.num_kv_heads, c.head_dim, k.head_dim);
  p.gate_up = halves_positions(c.intermediate, k.intermediate);
  p.act = prefix_positions(c.intermediate, k.intermediate);
  return p;
}

void require_unpadded(const ModelConfig& cfg, int64_t layer, const std::string& linear,
                      bool quantized) {
  if (!quantized) return;
  const ModelConfig k = kernel_shapes(cfg, "config.json");
  std::string why;
  if (linear.rfind("self_attn.", 0) == 0 && k.head_dim != cfg.head_dim)
    why = "head_dim " + std::to_string(cfg.head_dim) + " (the kernels take " +
          std::to_string(k.head_dim) + ")";
  if (linear == "mlp.experts" && k.moe_intermediate_size != cfg.moe_intermediate_size)
    why = "moe_intermediate_size " + std::to_string(cfg.moe_intermediate_size) +
          " (the kernels take " + std::to_string(k.moe_intermediate_size) + ")";
  else if (linear.rfind("mlp.", 0) == 0 && k.intermediate != cfg.intermediate)
    why = "intermediate_size " + std::to_string(cfg.intermediate) + " (the kernels take " +
          std::to_string(k.intermediate) + ")";
  if (!why.empty())
    throw Error("model.layers." + std::to_string(layer) + "." + linear,
                "a quantized linear with " + why +
                    ": zero padding for the kernels is done for bf16 linears only");
}

void pad_for_kernels(GpuModel& m) {
  const ModelConfig& c = m.cfg;
  const ModelConfig k = kernel_shapes(c, (m.dir / "config.json").string());
  const bool heads = k.head_dim != c.head_dim, inter = k.intermediate != c.intermediate,
             moe_inter = k.moe_intermediate_size != c.moe_intermediate_size;
  if (!heads && !inter && !moe_inter) return;
  const int64_t h = c.hidden, hd = c.head_dim, hp = k.head_dim;
  const PaddedColumns cols = padded_columns(c, k);
  // Each padded buffer replaces its unpadded one; weight_bytes follows.
  const auto replace = [&m](Bf16Buffer& b, Bf16Buffer padded) {
    m.weight_bytes = m.weight_bytes - b.bytes() + padded.bytes();
    b = std::move(padded);
  };
  for (size_t i = 0; i < m.layers.size(); ++i) {
    GpuLayerWeights& l = m.layers[i];
    const int64_t li = static_cast<int64_t>(i);
    if (heads) {
      require_unpadded(c, li, "self_attn.qkv_proj", l.qkv_q != nullptr);
      require_unpadded(c, li, "self_attn.o_proj", l.o_proj_q != nullptr);
      const int64_t rows = c.q_size() + 2 * c.kv_size(), rows_k = k.q_size() + 2 * k.kv_size();
      replace(l.qkv, scatter(l.qkv, 1, rows, h, rows_k, cols.qkv));
      replace(l.o_proj, scatter(l.o_proj, h, c.q_size(), 1, k.q_size(), cols.q));
      if (c.has_qk_norm) {
        const ColumnMap one = head_positions(1, hd, hp);
        replace(l.q_norm, scatter(l.q_norm, 1, hd, 1, hp, one));
        replace(l.k_norm, scatter(l.k_norm, 1, hd, 1, hp, one));
      }
    }
    if (inter && !l.moe) {
      require_unpadded(c, li, "mlp.gate_up_proj", l.gate_up_q != nullptr);
      require_unpadded(c, li, "mlp.down_proj", l.down_q != nullptr);
      replace(l.gate_up,
              scatter(l.gate_up, 1, 2 * c.intermediate, h, 2 * k.intermediate, cols.gate_up));
      replace(l.down, scatter(l.down, h, c.intermediate, 1, k.intermediate,
                              prefix_positions(c.intermediate, k.intermediate)));
    }
    if (moe_inter && l.moe) {
      const int64_t e = c.num_experts, mi = c.moe_intermediate_size, mp = k.moe_intermediate_size;
      replace(l.w13, scatter(l.w13, e, 2 * mi, h, 2 * mp, halves_positions(mi, mp)));
      replace(l.w2, scatter(l.w2, e * h, mi, 1, mp, prefix_positions(mi, mp)));
    }
  }
  if (heads) {  // the model's frequencies first, zeros for the padding
    std::vector<double> f(m.inv_freq.size());
    QPARITY_CUDA_CHECK(
        cudaMemcpy(f.data(), m.inv_freq.get(), f.size() * sizeof(double), cudaMemcpyDeviceToHost));
    f.resize(static_cast<size_t>(hp / 2), 0.0);
    m.inv_freq = DeviceBuffer<double>(f);
    if (m.mrope_rows.size() > 0) {  // the padding's zero frequencies read any row: row 0
      std::vector<int32_t> r(m.mrope_rows.size());
      QPARITY_CUDA_CHECK(cudaMemcpy(r.data(), m.mrope_rows.get(), r.size() * sizeof(int32_t),
                                    cudaMemcpyDeviceToHost));
      r.resize(static_cast<size_t>(hp / 2), 0);
      m.mrope_rows = DeviceBuffer<int32_t>(r);
    }
  }
  m.padded = k;
}

}  // namespace qparity::gpu
