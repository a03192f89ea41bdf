#include "gpu_engine/rope_layout.h"

#include <cstring>

#include "core/codecs/int_packing.h"
#include "core/config/rope_tables.h"
#include "core/error.h"
#include "core/safetensors/safetensors_writer.h"

namespace qparity::gpu {

bool needs_rope_relayout(const ModelConfig& cfg) {
  return cfg.rope_interleaved || (cfg.rotary_dim > 0 && cfg.rotary_dim != cfg.head_dim);
}

std::vector<int64_t> rope_positions(const ModelConfig& cfg) {
  const int64_t d = cfg.head_dim, r = cfg.rotary_dim > 0 ? cfg.rotary_dim : d;
  std::vector<int64_t> pos(static_cast<size_t>(d));
  if (!needs_rope_relayout(cfg)) {
    for (int64_t j = 0; j < d; ++j)
      pos[static_cast<size_t>(j)] = j;
    return pos;
  }
  for (int64_t i = 0; i < r / 2; ++i) {
    const int64_t lo = cfg.rope_interleaved ? 2 * i : i;
    const int64_t hi = cfg.rope_interleaved ? 2 * i + 1 : i + r / 2;
    pos[static_cast<size_t>(lo)] = i;
    pos[static_cast<size_t>(hi)] = i + d / 2;
  }
  const int64_t pass = d - r;  // pass-through dims fill the free positions in order
  for (int64_t m = 0; m < pass; ++m)
    pos[static_cast<size_t>(r + m)] = m < pass / 2 ? r / 2 + m : d / 2 + r / 2 + (m - pass / 2);
  return pos;
}

std::vector<double> rotate_half_inv_freq(const ModelConfig& cfg) {
  const RopeTable rope = rope_table(cfg);
  std::vector<double> f(static_cast<size_t>(cfg.head_dim / 2), 0.0);
  for (size_t i = 0; i < rope.inv_freq.size(); ++i)
    f[i] = rope.inv_freq[i];
  return f;
}

namespace {

int64_t physical(const ColumnMap& padded, int64_t logical) {
  return padded.empty() ? logical : padded[static_cast<size_t>(logical)];
}

}  // namespace

ColumnMap rope_columns(const ColumnMap& padded, int64_t heads, const ModelConfig& cfg) {
  if (!needs_rope_relayout(cfg)) return padded;
  const std::vector<int64_t> pos = rope_positions(cfg);
  const int64_t d = cfg.head_dim;
  ColumnMap out;
  for (int64_t h = 0; h < heads; ++h)
    for (int64_t j = 0; j < d; ++j)
      out.push_back(physical(padded, h * d + pos[static_cast<size_t>(j)]));
  return out;
}

ColumnMap rope_qkv_columns(const ColumnMap& padded_qkv, const ModelConfig& cfg) {
  if (!needs_rope_relayout(cfg)) return padded_qkv;
  const std::vector<int64_t> pos = rope_positions(cfg);
  const int64_t d = cfg.head_dim, qk = cfg.q_size() + cfg.kv_size();
  ColumnMap out;
  for (int64_t c = 0; c < qk + cfg.kv_size(); ++c) {
    const int64_t logical = c < qk ? (c / d) * d + pos[static_cast<size_t>(c % d)] : c;
    out.push_back(physical(padded_qkv, logical));
  }
  return out;
}

std::vector<int32_t> kernel_qkv_sources(const ModelConfig& cfg) {
  const std::vector<int64_t> pos = rope_positions(cfg);
  const int64_t d = cfg.head_dim, q = cfg.q_size(), kv = cfg.kv_size();
  const int64_t q_rows = cfg.attn_output_gate ? 2 * q : q;  // q_proj's own rows
  // inv[p]: the logical dim a head holds at physical position p.
  std::vector<int64_t> inv(static_cast<size_t>(d));
  for (int64_t j = 0; j < d; ++j)
    inv[static_cast<size_t>(pos[static_cast<size_t>(j)])] = j;
  const int64_t q_head_rows = cfg.attn_output_gate ? 2 * d : d;
  std::vector<int32_t> src;
  for (int64_t h = 0; h < cfg.num_heads; ++h)
    for (int64_t p = 0; p < d; ++p)
      src.push_back(static_cast<int32_t>(h * q_head_rows + inv[static_cast<size_t>(p)]));
  for (int64_t h = 0; h < cfg.num_kv_heads; ++h)
    for (int64_t p = 0; p < d; ++p)
      src.push_back(static_cast<int32_t>(q_rows + h * d + inv[static_cast<size_t>(p)]));
  for (int64_t c = 0; c < kv; ++c)
    src.push_back(static_cast<int32_t>(q_rows + kv + c));
  if (cfg.attn_output_gate)
    for (int64_t h = 0; h < cfg.num_heads; ++h)
      for (int64_t j = 0; j < d; ++j)
        src.push_back(static_cast<int32_t>(h * 2 * d + d + j));
  return src;
}

Checkpoint relayout_rope_rows(Checkpoint ck, const ModelConfig& cfg, bool move_projection_rows) {
  if (!needs_rope_relayout(cfg)) return ck;
  if (cfg.head_dim % 2 != 0 || (cfg.rotary_dim % 2 != 0) || (cfg.head_dim - cfg.rotary_dim) % 2)
    throw Error("config.json", "RoPE re-layout needs even head_dim and rotary_dim");
  const std::vector<int64_t> pos = rope_positions(cfg);
  const int64_t d = cfg.head_dim;
  // Heads of `head_rows` rows whose first d rows are the head's q or k (a gated q_proj: per head
  // [q (d) | gate (d)], the gate rows staying where they are).
  int64_t head_rows = d;
  // `rows` rows of `row_bytes` each, row r moved to its head's re-laid-out position.
  const auto moved_rows = [&](std::span<const uint8_t> src, int64_t rows, size_t row_bytes) {
    std::vector<uint8_t> dst(src.size());
    for (int64_t r = 0; r < rows; ++r) {
      const int64_t w = r % head_rows;
      const int64_t to = (r / head_rows) * head_rows + (w < d ? pos[static_cast<size_t>(w)] : w);
      std::memcpy(dst.data() + static_cast<size_t>(to) * row_bytes,
                  src.data() + static_cast<size_t>(r) * row_bytes, row_bytes);
    }
    return dst;
  };
  std::vector<std::vector<uint8_t>> images;
  std::vector<TensorToWrite> out;
  for (const auto& [name, ref] : ck.tensors()) {
    const bool q = name.find(".self_attn.q_proj.") != std::string::npos;
    const bool k = name.find(".self_attn.k_proj.") != std::string::npos;
    const TensorInfo& t = *ref.info;
    const auto src = ref.bytes();
    // Qwen3.5's q / k norms weigh a head's dims before RoPE: their [head_dim] weights follow
    // the dims.
    if ((name.ends_with(".self_attn.q_norm.weight") ||
         name.ends_with(".self_attn.k_norm.weight")) &&
        t.shape.size() == 1 && static_cast<int64_t>(t.shape[0]) == d) {
      head_rows = d;
      images.push_back(moved_rows(src, d, t.nbytes() / t.shape[0]));
      out.push_back({name, t.dtype, t.shape, std::span<const uint8_t>(images.back())});
      continue;
    }
    if (!q && !k) continue;
    if (t.numel() == 1 || !move_projection_rows) continue;
    const int64_t rows = q ? cfg.q_proj_size() : cfg.kv_size();
    head_rows = q && cfg.attn_output_gate ? 2 * d : d;
    if (t.dtype == DType::kI8 && t.shape.size() == 2 &&
        static_cast<int64_t>(t.shape[0]) * 2 == rows && name.ends_with(".weight")) {
      // msModelSlim W4A8_DYNAMIC: two int4 rows a byte along N. Unpacked, re-laid out, packed
      // again: the pairs the engine's loader unpacks are then physical rows (2j, 2j + 1).
      const auto cols = static_cast<size_t>(t.shape[1]);
      const std::vector<int8_t> codes = codec::unpack_int4_row_pairs(
          std::span<const int8_t>(reinterpret_cast<const int8_t*>(src.data()), src.size()),
          static_cast<size_t>(rows), cols, ck.origin(name));
      const std::vector<uint8_t> moved = moved_rows(
          std::span<const uint8_t>(reinterpret_cast<const uint8_t*>(codes.data()), codes.size()),
          rows, cols);
      const std::vector<int8_t> packed = codec::pack_int4_row_pairs(
          std::span<const int8_t>(reinterpret_cast<const int8_t*>(moved.data()), moved.size()),
          static_cast<size_t>(rows), cols, ck.origin(name));
      images.emplace_back(packed.begin(), packed.end());
    } else if (t.shape.empty() || static_cast<int64_t>(t.shape[0]) != rows) {
      throw Error(ck.origin(name),
                  "the engine re-lays out " + cfg.arch_name +
                      "'s q / k rows for its rotate-half RoPE kernels; this tensor's first "
                      "dimension is not the " +
                      std::to_string(rows) + " output rows");
    } else {
      images.push_back(moved_rows(src, rows, t.nbytes() / t.shape[0]));
    }
    out.push_back({name, t.dtype, t.shape, std::span<const uint8_t>(images.back())});
  }
  if (out.empty()) return ck;
  // (Spans stay valid as `images` grows: moving a vector keeps its buffer.)
  std::vector<uint8_t> image = serialize_safetensors(std::move(out), std::nullopt);
  const std::filesystem::path name = ck.root() / "rope-relayout";
  return Checkpoint::overlaid(std::move(ck), SafetensorsFile::from_image(std::move(image), name));
}

}  // namespace qparity::gpu
