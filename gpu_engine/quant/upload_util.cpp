#include "gpu_engine/quant/upload_util.h"

#include "core/error.h"

namespace qparity::gpu {

reference::ProcessedIntWeight processed_int_weight_of(const reference::LinearMethod& host) {
  const std::string& where = host.shape().prefix;
  if (host.shape().num_experts > 0)
    throw Error(where, "a quantized expert stack: not on the GPU in this version (issue 26)");
  auto w = host.processed_int_weight();
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
