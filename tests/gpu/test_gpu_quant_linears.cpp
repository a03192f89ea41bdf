// The GPU's quantized linear methods against the fp64 reference's own apply(): each scheme's
// checkpoint tensors from the reference quantizer, loaded and processed by the reference method
// (the lifecycle both engines share), uploaded by the GPU method, applied to fresh random bf16
// inputs with the output poisoned (NaN) first. Judged like every kernel (kernel_test_util.h):
// rel_l2 against the fp64 result rounded once to bf16 within kFlipBound. Then the runtime's
// promises: bit-identical reruns, batch invariance (a token's row the same alone or in a batch
// of 64), and a deliberate group-index fault that the same check catches. Launcher and factory
// refusals run without a device.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cstring>
#include <random>

#include "../unit/error_of.h"
#include "../unit/test_seed.h"
#include "gpu_engine/device_buffer.h"
#include "gpu_engine/kernels/weight_only_gemm.h"
#include "gpu_engine/quant/gpu_linear_method.h"
#include "gpu_test.h"
#include "kernel_test_util.h"
#include "reference_cpu/quant/method_factory.h"

namespace qparity {
namespace {

using gpu::DeviceBuffer;
using reference::Matrix;
using test::Bf16;
using test::kFlipBound;
using ::testing::HasSubstr;

struct Case {
  std::string scheme;
  bool symmetric = true;
  std::vector<int64_t> partitions;  // out_features of each fused partition
  int64_t k = 0;
};

std::string name_of(const Case& c) {
  std::string n = c.scheme + (c.symmetric ? " sym" : " asym") + " N=[";
  for (int64_t p : c.partitions)
    n += std::to_string(p) + ",";
  return n + "] K=" + std::to_string(c.k);
}

// The processed reference method of one case, its weights from the reference quantizer.
std::unique_ptr<reference::LinearMethod> reference_method(const Case& c, std::mt19937_64& rng) {
  const SchemeId id = parse_scheme_id(c.scheme);
  reference::MethodConfig mc = reference::method_config(id, reference::Dialect::kIdeal);
  if (mc.weights) mc.weights->symmetric = c.symmetric;
  reference::LinearShape shape;
  shape.prefix = "model.layers.0.self_attn";
  shape.partitions = c.partitions;
  shape.partition_names.clear();
  for (size_t p = 0; p < c.partitions.size(); ++p)
    shape.partition_names.push_back(c.partitions.size() == 1 ? "" : "p" + std::to_string(p));
  shape.in_features = c.k;
  auto m = reference::make_linear_method(shape, mc);
  std::normal_distribution<double> d(0.0, 0.05);
  for (size_t p = 0; p < c.partitions.size(); ++p) {
    reference::QuantizeRequest r;
    r.weight = Matrix(c.partitions[p], c.k);
    for (double& w : r.weight.data)
      w = d(rng) + (c.symmetric ? 0.0 : 0.03);  // an offset range for the asymmetric cases
    r.weights = mc.weights;
    r.group_size = effective_group_size(id);
    m->load_all(reference::quantize_linear(id, r), static_cast<int64_t>(p));
  }
  m->process_weights_after_loading();
  return m;
}

// The GPU method's output for x [t, k] (bf16 values), poisoned first.
std::vector<double> run_gpu(const gpu::GpuLinearMethod& g, const std::vector<Bf16>& hx, int64_t t) {
  DeviceBuffer<Bf16> x(hx), y(static_cast<size_t>(t * g.out_features()));
  y.poison();
  g.apply(x.get(), y.get(), t, nullptr);
  QPARITY_CUDA_CHECK(cudaDeviceSynchronize());
  return test::to_doubles(y.download());
}

std::vector<Case> cases() {
  return {
      {"w8a16-ch", true, {192}, 512},     {"w8a16-ch", false, {192}, 512},
      {"w8a16-g64", true, {128}, 384},    {"w8a16-g64", false, {96, 32, 32}, 256},
      {"w8a16-g128", false, {256}, 1024}, {"w4a16-g32", true, {192}, 512},
      {"w4a16-g32", false, {192}, 512},   {"w4a16-g32", true, {64, 32, 32}, 2048},
  };
}

class GpuQuantLinears : public test::GpuTest {
 protected:
  std::mt19937_64 rng{test::test_seed()};
};

TEST_F(GpuQuantLinears, MatchTheReferenceApplyForEveryWeightOnlyScheme) {
  for (const Case& c : cases()) {
    SCOPED_TRACE(name_of(c));
    const auto host = reference_method(c, rng);
    const auto g = gpu::make_gpu_linear_method(*host);
    for (const int64_t t : {1, 3, 8, 17, 64}) {
      std::vector<Bf16> hx;
      const Matrix x = test::random_bf16(rng, t, c.k, 1.0, hx);
      const std::vector<double> want = test::round_bf16(host->apply(x).data);
      const std::vector<double> got = run_gpu(*g, hx, t);
      EXPECT_LE(test::rel_l2(got, want), kFlipBound) << "t = " << t;
    }
  }
}

TEST_F(GpuQuantLinears, AreDeterministicAndBatchInvariant) {
  for (const Case& c : cases()) {
    SCOPED_TRACE(name_of(c));
    const auto host = reference_method(c, rng);
    const auto g = gpu::make_gpu_linear_method(*host);
    const int64_t t = 64, n = g->out_features();
    std::vector<Bf16> hx;
    test::random_bf16(rng, t, c.k, 1.0, hx);
    const std::vector<double> batch = run_gpu(*g, hx, t);
    EXPECT_EQ(batch, run_gpu(*g, hx, t)) << "rerun";
    for (int64_t r : {0L, 5L, 63L}) {
      const std::vector<Bf16> row(hx.begin() + r * c.k, hx.begin() + (r + 1) * c.k);
      const std::vector<double> alone = run_gpu(*g, row, 1);
      EXPECT_TRUE(std::equal(alone.begin(), alone.end(), batch.begin() + r * n))
          << "token " << r << " alone differs from the batch of 64";
    }
  }
}

TEST_F(GpuQuantLinears, TheGroupIndexFaultIsCaught) {
  const Case c{"w4a16-g32", true, {128}, 512};
  const auto host = reference_method(c, rng);
  gpu::GpuMethodOptions faulty;
  faulty.fault_group_off_by_one = true;
  const auto g = gpu::make_gpu_linear_method(*host, faulty);
  std::vector<Bf16> hx;
  const Matrix x = test::random_bf16(rng, 4, c.k, 1.0, hx);
  const double e = test::rel_l2(run_gpu(*g, hx, 4), test::round_bf16(host->apply(x).data));
  EXPECT_GT(e, 100 * kFlipBound) << "the planted fault must be far outside the bound";
}

// No device needed below.
TEST(GpuQuantLinearRefusals, UnsupportedSchemesAreRefusedByName) {
  std::mt19937_64 rng{test::test_seed()};
  const Case c{"w8a8-int8-dyn", true, {64}, 128};
  const auto host = reference_method(c, rng);
  EXPECT_THAT(test::error_of([&] { gpu::make_gpu_linear_method(*host); }),
              AllOf(HasSubstr("model.layers.0.self_attn"), HasSubstr("w8a8-int8-dyn"),
                    HasSubstr("not on the GPU yet")));
}

TEST(GpuQuantLinearRefusals, TheLauncherNamesEveryViolatedShapeRule) {
  gpu::WeightOnlyGemmParams p;
  alignas(16) static uint8_t buf[64];
  p.x = reinterpret_cast<const Bf16*>(buf);
  p.w = buf;
  p.scales = buf;
  p.y = reinterpret_cast<Bf16*>(buf);
  p.m = 1, p.n = 8, p.k = 48, p.group = 48, p.bits = 4;
  EXPECT_THAT(test::error_of([&] { gpu::launch_weight_only_gemm(p, nullptr); }),
              HasSubstr("k 48 must be a multiple of 32 for int4"));
  p.k = 128, p.group = 48, p.bits = 8;
  EXPECT_THAT(test::error_of([&] { gpu::launch_weight_only_gemm(p, nullptr); }),
              HasSubstr("group 48 must be a multiple of 16"));
  p.group = 64, p.bits = 2;
  EXPECT_THAT(test::error_of([&] { gpu::launch_weight_only_gemm(p, nullptr); }),
              HasSubstr("bits must be 4 or 8"));
  p.bits = 8;
  p.x = reinterpret_cast<const Bf16*>(buf + 2);
  EXPECT_THAT(test::error_of([&] { gpu::launch_weight_only_gemm(p, nullptr); }),
              HasSubstr("16-byte aligned"));
}

}  // namespace
}  // namespace qparity
