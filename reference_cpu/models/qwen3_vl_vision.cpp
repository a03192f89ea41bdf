#include "reference_cpu/models/qwen3_vl_vision.h"

#include <algorithm>
#include <cmath>

#include "core/error.h"
#include "reference_cpu/layers/rope.h"
#include "schemes/math/matmul.h"
#include "schemes/method/tensor_decode.h"

namespace qparity::reference {

namespace {

size_t sz(int64_t v) {
  return static_cast<size_t>(v);
}

int64_t positive(const Json& vc, const char* key, const std::string& where) {
  const Json& v = require_key(vc, key, where);
  const int64_t x = as_int(v, key_where(where, key));
  if (x <= 0 || x > (int64_t{1} << 24))
    throw Error(key_where(where, key), "must be in [1, 2^24], got " + std::to_string(x));
  return x;
}

// torch.linspace(0, end, n) in fp64: start + i·step for the first half, end − (n−1−i)·step for
// the rest (ATen's two-sided form), step = end / (n − 1).
std::vector<double> linspace(double end, int64_t n) {
  std::vector<double> v(sz(n), 0.0);
  if (n == 1) return v;
  const double step = end / static_cast<double>(n - 1);
  const int64_t half = n / 2;
  for (int64_t i = 0; i < n; ++i)
    v[sz(i)] =
        i < half ? static_cast<double>(i) * step : end - static_cast<double>(n - 1 - i) * step;
  return v;
}

Matrix linear(const Matrix& x, const Matrix& w, const std::vector<double>& b) {
  Matrix y = matmul_nt(x, w);
  for (int64_t r = 0; r < y.rows; ++r)
    for (int64_t c = 0; c < y.cols; ++c)
      y(r, c) += b[sz(c)];
  return y;
}

void gelu_tanh(Matrix& x) {  // transformers' gelu_pytorch_tanh
  const double k = std::sqrt(2.0 / M_PI);
  for (double& v : x.data)
    v = 0.5 * v * (1.0 + std::tanh(k * (v + 0.044715 * v * v * v)));
}

void gelu_erf(Matrix& x) {  // nn.GELU()
  for (double& v : x.data)
    v = 0.5 * v * (1.0 + std::erf(v / std::sqrt(2.0)));
}

// [N, h] -> [N / m², m²·h]: consecutive merge-window rows side by side.
Matrix shuffle_windows(const Matrix& x, int64_t group) {
  Matrix y(x.rows / group, x.cols * group);
  std::copy(x.data.begin(), x.data.end(), y.data.begin());
  return y;
}

}  // namespace

int64_t VisionConfig::grid_side() const {
  return static_cast<int64_t>(std::llround(std::sqrt(static_cast<double>(num_positions))));
}

VisionConfig parse_vision_config(const Json& vc, const std::string& where) {
  require_object(vc, where);
  VisionConfig c;
  c.depth = positive(vc, "depth", where);
  c.hidden = positive(vc, "hidden_size", where);
  c.heads = positive(vc, "num_heads", where);
  c.intermediate = positive(vc, "intermediate_size", where);
  c.out_hidden = positive(vc, "out_hidden_size", where);
  c.patch = positive(vc, "patch_size", where);
  c.temporal_patch = positive(vc, "temporal_patch_size", where);
  c.merge = positive(vc, "spatial_merge_size", where);
  c.in_channels = opt_int(vc, "in_channels", where).value_or(3);
  c.num_positions = positive(vc, "num_position_embeddings", where);
  const std::string act = opt_string(vc, "hidden_act", where).value_or("gelu_pytorch_tanh");
  if (act != "gelu_pytorch_tanh")
    throw Error(key_where(where, "hidden_act"),
                "'" + act + "' is not implemented (Qwen3-VL's blocks use gelu_pytorch_tanh)");
  if (c.hidden % c.heads != 0 || c.head_dim() % 4 != 0)
    throw Error(where, "hidden_size " + std::to_string(c.hidden) + " / num_heads " +
                           std::to_string(c.heads) +
                           " must be a head dim divisible by 4 (2-D rotary: two halves of pairs)");
  if (c.grid_side() * c.grid_side() != c.num_positions)
    throw Error(key_where(where, "num_position_embeddings"),
                std::to_string(c.num_positions) + " is not a square (the table is a G x G grid)");
  // transformers 5 writes the 2-D rotary as rope_parameters {rope_type: axial, rope_theta}.
  if (auto it = vc.find("rope_parameters"); it != vc.end() && !it->is_null()) {
    const std::string rw = key_where(where, "rope_parameters");
    require_object(*it, rw);
    const std::string type = opt_string(*it, "rope_type", rw).value_or("axial");
    if (type != "axial" && type != "default")
      throw Error(key_where(rw, "rope_type"),
                  "'" + type + "' is not the vision tower's 2-D (axial) rotary");
    c.rope_theta = opt_number(*it, "rope_theta", rw).value_or(10000.0);
    if (!(c.rope_theta > 0.0)) throw Error(key_where(rw, "rope_theta"), "must be positive");
  }
  if (auto it = vc.find("deepstack_visual_indexes"); it != vc.end() && !it->is_null()) {
    const std::string dw = key_where(where, "deepstack_visual_indexes");
    if (!it->is_array()) throw Error(dw, "must be a list of block indices");
    for (const Json& v : *it) {
      const int64_t i = as_int(v, dw);
      if (i < 0 || i >= c.depth)
        throw Error(dw, "block " + std::to_string(i) + " is out of range [0, " +
                            std::to_string(c.depth) + ")");
      c.deepstack_indexes.push_back(i);
    }
  }
  return c;
}

Matrix vision_position_embedding(const Matrix& table, int64_t side, std::span<const GridThw> grids,
                                 int64_t merge) {
  int64_t total = 0;
  for (const GridThw& g : grids)
    total += g.t * g.h * g.w;
  Matrix out(total, table.cols);
  int64_t row = 0;
  const double end = static_cast<double>(side - 1);
  for (const GridThw& g : grids) {
    const std::vector<double> ys = linspace(end, g.h);
    const std::vector<double> xs = linspace(end, g.w);
    // The resampled h x w grid, row-major.
    Matrix grid(g.h * g.w, table.cols);
    for (int64_t r = 0; r < g.h; ++r)
      for (int64_t c = 0; c < g.w; ++c) {
        const auto y0 = static_cast<int64_t>(ys[sz(r)]);
        const auto x0 = static_cast<int64_t>(xs[sz(c)]);
        const int64_t y1 = std::min(y0 + 1, side - 1);
        const int64_t x1 = std::min(x0 + 1, side - 1);
        const double dy = ys[sz(r)] - static_cast<double>(y0);
        const double dx = xs[sz(c)] - static_cast<double>(x0);
        const int64_t idx[4] = {y0 * side + x0, y0 * side + x1, y1 * side + x0, y1 * side + x1};
        const double wt[4] = {(1 - dy) * (1 - dx), (1 - dy) * dx, dy * (1 - dx), dy * dx};
        auto dst = grid.row(r * g.w + c);
        for (int64_t k = 0; k < table.cols; ++k) {
          double s = table(idx[0], k) * wt[0];
          for (int j = 1; j < 4; ++j)
            s += table(idx[j], k) * wt[j];
          dst[sz(k)] = s;
        }
      }
    // Every frame, in merge-window order.
    for (int64_t f = 0; f < g.t; ++f)
      for (int64_t br = 0; br < g.h / merge; ++br)
        for (int64_t bc = 0; bc < g.w / merge; ++bc)
          for (int64_t ir = 0; ir < merge; ++ir)
            for (int64_t ic = 0; ic < merge; ++ic) {
              const auto src = grid.row((br * merge + ir) * g.w + bc * merge + ic);
              std::copy(src.begin(), src.end(), out.row(row++).begin());
            }
  }
  return out;
}

std::vector<std::pair<int64_t, int64_t>> vision_patch_coordinates(std::span<const GridThw> grids,
                                                                  int64_t merge) {
  std::vector<std::pair<int64_t, int64_t>> out;
  for (const GridThw& g : grids)
    for (int64_t f = 0; f < g.t; ++f)
      for (int64_t br = 0; br < g.h / merge; ++br)
        for (int64_t bc = 0; bc < g.w / merge; ++bc)
          for (int64_t ir = 0; ir < merge; ++ir)
            for (int64_t ic = 0; ic < merge; ++ic)
              out.emplace_back(br * merge + ir, bc * merge + ic);
  return out;
}

Matrix layer_norm(const Matrix& x, std::span<const double> w, std::span<const double> b,
                  double eps) {
  Matrix y(x.rows, x.cols);
  const auto n = static_cast<double>(x.cols);
  for (int64_t r = 0; r < x.rows; ++r) {
    const auto in = x.row(r);
    double mean = 0.0;
    for (double v : in)
      mean += v;
    mean /= n;
    double var = 0.0;
    for (double v : in)
      var += (v - mean) * (v - mean);
    var /= n;
    const double inv = 1.0 / std::sqrt(var + eps);
    auto out = y.row(r);
    for (int64_t c = 0; c < x.cols; ++c)
      out[sz(c)] = (in[sz(c)] - mean) * inv * w[sz(c)] + b[sz(c)];
  }
  return y;
}

Qwen3VlVisionTower::Qwen3VlVisionTower(VisionConfig cfg, const Checkpoint& ck)
    : cfg_(std::move(cfg)) {
  auto tensor = [&](const std::string& name, std::vector<uint64_t> shape) {
    const auto it = ck.tensors().find(name);
    if (it == ck.tensors().end())
      throw Error(ck.root().string() + ": tensor '" + name + "'",
                  "missing (the vision tower needs it)");
    const TensorInfo& info = *it->second.info;
    if (info.shape != shape) {
      std::string want, got;
      for (uint64_t d : shape)
        want += (want.empty() ? "" : ", ") + std::to_string(d);
      for (uint64_t d : info.shape)
        got += (got.empty() ? "" : ", ") + std::to_string(d);
      throw Error(ck.root().string() + ": tensor '" + name + "'",
                  "shape [" + got + "], expected [" + want + "] from vision_config");
    }
    uint64_t numel = 1;
    for (uint64_t d : shape)
      numel *= d;
    require_finite_elements(info.dtype, it->second.bytes(), numel, name);
    return decode_all(info.dtype, it->second.bytes(), numel, name);
  };
  auto u = [](int64_t v) { return static_cast<uint64_t>(v); };
  auto lin = [&](const std::string& prefix, int64_t out, int64_t in) {
    Linear l;
    l.w = Matrix(out, in);
    l.w.data = tensor(prefix + ".weight", {u(out), u(in)});
    l.b = tensor(prefix + ".bias", {u(out)});
    return l;
  };
  auto norm = [&](const std::string& prefix, int64_t n) {
    return Norm{tensor(prefix + ".weight", {u(n)}), tensor(prefix + ".bias", {u(n)})};
  };
  const std::string v = "model.visual.";
  const int64_t h = cfg_.hidden;
  patch_embed_.w = Matrix(h, cfg_.patch_dim());
  patch_embed_.w.data =
      tensor(v + "patch_embed.proj.weight",
             {u(h), u(cfg_.in_channels), u(cfg_.temporal_patch), u(cfg_.patch), u(cfg_.patch)});
  patch_embed_.b = tensor(v + "patch_embed.proj.bias", {u(h)});
  pos_table_ = Matrix(cfg_.num_positions, h);
  pos_table_.data = tensor(v + "pos_embed.weight", {u(cfg_.num_positions), u(h)});
  for (int64_t i = 0; i < cfg_.depth; ++i) {
    const std::string p = v + "blocks." + std::to_string(i) + ".";
    blocks_.push_back({norm(p + "norm1", h), norm(p + "norm2", h), lin(p + "attn.qkv", 3 * h, h),
                       lin(p + "attn.proj", h, h), lin(p + "mlp.linear_fc1", cfg_.intermediate, h),
                       lin(p + "mlp.linear_fc2", h, cfg_.intermediate)});
  }
  const int64_t merged = h * cfg_.merge * cfg_.merge;
  merger_ = {norm(v + "merger.norm", h), lin(v + "merger.linear_fc1", merged, merged),
             lin(v + "merger.linear_fc2", cfg_.out_hidden, merged)};
  for (size_t j = 0; j < cfg_.deepstack_indexes.size(); ++j) {
    const std::string p = v + "deepstack_merger_list." + std::to_string(j) + ".";
    deepstack_.push_back({norm(p + "norm", merged), lin(p + "linear_fc1", merged, merged),
                          lin(p + "linear_fc2", cfg_.out_hidden, merged)});
  }
}

VisionOutput Qwen3VlVisionTower::forward(const Matrix& pixels, std::span<const GridThw> grids,
                                         Trace* trace) const {
  const int64_t m = cfg_.merge;
  int64_t total = 0;
  for (size_t i = 0; i < grids.size(); ++i) {
    const GridThw& g = grids[i];
    if (g.t <= 0 || g.h <= 0 || g.w <= 0 || g.h % m != 0 || g.w % m != 0)
      throw Error(
          "image " + std::to_string(i) + " grid (" + std::to_string(g.t) + ", " +
              std::to_string(g.h) + ", " + std::to_string(g.w) + ")",
          "t, h, w must be positive and h, w multiples of spatial_merge_size " + std::to_string(m));
    total += g.t * g.h * g.w;
  }
  if (pixels.rows != total || pixels.cols != cfg_.patch_dim())
    throw Error("pixel_values", "is [" + std::to_string(pixels.rows) + ", " +
                                    std::to_string(pixels.cols) + "]; the grids need [" +
                                    std::to_string(total) + ", " +
                                    std::to_string(cfg_.patch_dim()) + "] (C·T·P·P per patch)");
  for (double x : pixels.data)
    if (!std::isfinite(x)) throw Error("pixel_values", "holds a NaN or Inf");
  auto record = [&](const std::string& name, const Matrix& x) {
    if (trace && trace->wants(name)) trace->record(name, x);
  };

  Matrix h = linear(pixels, patch_embed_.w, patch_embed_.b);
  const Matrix pos = vision_position_embedding(pos_table_, cfg_.grid_side(), grids, m);
  for (size_t i = 0; i < h.data.size(); ++i)
    h.data[i] += pos.data[i];
  record("visual.embed", h);

  // 2-D rotary: cos / sin per patch over the head dim.
  const int64_t d = cfg_.head_dim();
  const std::vector<double> inv_freq = default_inv_freq(cfg_.rope_theta, d / 2);
  const int64_t nf = static_cast<int64_t>(inv_freq.size());  // d / 4
  const auto coords = vision_patch_coordinates(grids, m);
  Matrix cos(total, d), sin(total, d);
  for (int64_t r = 0; r < total; ++r)
    for (int64_t i = 0; i < nf; ++i) {
      const double a_row = static_cast<double>(coords[sz(r)].first) * inv_freq[sz(i)];
      const double a_col = static_cast<double>(coords[sz(r)].second) * inv_freq[sz(i)];
      for (int64_t half : {int64_t{0}, d / 2}) {
        cos(r, half + i) = std::cos(a_row);
        sin(r, half + i) = std::sin(a_row);
        cos(r, half + nf + i) = std::cos(a_col);
        sin(r, half + nf + i) = std::sin(a_col);
      }
    }
  // Attention segments: each frame of each grid.
  std::vector<std::pair<int64_t, int64_t>> segments;
  int64_t start = 0;
  for (const GridThw& g : grids)
    for (int64_t f = 0; f < g.t; ++f) {
      segments.emplace_back(start, start + g.h * g.w);
      start += g.h * g.w;
    }

  const double scale = 1.0 / std::sqrt(static_cast<double>(d));
  const int64_t hid = cfg_.hidden;
  VisionOutput out;
  for (int64_t b = 0; b < cfg_.depth; ++b) {
    const Block& blk = blocks_[sz(b)];
    const Matrix qkv = linear(layer_norm(h, blk.norm1.w, blk.norm1.b, 1e-6), blk.qkv.w, blk.qkv.b);
    // RoPE on q and k (rotate-half): out[j] = x[j]·cos[j] + rot(x)[j]·sin[j].
    Matrix q(total, hid), k(total, hid), v(total, hid);
    for (int64_t r = 0; r < total; ++r)
      for (int64_t head = 0; head < cfg_.heads; ++head)
        for (int64_t j = 0; j < d; ++j) {
          const int64_t base = head * d;
          const int64_t pj = j < d / 2 ? j + d / 2 : j - d / 2;
          const double sign = j < d / 2 ? -1.0 : 1.0;
          const double qj = qkv(r, base + j), kj = qkv(r, hid + base + j);
          const double qp = qkv(r, base + pj), kp = qkv(r, hid + base + pj);
          q(r, base + j) = qj * cos(r, j) + sign * qp * sin(r, j);
          k(r, base + j) = kj * cos(r, j) + sign * kp * sin(r, j);
          v(r, base + j) = qkv(r, 2 * hid + base + j);
        }
    Matrix att(total, hid);
    std::vector<double> p;
    for (const auto& [s0, s1] : segments)
      for (int64_t head = 0; head < cfg_.heads; ++head)
        for (int64_t i = s0; i < s1; ++i) {
          p.assign(sz(s1 - s0), 0.0);
          double mx = -INFINITY;
          for (int64_t j = s0; j < s1; ++j) {
            double dot = 0.0;
            for (int64_t c = 0; c < d; ++c)
              dot += q(i, head * d + c) * k(j, head * d + c);
            p[sz(j - s0)] = dot * scale;
            mx = std::max(mx, p[sz(j - s0)]);
          }
          double den = 0.0;
          for (double& e : p) {
            e = std::exp(e - mx);
            den += e;
          }
          for (int64_t c = 0; c < d; ++c) {
            double acc = 0.0;
            for (int64_t j = s0; j < s1; ++j)
              acc += p[sz(j - s0)] * v(j, head * d + c);
            att(i, head * d + c) = acc / den;
          }
        }
    const Matrix o = linear(att, blk.proj.w, blk.proj.b);
    for (size_t i = 0; i < h.data.size(); ++i)
      h.data[i] += o.data[i];
    Matrix f = linear(layer_norm(h, blk.norm2.w, blk.norm2.b, 1e-6), blk.fc1.w, blk.fc1.b);
    gelu_tanh(f);
    const Matrix mlp = linear(f, blk.fc2.w, blk.fc2.b);
    for (size_t i = 0; i < h.data.size(); ++i)
      h.data[i] += mlp.data[i];
    record("visual.blocks." + std::to_string(b) + ".out", h);
    const auto tap = std::find(cfg_.deepstack_indexes.begin(), cfg_.deepstack_indexes.end(), b);
    if (tap != cfg_.deepstack_indexes.end()) {
      const auto j = static_cast<size_t>(tap - cfg_.deepstack_indexes.begin());
      const Merger& mg = deepstack_[j];
      Matrix z = linear(layer_norm(shuffle_windows(h, m * m), mg.norm.w, mg.norm.b, 1e-6), mg.fc1.w,
                        mg.fc1.b);
      gelu_erf(z);
      out.deepstack.push_back(linear(z, mg.fc2.w, mg.fc2.b));
      record("visual.deepstack." + std::to_string(j), out.deepstack.back());
    }
  }
  Matrix z = linear(shuffle_windows(layer_norm(h, merger_.norm.w, merger_.norm.b, 1e-6), m * m),
                    merger_.fc1.w, merger_.fc1.b);
  gelu_erf(z);
  out.merged = linear(z, merger_.fc2.w, merger_.fc2.b);
  record("visual.merger", out.merged);
  return out;
}

}  // namespace qparity::reference
