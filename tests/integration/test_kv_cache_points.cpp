// What a quantized KV cache holds: the reference records it, dequantized, as `attn.k_cache` /
// `attn.v_cache` (after rope_k, before attn.core), and compare's KV error by position comes from
// those points. A fault planted in the cache of one layer (its K scale × 1.5: every key of layer
// 1 stored on another lattice) shows at that layer's k_cache and nowhere earlier — rope_k, the keys
// entering the cache, is untouched, which is why the by-position error used to say nothing about
// a KV-cache format.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cstring>
#include <filesystem>

#include "../unit/test_seed.h"
#include "cli_runner.h"
#include "core/safetensors/checkpoint.h"
#include "core/safetensors/safetensors_writer.h"
#include "golden/compare.h"

namespace qparity::test {
namespace {

namespace fs = std::filesystem;

// `from` with the tensor named `name` (F32 or BF16) multiplied by 1.5: not a power of two, so an
// fp8 cache quantizes on another lattice (a power of two would only shift e4m3's exponents).
void copy_with_scaled_tensor(const fs::path& from, const fs::path& to, const std::string& name) {
  fs::create_directories(to);
  for (const auto& e : fs::directory_iterator(from)) {
    const std::string n = e.path().filename().string();
    if (!n.ends_with(".safetensors") && !n.ends_with(".safetensors.index.json"))
      fs::copy_file(e.path(), to / n);
  }
  const Checkpoint c = Checkpoint::open(from);
  std::vector<TensorToWrite> out;
  std::vector<uint8_t> scaled;
  bool found = false;
  for (const auto& [n, ref] : c.tensors()) {
    out.push_back({n, ref.info->dtype, ref.info->shape, ref.bytes()});
    if (n != name) continue;
    found = true;
    const DType d = ref.info->dtype;
    ASSERT_TRUE(d == DType::kF32 || d == DType::kBF16) << n;
    scaled.assign(ref.bytes().begin(), ref.bytes().end());
    const size_t w = d == DType::kF32 ? 4 : 2;
    for (size_t i = 0; i < scaled.size(); i += w) {
      uint32_t u = 0;
      std::memcpy(reinterpret_cast<uint8_t*>(&u) + (w == 2 ? 2 : 0), &scaled[i], w);
      float f;
      std::memcpy(&f, &u, 4);
      f *= 1.5f;
      std::memcpy(&u, &f, 4);
      if (w == 2) u = (u + 0x7FFFu + ((u >> 16) & 1u)) >> 16;  // round to nearest even bf16
      std::memcpy(&scaled[i], &u, w);
    }
    out.back().bytes = scaled;
  }
  ASSERT_TRUE(found) << name << " is not in " << from;
  write_safetensors(to / "model.safetensors", out, std::nullopt);
}

TEST(KvCachePoints, PlantedCacheErrorShowsAtTheCacheAndNowhereEarlier) {
  const fs::path dir =
      fs::temp_directory_path() / ("qparity_kv_points_" + std::to_string(test_seed()));
  fs::remove_all(dir);
  fs::create_directories(dir);
  ASSERT_EQ(run_cli(dir, "make-fixture --arch qwen3 --scheme kv-fp8 --size tiny --seed 3 --out " +
                             (dir / "fx").string())
                .status,
            0);
  copy_with_scaled_tensor(dir / "fx", dir / "planted", "model.layers.1.self_attn.k_scale");
  for (const char* m : {"fx", "planted"}) {
    const CliRun g = run_cli(dir, "golden make --model " + (dir / m).string() +
                                      " --synthetic 2 --seq-len 8 --out " +
                                      (dir / (std::string(m) + ".h5")).string());
    ASSERT_EQ(g.status, 0) << g.err;
  }
  const auto golden = golden::GoldenReader::open(dir / "fx.h5");
  const auto planted = golden::GoldenReader::open(dir / "planted.h5");
  // The cache points sit between the keys entering the cache and attention.
  const auto& names = golden.point_names();
  const auto at = [&](const std::string& p) {
    return std::find(names.begin(), names.end(), p) - names.begin();
  };
  ASSERT_TRUE(golden.has_point("layers.0.attn.k_cache"));
  EXPECT_EQ(at("layers.0.attn.k_cache"), at("layers.0.attn.rope_k") + 1);
  EXPECT_EQ(at("layers.0.attn.v_cache"), at("layers.0.attn.k_cache") + 1);
  EXPECT_EQ(at("layers.0.attn.core"), at("layers.0.attn.v_cache") + 1);

  golden::CompareOptions co;
  co.allow_other_checkpoint = true;  // the fault is planted in a copy of the checkpoint
  const golden::CompareReport r = golden::compare_goldens(golden, planted, co);
  EXPECT_EQ(r.kv_error_source, "attn.k_cache+attn.v_cache");
  bool reached = false;
  for (const auto& p : r.points) {
    if (p.name == "layers.1.attn.k_cache") {
      reached = true;
      EXPECT_GT(p.stats.rel_l2, 1e-3) << "the planted scale changes what the cache holds";
      break;
    }
    EXPECT_EQ(p.stats.max_abs, 0.0) << p.name << " is upstream of the planted cache fault";
  }
  ASSERT_TRUE(reached);
  ASSERT_EQ(r.kv_error_by_position.size(), 8u);
  for (double v : r.kv_error_by_position)
    EXPECT_GT(v, 0.0) << "every position's keys were stored on another lattice";
  fs::remove_all(dir);
}

}  // namespace
}  // namespace qparity::test
