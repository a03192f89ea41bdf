// ModelOpt's FP8 tensors read by the fp8-tensor method and its KV scales by kv-fp8: 0-dim F32
// scales (torch.tensor(amax / 448)), <attn>.k_proj.k_scale / v_proj.v_scale, the same numbers as
// the compressed-tensors spelling of the same values.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cmath>

#include "core/error.h"
#include "schemes/kv/kv_fp8.h"
#include "schemes/method/method_factory.h"

namespace qparity::reference {
namespace {

using ::testing::HasSubstr;

HostTensor f32(std::vector<int64_t> shape, double v) {
  const double vals[1] = {v};
  return encode(DType::kF32, std::move(shape), vals, Encoding::kExact, "scale");
}

TEST(ModelOptFp8, ZeroDimScalesReadAsTheCompressedTensorsOnes) {
  const int64_t n = 16, k = 32;
  std::vector<double> codes(static_cast<size_t>(n * k));
  for (size_t i = 0; i < codes.size(); ++i)
    codes[i] = std::ldexp(static_cast<double>(static_cast<int>(i % 15) - 7), -3);  // e4m3 grid
  const HostTensor w = encode(DType::kF8E4M3, {n, k}, codes, Encoding::kExact, "weight");
  MethodConfig c = method_config(SchemeId{SchemeKind::kFp8Tensor, 0}, Dialect::kIdeal);
  c.format = "modelopt";
  const double s = 0.0078125 * 3, si = 0.05078125;
  const Matrix mo = dequantize_linear(
      c, {{"weight", w}, {"weight_scale", f32({}, s)}, {"input_scale", f32({}, si)}}, n, k,
      DType::kBF16);
  c.format = "float-quantized";
  const Matrix ct = dequantize_linear(
      c, {{"weight", w}, {"weight_scale", f32({1}, s)}, {"input_scale", f32({1}, si)}}, n, k,
      DType::kBF16);
  EXPECT_EQ(mo.data, ct.data);
  for (size_t i = 0; i < codes.size(); ++i)
    ASSERT_EQ(mo.data[i], codes[i] * s);
  // A [2] scale is neither spelling.
  EXPECT_THAT(
      [&] {
        dequantize_linear(c,
                          {{"weight", w},
                           {"weight_scale", f32({1}, s)},
                           {"input_scale", encode(DType::kF32, {2}, std::vector<double>{1, 1},
                                                  Encoding::kExact, "x")}},
                          n, k, DType::kBF16);
      },
      ::testing::ThrowsMessage<Error>(HasSubstr("input_scale")));
}

// FP8_PER_CHANNEL_PER_TOKEN's weight_scale is F32 [N]; compressed-tensors' is [N, 1].
TEST(ModelOptFp8, PerChannelScalesReadAsTheCompressedTensorsOnes) {
  const int64_t n = 8, k = 16;
  std::vector<double> codes(static_cast<size_t>(n * k)), scales(static_cast<size_t>(n));
  for (size_t i = 0; i < codes.size(); ++i)
    codes[i] = std::ldexp(static_cast<double>(static_cast<int>(i % 13) - 6), -2);
  for (size_t r = 0; r < scales.size(); ++r)
    scales[r] = std::ldexp(1.0 + static_cast<double>(r) / 8, -7);
  const HostTensor w = encode(DType::kF8E4M3, {n, k}, codes, Encoding::kExact, "weight");
  MethodConfig c = method_config(SchemeId{SchemeKind::kFp8Channel, 0}, Dialect::kIdeal);
  c.format = "modelopt";
  const Matrix mo = dequantize_linear(
      c, {{"weight", w}, {"weight_scale", encode(DType::kF32, {n}, scales, Encoding::kExact, "s")}},
      n, k, DType::kBF16);
  c.format = "float-quantized";
  const Matrix ct = dequantize_linear(
      c,
      {{"weight", w}, {"weight_scale", encode(DType::kF32, {n, 1}, scales, Encoding::kExact, "s")}},
      n, k, DType::kBF16);
  EXPECT_EQ(mo.data, ct.data);
  EXPECT_EQ(mo(3, 5), codes[3 * k + 5] * scales[3]);
}

TEST(ModelOptFp8, KvScalesUnderModelOptsNames) {
  const KvShape shape{"model.layers.0.self_attn", 2, 64, DType::kBF16};
  auto kv =
      make_kv_cache_method(shape, method_config(SchemeId{SchemeKind::kKvFp8, 0}, Dialect::kIdeal));
  kv->load("k_proj.k_scale", f32({}, 0.125).view());
  kv->load("v_proj.v_scale", f32({}, 0.0625).view());
  kv->process_weights_after_loading();
  const auto& m = dynamic_cast<const KvFp8CacheMethod&>(*kv);
  EXPECT_EQ(m.scale(KvWhich::kKey), 0.125);
  EXPECT_EQ(m.scale(KvWhich::kValue), 0.0625);
  // Two spellings of one scale: refused, naming both.
  auto twice =
      make_kv_cache_method(shape, method_config(SchemeId{SchemeKind::kKvFp8, 0}, Dialect::kIdeal));
  twice->load("k_scale", f32({1}, 0.125).view());
  twice->load("k_proj.k_scale", f32({}, 0.125).view());
  twice->load("v_scale", f32({1}, 0.125).view());
  EXPECT_THAT([&] { twice->process_weights_after_loading(); },
              ::testing::ThrowsMessage<Error>(HasSubstr("both k_scale and k_proj.k_scale")));
}

}  // namespace
}  // namespace qparity::reference
