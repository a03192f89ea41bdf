#include "gpu_engine/quant/upload_util.h"

#include "core/error.h"
#include "gpu_engine/kernels/column_gather.h"

namespace qparity::gpu {

int64_t method_expert(const reference::LinearMethod& host, int64_t expert) {
  const int64_t n = host.shape().num_experts;
  if (expert < 0) {
    if (n > 0)
      throw Error(host.shape().prefix,
                  "an expert stack: the GPU takes it one expert at a time (expert >= 0)");
    return 0;
  }
  if (expert >= n)
    throw Error(host.shape().prefix,
                "expert " + std::to_string(expert) + " outside [0, " + std::to_string(n) + ")");
  return expert;
}

std::string method_prefix(const reference::LinearMethod& host, int64_t expert) {
  return expert < 0 ? host.shape().prefix
                    : host.shape().prefix + ".experts." + std::to_string(expert);
}

reference::ProcessedIntWeight processed_int_weight_of(const reference::LinearMethod& host,
                                                      int64_t expert) {
  const std::string where = method_prefix(host, expert);
  auto w = host.processed_int_weight(method_expert(host, expert));
  if (!w)
    throw Error(where, "scheme " + to_string(host.config().scheme) +
                           " has no integer weight the GPU methods can take");
  return std::move(*w);
}

void require_processed_shape(int64_t rows, int64_t cols, int64_t n, int64_t k,
                             const std::string& where) {
  if (rows != n || cols != k)
    throw Error(where, "processed weight is [" + std::to_string(rows) + ", " +
                           std::to_string(cols) + "], the layer is [" + std::to_string(n) + ", " +
                           std::to_string(k) + "]");
}

std::vector<int32_t> gather_columns_of(const std::vector<int64_t>& perm, int64_t k,
                                       const std::string& where) {
  if (perm.empty()) return {};
  if (static_cast<int64_t>(perm.size()) != k)
    throw Error(where, "act-order permutation of " + std::to_string(perm.size()) +
                           " columns, the layer has " + std::to_string(k));
  std::vector<int32_t> out(perm.size());
  std::vector<bool> seen(perm.size(), false);
  for (size_t j = 0; j < perm.size(); ++j) {
    const int64_t c = perm[j];
    if (c < 0 || c >= k || seen[static_cast<size_t>(c)])
      throw Error(where, "act-order column " + std::to_string(c) + " at position " +
                             std::to_string(j) + " is outside [0, k) or repeated");
    seen[static_cast<size_t>(c)] = true;
    out[j] = static_cast<int32_t>(c);
  }
  return out;
}

size_t gathered_input_bytes(int64_t t, int64_t k) {
  return (static_cast<size_t>(t * k) * sizeof(__nv_bfloat16) + 255) / 256 * 256;
}

const __nv_bfloat16* gather_input(const __nv_bfloat16* x, const int32_t* perm, int64_t t, int64_t k,
                                  void* dst, const std::string& where, cudaStream_t stream) {
  if (!dst) throw Error(where, "act order gathers its inputs into the engine's workspace");
  auto* out = static_cast<__nv_bfloat16*>(dst);
  launch_column_gather({.src = x,
                        .dst = out,
                        .sources = perm,
                        .rows = t,
                        .cols = k,
                        .src_stride = k,
                        .dst_stride = k},
                       stream);
  return out;
}

std::vector<float> exact_f32(const std::vector<double>& v, const std::string& where) {
  std::vector<float> out(v.size());
  for (size_t i = 0; i < v.size(); ++i) {
    out[i] = static_cast<float>(v[i]);
    if (static_cast<double>(out[i]) != v[i])
      throw Error(where, "value " + std::to_string(v[i]) + " at element " + std::to_string(i) +
                             " is not an fp32 value; the GPU kernels hold it in fp32");
  }
  return out;
}

bool all_bf16_values(const std::vector<double>& v) {
  for (double d : v) {
    const float f = static_cast<float>(d);
    if (static_cast<double>(f) != d) return false;
    if (static_cast<double>(__bfloat162float(__float2bfloat16_rn(f))) != d) return false;
  }
  return true;
}

}  // namespace qparity::gpu
