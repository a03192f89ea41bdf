#include "gpu_engine/quant/fp8_gemm_runtime.h"

#include <algorithm>
#include <unordered_map>

#include "core/codecs/float_format.h"
#include "core/error.h"
#include "gpu_engine/quant/upload_util.h"
#include "schemes/math/mx_scale.h"
#include "schemes/method/parallel.h"

namespace qparity::gpu {

void set_fp8_activation_rule(const reference::Fp8ScaleRule& rule, const std::string& dialect,
                             const std::string& where, QuantizeFp8Params* q) {
  if (rule.arith != reference::Arith::kFp32 || rule.ue8m0 || rule.zero_scale > 0)
    throw Error(where, "the fp8 activation rule of dialect " + dialect +
                           " (UE8M0 scales, or arithmetic other than fp32) is not on the GPU");
  q->multiply_reciprocal = rule.use == reference::ScaleUse::kMultiplyReciprocal;
  q->amax_floor = static_cast<float>(rule.amax_floor);
  q->min_scale = static_cast<float>(rule.min_scale);
  q->zero_saturates = rule.zero_saturates;
}

void Fp8GemmRuntime::upload(const reference::QuantizedMatrix& w,
                            const std::vector<double>& bias_values, int64_t n, int64_t k,
                            const std::string& where) {
  require_processed_shape(w.rows, w.cols, n, k, where);
  if (k % 16 != 0)
    throw Error(where, "in_features " + std::to_string(k) +
                           " must be a multiple of 16 for the GPU's fp8 GEMM");
  if (packed) {
    upload_packed(w, n, k, where);
  } else {
    upload_bytes(w, where);
  }
  if (std::any_of(bias_values.begin(), bias_values.end(), [](double v) { return v != 0.0; }))
    bias = DeviceBuffer<float>(exact_f32(bias_values, where + ".bias"));
  ws.k = k;
  ws.n = n;
  ws.scale_cols = fp8_act_scale_cols(quant.mode, k, quant.group);
  ws.extra_bytes = sizeof(float);
  ws.doubled_codes = packed;
}

std::vector<uint8_t> e4m3_bytes(const reference::QuantizedMatrix& w, const std::string& where) {
  const int64_t k = w.cols;
  std::vector<uint8_t> bytes(static_cast<size_t>(w.rows * w.cols));
  // A weight holds few distinct codes (at most the 253 finite e4m3fn values): each is encoded and
  // checked once per block of rows and looked up after, the same bytes as encoding every element
  // (an 8B layer's 218 M elements: seconds, not a minute). Row blocks run in parallel; the error
  // is the first bad element in row-major order whatever the thread count (parallel_chunks
  // rethrows the lowest block's).
  reference::parallel_chunks(w.rows, w.rows * w.cols, [&](int64_t r0, int64_t r1) {
    std::unordered_map<int64_t, uint8_t> byte_of;
    std::vector<int64_t> row(static_cast<size_t>(k));
    for (int64_t r = r0; r < r1; ++r) {
      w.row_codes(r, row);
      for (int64_t c = 0; c < k; ++c) {
        const int64_t code = row[static_cast<size_t>(c)];
        auto it = byte_of.find(code);
        if (it == byte_of.end()) {
          const double v = static_cast<double>(code) * w.lattice;
          const uint8_t b = codec::double_to_e4m3fn(v, codec::Overflow::kSaturate);
          if (codec::e4m3fn_to_double(b) != v)
            throw Error(where, "weight element (" + std::to_string(r) + ", " + std::to_string(c) +
                                   ") is not an e4m3fn value");
          it = byte_of.emplace(code, b).first;
        }
        bytes[static_cast<size_t>(r * k + c)] = it->second;
      }
    }
  });
  return bytes;
}

void Fp8GemmRuntime::upload_bytes(const reference::QuantizedMatrix& w, const std::string& where) {
  codes = DeviceBuffer<uint8_t>(e4m3_bytes(w, where));
  b_block_rows = w.block_rows;
  b_block_cols = w.block_cols;
  if (b_block_cols < w.cols && b_block_cols % 16 != 0)
    throw Error(where, "weight scale blocks of " + std::to_string(b_block_cols) +
                           " columns: the GPU's fp8 GEMM needs multiples of 16");
  scales = DeviceBuffer<float>(exact_f32(w.scales.data, where + ".weight_scale"));
}

void Fp8GemmRuntime::upload_packed(const reference::QuantizedMatrix& w, int64_t n, int64_t k,
                                   const std::string& where) {
  const int64_t group = packed_scale == Fp4BlockScale::kE4m3Group16 ? 16 : 32;
  if (w.block_rows != 1 || w.block_cols != group)
    throw Error(where,
                "a packed e2m1 weight needs [1, " + std::to_string(group) + "] scale blocks");
  if (k % 32 != 0)
    throw Error(where, "in_features " + std::to_string(k) +
                           " must be a multiple of 32 for the packed fp4 GEMM (16 bytes of "
                           "codes a lane)");
  // The checkpoint's own byte forms (each an Error naming the tensor where a value has none):
  // nibble pairs as compressed-tensors packs them, e4m3fn or E8M0 scale bytes.
  codes = DeviceBuffer<uint8_t>(
      reference::encode_element_rows(w, 0, n, reference::MxElem::kE2M1, where + ".weight_packed")
          .bytes);
  const DType scale_dtype =
      packed_scale == Fp4BlockScale::kE4m3Group16 ? DType::kF8E4M3 : DType::kF8E8M0;
  scale_bytes =
      DeviceBuffer<uint8_t>(reference::encode(scale_dtype, {n, k / group}, w.scales.data,
                                              reference::Encoding::kExact, where + ".weight_scale")
                                .bytes);
}

void Fp8GemmRuntime::apply(const std::string& name, const __nv_bfloat16* x, __nv_bfloat16* y,
                           int64_t t, int64_t n, int64_t k, cudaStream_t stream,
                           void* workspace) const {
  // The packed weight's part of the fp4 GEMM; the activations are added below.
  const auto fp4 = [&] {
    Fp4GemmParams g;
    g.b = codes.get();
    g.b_scales = scale_bytes.get();
    g.b_scale = packed_scale;
    g.bias = bias.get();
    g.alpha = alpha;
    g.y = y;
    g.m = t;
    g.n = n;
    g.k = k;
    return g;
  };
  if (packed && weight_only) {
    Fp4GemmParams g = fp4();
    g.x = x;
    launch_fp4_scaled_gemm(g, stream);
    return;
  }
  if (!workspace) throw Error(name, "fp8 and MX linears need the engine's workspace");
  auto* base = static_cast<uint8_t*>(workspace);
  QuantizeFp8Params q = quant;
  q.x = x;
  q.q = base;
  q.scales = ActivationWorkspace::at<float>(workspace, ws.scales_offset(t));
  q.tensor_amax = ActivationWorkspace::at<float>(workspace, ws.extra_offset(t));
  if (ws.reported_scales)
    q.reported_scales = ActivationWorkspace::at<float>(workspace, ws.reported_offset(t));
  q.m = t;
  q.k = k;
  if (packed) q.q_doubled = ActivationWorkspace::at<int8_t>(workspace, ws.doubled_offset(t));
  launch_quantize_fp8(q, stream);
  if (packed) {
    Fp4GemmParams g = fp4();
    g.a = q.q_doubled;
    g.a_scales = q.scales;
    g.a_group = quant.group;
    launch_fp4_scaled_gemm(g, stream);
    return;
  }
  Fp8GemmParams g;
  g.a = base;
  g.a_scales = q.scales;
  g.a_group = quant.mode == Fp8ActMode::kDynamicGroup ? quant.group : k;
  g.b = codes.get();
  g.b_scales = scales.get();
  g.b_block_rows = b_block_rows;
  g.b_block_cols = b_block_cols;
  g.bias = bias.get();
  g.alpha = alpha;
  g.y = y;
  g.m = t;
  g.n = n;
  g.k = k;
  launch_fp8_scaled_gemm(g, stream);
}

GpuLinearMethod::ActivationCodes Fp8GemmRuntime::activation_codes(const void* workspace,
                                                                  int64_t t) const {
  if (weight_only) return {};
  GpuLinearMethod::ActivationCodes c;
  c.kind = GpuLinearMethod::ActivationCodes::Kind::kFp8E4m3;
  c.values = workspace;
  c.scales = ActivationWorkspace::at<float>(
      workspace, ws.reported_scales ? ws.reported_offset(t) : ws.scales_offset(t));
  c.scale_cols = ws.scale_cols;
  return c;
}

void Fp8RuntimeMethod::apply(const __nv_bfloat16* x, __nv_bfloat16* y, int64_t t,
                             cudaStream_t stream, void* workspace) const {
  rt_.apply(prefix(), x, y, t, out_features(), in_features(), stream, workspace);
}

size_t Fp8RuntimeMethod::workspace_bytes(int64_t max_tokens) const {
  return rt_.weight_only ? 0 : rt_.ws.bytes(max_tokens);
}

GpuLinearMethod::ActivationCodes Fp8RuntimeMethod::activation_codes(const void* workspace,
                                                                    int64_t t) const {
  return rt_.activation_codes(workspace, t);
}

}  // namespace qparity::gpu
