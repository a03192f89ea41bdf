#include "gpu_engine/quant/upload_util.h"

#include "core/error.h"

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
    throw Error(host.shape().prefix, "expert " + std::to_string(expert) + " outside [0, " +
                                         std::to_string(n) + ")");
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

}  // namespace qparity::gpu
