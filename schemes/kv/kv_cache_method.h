#pragma once
// The KV-cache counterpart of LinearMethod: an attention layer's cache stores keys and values in
// a quantized form ("quantize on write") and the attention reads them back ("dequantize on
// read"). Lifecycle as for linears: create_weights -> load -> process_weights_after_loading ->
// store/read. Names are relative to the attention prefix ("model.layers.0.self_attn"), as the
// producer writes them ("k_proj.kv_cache_scale", "k_scale").
// Keys and values enter as [T, Hkv*D] rows (channel index = head*D + d, the msModelSlim C8
// per-channel order) after k_norm / RoPE, exactly what the attention would cache.
#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "core/dtype.h"
#include "schemes/math/scaled_gemm.h"
#include "schemes/method/linear_method.h"

namespace qparity::reference {

enum class KvWhich : uint8_t { kKey, kValue };
std::string_view to_string(KvWhich w);

struct KvShape {
  std::string prefix;  // "model.layers.0.self_attn"
  int64_t num_kv_heads = 0;
  int64_t head_dim = 0;
  DType model_dtype = DType::kBF16;
  int64_t channels() const { return num_kv_heads * head_dim; }
};

class KvCacheMethod {
 public:
  KvCacheMethod(KvShape shape, MethodConfig config);
  virtual ~KvCacheMethod() = default;
  KvCacheMethod(const KvCacheMethod&) = delete;
  KvCacheMethod& operator=(const KvCacheMethod&) = delete;

  const KvShape& shape() const { return shape_; }
  const MethodConfig& config() const { return config_; }

  virtual std::vector<ParamSpec> create_weights() const = 0;
  void load(const std::string& name, const TensorView& t);
  void load_all(const TensorMap& tensors);
  void process_weights_after_loading();
  bool processed() const { return processed_; }

  // What the cache holds for rows x [T, Hkv*D]: codes on a lattice with their scales.
  QuantizedMatrix store(KvWhich which, const Matrix& x) const;
  // What attention reads back from stored codes.
  Matrix read(KvWhich which, const QuantizedMatrix& stored) const;
  Matrix round_trip(KvWhich which, const Matrix& x) const { return read(which, store(which, x)); }

 protected:
  virtual void process() = 0;
  virtual QuantizedMatrix do_store(KvWhich which, const Matrix& x) const = 0;
  virtual Matrix do_read(KvWhich which, const QuantizedMatrix& stored) const = 0;
  const HostTensor* find_loaded(const std::string& name) const;
  const HostTensor& loaded(const std::string& name) const;
  std::string where(const std::string& name) const;

 private:
  KvShape shape_;
  MethodConfig config_;
  std::map<std::string, HostTensor> loaded_;
  bool processed_ = false;
};

// kv-bf16: the cache holds the model dtype; store rounds each value to it (RNE), read is exact.
class UnquantizedKvCacheMethod final : public KvCacheMethod {
 public:
  using KvCacheMethod::KvCacheMethod;
  std::vector<ParamSpec> create_weights() const override { return {}; }

 protected:
  void process() override {}
  QuantizedMatrix do_store(KvWhich which, const Matrix& x) const override;
  Matrix do_read(KvWhich which, const QuantizedMatrix& stored) const override;
};

}  // namespace qparity::reference
