// Memory of a loaded reference model: weights stay about as compact as the checkpoint holds them
// (ARCHITECTURE.md: "memory is about the checkpoint size, never 4x it"). Measured, not declared:
// the heap glibc reports in use (mallinfo2) after load_model, minus before, against the bytes of
// the checkpoint's safetensors files, for every scheme on the tiny fixtures. The embedding stays
// in the memory map, so it is outside the heap figure but inside the checkpoint figure; the bound
// is therefore on the heap alone: at most 1.3x the checkpoint plus 256 KiB of bookkeeping.
#include <gtest/gtest.h>
#include <malloc.h>

#include <cstdio>
#include <filesystem>

#include "../unit/test_seed.h"
#include "fixtures/checkpoint_quantizer.h"
#include "fixtures/fixture_model.h"
#include "reference_cpu/models/model_loader.h"

#if defined(__SANITIZE_ADDRESS__)
#define QPARITY_HEAP_MEASURABLE 0
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define QPARITY_HEAP_MEASURABLE 0
#endif
#endif
#ifndef QPARITY_HEAP_MEASURABLE
#define QPARITY_HEAP_MEASURABLE 1
#endif

namespace qparity::reference {
namespace {

namespace fs = std::filesystem;

size_t heap_in_use() {
  const struct mallinfo2 m = mallinfo2();
  return m.uordblks + m.hblkhd;  // small-chunk arena bytes + malloc's own mmap'd chunks
}

uint64_t checkpoint_bytes(const fs::path& dir) {
  uint64_t n = 0;
  for (const auto& e : fs::directory_iterator(dir))
    if (e.path().extension() == ".safetensors") n += fs::file_size(e.path());
  return n;
}

TEST(ReferenceMemory, LoadedModelHeapStaysNearCheckpointSize) {
  if (!QPARITY_HEAP_MEASURABLE)
    GTEST_SKIP() << "the heap cannot be measured under AddressSanitizer's allocator";
  const uint64_t seed = test::test_seed();
  const fs::path root = fs::temp_directory_path() / ("qparity_memory_" + std::to_string(seed));
  fs::create_directories(root);
  struct Case {
    const char* arch;
    const char* scheme;
  };
  const std::vector<Case> cases = {
      {"llama", "bf16"},          {"llama", "w8a16-ch"},      {"llama", "w8a16-g64"},
      {"llama", "w8a8-static"},   {"llama", "w8a8s"},         {"llama", "w8a8-int8-dyn"},
      {"llama", "w4a16-g32"},     {"llama", "fp8-tensor"},    {"llama", "fp8-channel"},
      {"llama", "fp8-block"},     {"llama", "nvfp4"},         {"llama", "mxfp4"},
      {"llama", "mxfp8"},         {"llama", "smoothquant"},   {"llama", "kv-int8"},
      {"qwen3-moe", "bf16"},      {"qwen3-moe", "fp8-block"}, {"qwen3-moe", "w8a8-int8-dyn"},
      {"qwen3-moe", "w4a16-g32"}, {"qwen3-moe", "mxint4"},    {"qwen3-moe", "nvfp4"}};
  for (const char* arch : {"llama", "qwen3-moe"}) {
    fixtures::FixtureSpec spec;
    spec.arch = fixtures::parse_fixture_arch(arch);
    spec.seed = seed;
    fixtures::write_fp_checkpoint(spec, root / arch, OverwritePolicy::kRefuse);
  }
  for (const Case& c : cases) {
    const std::string s = c.scheme;
    fs::path dir = root / c.arch;
    if (s != "bf16") {
      dir = root / (std::string(c.arch) + "." + s);
      const ModelConfig cfg = load_model_config(root / c.arch / "config.json");
      fixtures::quantize_checkpoint(
          root / c.arch, parse_scheme_id(s), Dialect::kIdeal, dir,
          fixtures::calibrate_checkpoint(root / c.arch, synthetic_tokens(16, cfg.vocab, seed)),
          OverwritePolicy::kRefuse, nullptr);
    }
    malloc_trim(0);
    const size_t before = heap_in_use();
    auto model = load_model(dir);
    const size_t after = heap_in_use();
    const double held = static_cast<double>(after) - static_cast<double>(before);
    const double ckpt = static_cast<double>(checkpoint_bytes(dir));
    std::printf("%-10s %-14s checkpoint %9.0f B  heap %9.0f B  ratio %.2f\n", c.arch, c.scheme,
                ckpt, held, held / ckpt);
    EXPECT_LE(held, 1.3 * ckpt + 256.0 * 1024.0)
        << c.arch << "/" << c.scheme << ": the loaded model holds " << held
        << " heap bytes for a checkpoint of " << ckpt << " bytes";
  }
  fs::remove_all(root);
}

}  // namespace
}  // namespace qparity::reference
