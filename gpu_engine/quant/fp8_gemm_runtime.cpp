#include "gpu_engine/quant/fp8_gemm_runtime.h"

#include <algorithm>
#include <unordered_map>

#include "core/codecs/float_format.h"
#include "core/error.h"
#include "gpu_engine/cuda_check.h"
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
  std::vector<float> bias_f32;
  if (std::any_of(bias_values.begin(), bias_values.end(), [](double v) { return v != 0.0; }))
    bias_f32 = exact_f32(bias_values, where + ".bias");
  if (!bias_f32.empty()) bias = DeviceBuffer<float>(bias_f32);
  ws.doubled_codes = packed;
  if (packed) {
    upload_packed(w, n, k, where);
    prepare_blas({}, bias_f32, n, k);
  } else {
    const std::vector<float> grid = upload_bytes(w, where);
    prepare_blas(grid, bias_f32, n, k);
  }
}

namespace {

// Whether a grid of per-row scales ([n, cols], or already one row per 128-row block) is constant
// over every 128-row block aligned to row 0: what 128 x 128 blocks are once fused partitions are
// stacked, when every partition but the last is a multiple of 128 rows (vLLM's and SGLang's
// validate_fp8_block_shape; the reference's process() stores the blocks row by row).
bool rows_share_blocks_impl(const std::vector<float>& grid, int64_t rows, int64_t cols) {
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t c = 0; c < cols; ++c)
      if (grid[static_cast<size_t>(r * cols + c)] !=
          grid[static_cast<size_t>(r / 128 * 128 * cols + c)])
        return false;
  return true;
}

}  // namespace

bool Fp8GemmRuntime::rows_share_blocks(const std::vector<float>& grid, int64_t n,
                                       int64_t cols) const {
  return b_block_rows == 128 || rows_share_blocks_impl(grid, n, cols);
}

