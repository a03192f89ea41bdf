#include "core/safetensors/gpt_oss_names.h"

#include <cstring>
#include <deque>
#include <map>
#include <optional>

#include "core/error.h"
#include "core/safetensors/safetensors_writer.h"

namespace qparity {

namespace {

std::string shape_text(const std::vector<uint64_t>& s) {
  std::string out = "[";
  for (size_t i = 0; i < s.size(); ++i)
    out += (i ? ", " : "") + std::to_string(s[i]);
  return out + "]";
}

bool is_float_dtype(DType d) {
  return d == DType::kBF16 || d == DType::kF16 || d == DType::kF32;
}

size_t element_bytes(DType d) {
  return dtype_bits(d) / 8;
}

// dst[c][r] = src[r][c] for a [rows, cols] matrix of `es`-byte elements.
void transpose_into(const uint8_t* src, uint8_t* dst, uint64_t rows, uint64_t cols, size_t es) {
  for (uint64_t r = 0; r < rows; ++r)
    for (uint64_t c = 0; c < cols; ++c)
      std::memcpy(dst + (c * rows + r) * es, src + (r * cols + c) * es, es);
}

// The stack tensors one layer's experts may have, by suffix.
struct StackPart {
  const char* suffix;
  bool packed;  // U8 blocks / scales (MXFP4) rather than float
};
constexpr StackPart kStackParts[] = {
    {"gate_up_proj", false},    {"gate_up_proj_bias", false},  {"down_proj", false},
    {"down_proj_bias", false},  {"gate_up_proj_blocks", true}, {"gate_up_proj_scales", true},
    {"down_proj_blocks", true}, {"down_proj_scales", true},
};

}  // namespace

Checkpoint gpt_oss_expert_view(Checkpoint raw, const ModelConfig& cfg) {
  if (cfg.arch != Arch::kGptOss) return raw;
  const uint64_t E = static_cast<uint64_t>(cfg.num_experts);
  const uint64_t H = static_cast<uint64_t>(cfg.hidden);
  const uint64_t I = static_cast<uint64_t>(cfg.moe_intermediate_size);
  const std::string root = raw.root().string();
  std::vector<std::string> consumed;
  // Owned bytes of the derived tensors (TensorToWrite only points at them).
  std::deque<std::vector<uint8_t>> store;
  std::vector<TensorToWrite> out;
  std::map<std::string, std::string> source_of;
  std::string current;  // the stack tensor being sliced
  auto add = [&](std::string name, DType dt, std::vector<uint64_t> shape,
                 std::vector<uint8_t> bytes) {
    source_of[name] = current;
    store.push_back(std::move(bytes));
    out.push_back({std::move(name), dt, std::move(shape), store.back()});
  };
  for (int64_t layer = 0; layer < cfg.num_layers; ++layer) {
    const std::string s = "model.layers." + std::to_string(layer) + ".mlp.experts";
    for (const StackPart& part : kStackParts) {
      const std::string name = s + "." + part.suffix;
      if (!raw.contains(name)) continue;
      const TensorRef& ref = raw.at(name);
      const TensorInfo& t = *ref.info;
      current = name;
      const std::string where = root + ": tensor '" + name + "'";
      const std::string sfx = part.suffix;
      const bool gate_up = sfx.starts_with("gate_up");
      const uint64_t k_in = gate_up ? H : I;       // the stack's input features
      const uint64_t n_out = gate_up ? 2 * I : H;  // its output rows (gate/up interleaved)
      std::vector<uint64_t> want;
      if (sfx == "gate_up_proj") want = {E, H, 2 * I};
      if (sfx == "down_proj") want = {E, I, H};
      if (sfx == "gate_up_proj_bias") want = {E, 2 * I};
      if (sfx == "down_proj_bias") want = {E, H};
      if (sfx.ends_with("_blocks")) want = {E, n_out, k_in / 32, 16};
      if (sfx.ends_with("_scales")) want = {E, n_out, k_in / 32};
      if (part.packed && k_in % 32 != 0)
        throw Error(where, "MXFP4 blocks need the input size " + std::to_string(k_in) +
                               " to be a multiple of 32");
      if (part.packed ? t.dtype != DType::kU8 : !is_float_dtype(t.dtype))
        throw Error(where, std::string("expected ") + (part.packed ? "U8" : "a float dtype") +
                               ", got " + std::string(dtype_name(t.dtype)));
      if (t.shape != want)
        throw Error(where, "expected shape " + shape_text(want) + " (gpt-oss expert stack), got " +
                               shape_text(t.shape));
      if (part.packed) {
        const std::string other = sfx.ends_with("_blocks")
                                      ? s + "." + sfx.substr(0, sfx.size() - 7) + "_scales"
                                      : s + "." + sfx.substr(0, sfx.size() - 7) + "_blocks";
        if (!raw.contains(other))
          throw Error(where, "has no '" + other + "' beside it (MXFP4 blocks and scales pair)");
      }
      const std::span<const uint8_t> src = ref.bytes();
      const size_t es = element_bytes(t.dtype);
      const DType dt = t.dtype;
      // Per expert: the bytes of one expert's slice.
      const uint64_t per_expert = src.size() / E;
      for (uint64_t e = 0; e < E; ++e) {
        const uint8_t* x = src.data() + e * per_expert;
        const std::string ep = s + "." + std::to_string(e);
        if (sfx == "gate_up_proj") {  // [H, 2I] -> gate, up [I, H]
          std::vector<uint8_t> g(I * H * es), u(I * H * es);
          for (uint64_t h = 0; h < H; ++h)
            for (uint64_t i = 0; i < I; ++i) {
              std::memcpy(g.data() + (i * H + h) * es, x + (h * 2 * I + 2 * i) * es, es);
              std::memcpy(u.data() + (i * H + h) * es, x + (h * 2 * I + 2 * i + 1) * es, es);
            }
          add(ep + ".gate_proj.weight", dt, {I, H}, std::move(g));
          add(ep + ".up_proj.weight", dt, {I, H}, std::move(u));
        } else if (sfx == "down_proj") {  // [I, H] -> [H, I]
          std::vector<uint8_t> d(H * I * es);
          transpose_into(x, d.data(), I, H, es);
          add(ep + ".down_proj.weight", dt, {H, I}, std::move(d));
        } else if (sfx == "gate_up_proj_bias") {
          std::vector<uint8_t> g(I * es), u(I * es);
          for (uint64_t i = 0; i < I; ++i) {
            std::memcpy(g.data() + i * es, x + 2 * i * es, es);
            std::memcpy(u.data() + i * es, x + (2 * i + 1) * es, es);
          }
          add(ep + ".gate_proj.bias", dt, {I}, std::move(g));
          add(ep + ".up_proj.bias", dt, {I}, std::move(u));
        } else if (sfx == "down_proj_bias") {
          add(ep + ".down_proj.bias", dt, {H}, std::vector<uint8_t>(x, x + H * es));
        } else {
          const bool blocks = sfx.ends_with("_blocks");
          const uint64_t row = blocks ? k_in / 2 : k_in / 32;  // bytes per output row
          const std::string tn = blocks ? ".weight_packed" : ".weight_scale";
          if (gate_up) {
            std::vector<uint8_t> g(I * row), u(I * row);
            for (uint64_t i = 0; i < I; ++i) {
              std::memcpy(g.data() + i * row, x + 2 * i * row, row);
              std::memcpy(u.data() + i * row, x + (2 * i + 1) * row, row);
            }
            add(ep + ".gate_proj" + tn, dt, {I, row}, std::move(g));
            add(ep + ".up_proj" + tn, dt, {I, row}, std::move(u));
          } else {
            add(ep + ".down_proj" + tn, dt, {H, row}, std::vector<uint8_t>(x, x + H * row));
          }
        }
      }
      consumed.push_back(name);
    }
  }
  if (consumed.empty()) return raw;
  SafetensorsFile image = SafetensorsFile::from_image(
      serialize_safetensors(std::move(out), std::nullopt), root + " (gpt-oss experts, per expert)");
  return Checkpoint::derived(std::move(raw), std::move(image), consumed, source_of,
                             "a gpt-oss expert stack's slice, copied per expert");
}

std::vector<GptOssStackTensor> gpt_oss_stack_tensors(
    const ModelConfig& cfg, int64_t layer, const std::string& kind,
    const std::vector<GptOssExpertTensors>& experts) {
  const uint64_t E = static_cast<uint64_t>(cfg.num_experts);
  const uint64_t H = static_cast<uint64_t>(cfg.hidden);
  const uint64_t I = static_cast<uint64_t>(cfg.moe_intermediate_size);
  const std::string s = "model.layers." + std::to_string(layer) + ".mlp.experts";
  if (experts.size() != E)
    throw Error(
        s, "expected " + std::to_string(E) + " experts, got " + std::to_string(experts.size()));
  const DType dt = experts.front().dtype;
  const size_t es = kind == "weight_packed" || kind == "weight_scale" ? 1 : element_bytes(dt);
  // Per expert: gate / up rows, their row bytes, and down's.
  uint64_t gu_row = 0, d_row = 0;
  if (kind == "weight")
    gu_row = H * es, d_row = I * es;
  else if (kind == "bias")
    gu_row = es, d_row = H * es;
  else if (kind == "weight_packed")
    gu_row = H / 2, d_row = I / 2;
  else if (kind == "weight_scale")
    gu_row = H / 32, d_row = I / 32;
  else
    throw Error(s, "no gpt-oss stack layout for tensor kind '" + kind + "'");
  const uint64_t gu_rows = kind == "bias" ? I : I;  // rows of gate (and of up) per expert
  for (const GptOssExpertTensors& x : experts)
    if (x.dtype != dt || x.gate.size() != gu_rows * gu_row || x.up.size() != gu_rows * gu_row ||
        x.down.size() != (kind == "bias" ? d_row : H * d_row))
      throw Error(s, "expert tensors of kind '" + kind + "' differ in dtype or size");
  GptOssStackTensor gu, dn;
  gu.dtype = dn.dtype = dt;
  if (kind == "weight") {
    gu = {s + ".gate_up_proj", dt, {E, H, 2 * I}, std::vector<uint8_t>(E * H * 2 * I * es)};
    dn = {s + ".down_proj", dt, {E, I, H}, std::vector<uint8_t>(E * I * H * es)};
    for (uint64_t e = 0; e < E; ++e) {
      uint8_t* g = gu.bytes.data() + e * H * 2 * I * es;
      for (uint64_t i = 0; i < I; ++i)
        for (uint64_t h = 0; h < H; ++h) {
          std::memcpy(g + (h * 2 * I + 2 * i) * es, experts[e].gate.data() + (i * H + h) * es, es);
          std::memcpy(g + (h * 2 * I + 2 * i + 1) * es, experts[e].up.data() + (i * H + h) * es,
                      es);
        }
      transpose_into(experts[e].down.data(), dn.bytes.data() + e * I * H * es, H, I, es);
    }
  } else if (kind == "bias") {
    gu = {s + ".gate_up_proj_bias", dt, {E, 2 * I}, std::vector<uint8_t>(E * 2 * I * es)};
    dn = {s + ".down_proj_bias", dt, {E, H}, std::vector<uint8_t>(E * H * es)};
    for (uint64_t e = 0; e < E; ++e) {
      for (uint64_t i = 0; i < I; ++i) {
        std::memcpy(gu.bytes.data() + (e * 2 * I + 2 * i) * es, experts[e].gate.data() + i * es,
                    es);
        std::memcpy(gu.bytes.data() + (e * 2 * I + 2 * i + 1) * es, experts[e].up.data() + i * es,
                    es);
      }
      std::memcpy(dn.bytes.data() + e * H * es, experts[e].down.data(), H * es);
    }
  } else {
    const bool blocks = kind == "weight_packed";
    const std::string sfx = blocks ? "_blocks" : "_scales";
    std::vector<uint64_t> gshape = {E, 2 * I, H / 32}, dshape = {E, H, I / 32};
    if (blocks) gshape.push_back(16), dshape.push_back(16);
    gu = {s + ".gate_up_proj" + sfx, dt, gshape, std::vector<uint8_t>(E * 2 * I * gu_row)};
    dn = {s + ".down_proj" + sfx, dt, dshape, std::vector<uint8_t>(E * H * d_row)};
    for (uint64_t e = 0; e < E; ++e) {
      uint8_t* g = gu.bytes.data() + e * 2 * I * gu_row;
      for (uint64_t i = 0; i < I; ++i) {
        std::memcpy(g + 2 * i * gu_row, experts[e].gate.data() + i * gu_row, gu_row);
        std::memcpy(g + (2 * i + 1) * gu_row, experts[e].up.data() + i * gu_row, gu_row);
      }
      std::memcpy(dn.bytes.data() + e * H * d_row, experts[e].down.data(), H * d_row);
    }
  }
  return {std::move(gu), std::move(dn)};
}

}  // namespace qparity
