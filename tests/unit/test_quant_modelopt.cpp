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

// ModelOpt's NVFP4: weight / weight_scale / weight_scale_2 (/ input_scale) multipliers. With
// power-of-two scales the compressed-tensors divisors are their exact reciprocals, so both
// spellings must give the same layer bit for bit; in general w = e2m1 * s * ws2 exactly.
TEST(ModelOptNvfp4, MultiplierScalesAreTheCompressedTensorsDivisors) {
  const int64_t n = 32, k = 64;
  std::vector<double> e2m1(static_cast<size_t>(n * k)), s(static_cast<size_t>(n * k / 16));
  const double grid[8] = {0, 0.5, 1, 1.5, 2, 3, 4, 6};
  for (size_t i = 0; i < e2m1.size(); ++i)
    e2m1[i] = (i % 3 == 0 ? -1 : 1) * grid[(i * 7) % 8];
  for (size_t i = 0; i < s.size(); ++i)
    s[i] = std::ldexp(1.0 + static_cast<double>(i % 8) / 8, static_cast<int>(i % 5) - 2);
  const HostTensor codes = encode(DType::kF4, {n, k}, e2m1, Encoding::kExact, "codes");
  HostTensor packed = codes;
  packed.dtype = DType::kU8;
  packed.shape = {n, k / 2};
  const HostTensor bs = encode(DType::kF8E4M3, {n, k / 16}, s, Encoding::kExact, "s");
  for (bool w4a4 : {true, false}) {
    SCOPED_TRACE(w4a4 ? "W4A4" : "W4A16");
    SchemeId id{SchemeKind::kNvfp4, 0};
    id.weight_only = !w4a4;
    MethodConfig c = method_config(id, Dialect::kIdeal);
    auto layer = [&](const std::string& format, TensorMap t) {
      c.format = format;
      auto m = make_linear_method(LinearShape::dense("l", n, k, DType::kBF16), c);
      m->load_all(t);
      m->process_weights_after_loading();
      return m;
    };
    TensorMap mo = {{"weight", packed}, {"weight_scale", bs}, {"weight_scale_2", f32({}, 0x1p-10)}};
    TensorMap ct = {
        {"weight_packed", packed}, {"weight_scale", bs}, {"weight_global_scale", f32({1}, 0x1p10)}};
    if (w4a4) {
      mo["input_scale"] = f32({}, 0x1p-3);
      ct["input_global_scale"] = f32({1}, 0x1p3);
    }
    const auto a = layer("modelopt", mo), b = layer("nvfp4-pack-quantized", ct);
    EXPECT_EQ(a->dequantized_weight(0).data, b->dequantized_weight(0).data);
    Matrix x(3, k);
    for (size_t i = 0; i < x.data.size(); ++i)
      x.data[i] = std::sin(0.3 * static_cast<double>(i));
    EXPECT_EQ(a->apply(x).data, b->apply(x).data);
    // A weight_scale_2 that is no power of two: the exact product.
    mo["weight_scale_2"] = f32({}, static_cast<double>(0.0003f));
    const double ws2 = static_cast<double>(0.0003f);
    const Matrix w = layer("modelopt", mo)->dequantized_weight(0);
    for (int64_t r = 0; r < n; r += 5)
      for (int64_t col = 0; col < k; col += 3)
        ASSERT_EQ(w(r, col), e2m1[static_cast<size_t>(r * k + col)] *
                                 s[static_cast<size_t>(r * (k / 16) + col / 16)] * ws2);
  }
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