void Fp8GemmRuntime::prepare_blas(const std::vector<float>& grid,
                                  const std::vector<float>& bias_values, int64_t n, int64_t k) {
  ws.k = k;
  ws.n = n;
  ws.scale_cols = fp8_act_scale_cols(quant.mode, k, quant.group);
  ws.extra_bytes = sizeof(float);
  blas.reset();
  ws.group_major_cols = 0;
  ws.padded_output = false;
  if (!tensor_cores || packed || weight_only || n % 4 != 0 || quant.mx_bump ||
      quant.nvfp4_global > 0.f)
    return;
  // cuBLASLt adds a bf16 bias in fp32: the same sum only when every value is a bf16 value.
  std::vector<__nv_bfloat16> bias16;
  for (const float v : bias_values) {
    bias16.push_back(__float2bfloat16_rn(v));
    if (__bfloat162float(bias16.back()) != v) return;
  }
  const int64_t b_cols = (k + b_block_cols - 1) / b_block_cols;
  std::vector<float> layout, outer;
  const int64_t groups = (k + 127) / 128;
  if (ws.scale_cols == 1 && b_cols == 1) {
    // A scale per token and one per row (the grid's row scale repeated over its block of rows),
    // each repeated over the 128-column groups, [groups][n] (fp8_blas.h kRow128).
    blas = Fp8BlasScales::kRow128;
    for (int64_t g = 0; g < groups; ++g)
      for (int64_t r = 0; r < n; ++r)
        layout.push_back(grid[static_cast<size_t>(r / b_block_rows)]);
    for (int64_t r = 0; r < n; ++r)
      outer.push_back(grid[static_cast<size_t>(r / b_block_rows)]);
    ws.group_major_cols = groups;
  } else if (quant.mode == Fp8ActMode::kDynamicGroup && quant.group == 128 && b_block_cols == 128 &&
             (b_block_rows == 128 || b_block_rows == 1) && rows_share_blocks(grid, n, b_cols)) {
    // Each row of blocks padded to a multiple of 4 columns (fp8_blas.h); padding never read.
    blas = Fp8BlasScales::kBlock128;
    const int64_t cols = fp8_blas_block_cols(k), rows = (n + 127) / 128;
    layout.assign(static_cast<size_t>(rows * cols), 0.f);
    for (int64_t r = 0; r < rows; ++r)
      for (int64_t c = 0; c < b_cols; ++c)
        layout[static_cast<size_t>(r * cols + c)] =
            grid[static_cast<size_t>((b_block_rows == 1 ? r * 128 : r) * b_cols + c)];
    ws.group_major_cols = groups;
  } else {
    return;
  }
  ws.padded_output = true;
  blas_scales = DeviceBuffer<float>(layout);
  if (!outer.empty()) blas_outer_scales = DeviceBuffer<float>(outer);
  if (!bias16.empty()) blas_bias = DeviceBuffer<__nv_bfloat16>(bias16);
  fp8_blas_prepare();
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

std::vector<float> Fp8GemmRuntime::upload_bytes(const reference::QuantizedMatrix& w,
                                                const std::string& where) {
  codes = DeviceBuffer<uint8_t>(e4m3_bytes(w, where));
  b_block_rows = w.block_rows;
  b_block_cols = w.block_cols;
  if (b_block_cols < w.cols && b_block_cols % 16 != 0)
    throw Error(where, "weight scale blocks of " + std::to_string(b_block_cols) +
                           " columns: the GPU's fp8 GEMM needs multiples of 16");
  std::vector<float> grid = exact_f32(w.scales.data, where + ".weight_scale");
  scales = DeviceBuffer<float>(grid);
  return grid;
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
  // On cuBLASLt (fp8_blas.h) the token count is padded to its multiple of 4: the padding rows'
  // codes and scales are zeros, their products go to the workspace and only t rows to y.
  const bool on_blas = runs_blas(t);
  const int64_t rows = workspace_rows(t);
  auto* base = static_cast<uint8_t*>(workspace);
  QuantizeFp8Params q = quant;
  q.x = x;
  q.q = base;
  q.scales = ActivationWorkspace::at<float>(workspace, ws.scales_offset(rows));
  q.tensor_amax = ActivationWorkspace::at<float>(workspace, ws.extra_offset(rows));
  if (ws.reported_scales)
    q.reported_scales = ActivationWorkspace::at<float>(workspace, ws.reported_offset(rows));
  q.m = t;
  q.k = k;
  if (packed) q.q_doubled = ActivationWorkspace::at<int8_t>(workspace, ws.doubled_offset(rows));
  Fp8BlasParams b;
  if (on_blas) {
    b.a = base;
    b.a_scales = q.scales;
    b.b = codes.get();
    b.scales = blas_mode(rows);
    const bool outer = b.scales == Fp8BlasScales::kOuterVector;
    b.b_scales = outer ? blas_outer_scales.get() : blas_scales.get();
    b.bias = blas_bias.get();
    b.alpha = alpha;
    b.y = rows == t ? y : ActivationWorkspace::at<__nv_bfloat16>(workspace, ws.output_offset(rows));
    b.m = rows;
    b.n = n;
    b.k = k;
    const auto zero = [&](void* p, size_t bytes) {
      QPARITY_CUDA_CHECK(cudaMemsetAsync(p, 0, bytes, stream));
    };
    if (rows > t) {
      zero(base + t * k, static_cast<size_t>((rows - t) * k));
      zero(q.scales + t * ws.scale_cols, static_cast<size_t>((rows - t) * ws.scale_cols) * 4);
    }
    // Outer vectors read the per-token scales as the quantizer writes them, [rows].
    if (ws.group_major_cols > 0 && !outer) {
      q.scales_group_major = ActivationWorkspace::at<float>(workspace, ws.group_major_offset(rows));
      q.group_major_rows = rows;
      q.group_major_repeat = ws.scale_cols == 1 ? ws.group_major_cols : 1;
      b.a_scales = q.scales_group_major;
      // The padding rows' entries lie between the tokens' (token-contiguous per group).
      if (rows > t) zero(q.scales_group_major, static_cast<size_t>(rows * ws.group_major_cols) * 4);
    }
  }
  launch_quantize_fp8(q, stream);
  if (packed) {
    Fp4GemmParams g = fp4();
    g.a = q.q_doubled;
    g.a_scales = q.scales;
    g.a_group = quant.group;
    launch_fp4_scaled_gemm(g, stream);
    return;
  }
  if (on_blas && fp8_blas_gemm(b, stream)) {
    if (rows > t)
      QPARITY_CUDA_CHECK(cudaMemcpyAsync(y, b.y, static_cast<size_t>(t * n) * 2,
                                         cudaMemcpyDeviceToDevice, stream));
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
  const int64_t rows = workspace_rows(t);
  c.scales = ActivationWorkspace::at<float>(
      workspace, ws.reported_scales ? ws.reported_offset(rows) : ws.scales_offset(rows));
  c.scale_cols = ws.scale_cols;
  return c;
}

void Fp8RuntimeMethod::apply(const __nv_bfloat16* x, __nv_bfloat16* y, int64_t t,
                             cudaStream_t stream, void* workspace) const {
  rt_.apply(prefix(), x, y, t, out_features(), in_features(), stream, workspace);
}

size_t Fp8RuntimeMethod::workspace_bytes(int64_t max_tokens) const {
  return rt_.weight_only ? 0 : rt_.ws.bytes(rt_.workspace_rows(max_tokens));
}

GpuLinearMethod::ActivationCodes Fp8RuntimeMethod::activation_codes(const void* workspace,
                                                                    int64_t t) const {
  return rt_.activation_codes(workspace, t);
}

}  // namespace qparity::gpu
