// Reference forward speed on the `small` fixtures (fixtures/fixture_model.h): prefill and decode
// tokens/s of the fp64 reference for Llama, Qwen3 and Qwen3-MoE, and the GFLOP/s that is, against
// Eigen's fp64 GEMM measured in the same run on the same core (the unit of measurement: what a
// tuned dense kernel gets here). Each thread count is measured for both: the reference splits
// weight rows across OpenMP threads (results bit-identical for any count), Eigen parallelizes its
// GEMM with the same number of threads.
//
// Usage: bench_reference_forward [--tokens T] [--repeats R] [--threads 1,2,...]
//        [--kernel auto|portable|avx2|avx512] [--archs llama,qwen3,qwen3-moe] [--layer-8b 1]
//        [--schemes bf16,w8a16-ch,...] (each quantized from the bf16 fixture as its producer writes
//        it, calibrated on 64 synthetic tokens; GFLOP/s count the same multiply-adds)
//        (default threads: 1 and the OpenMP maximum; prints a table and JSON lines). Eigen runs
//        with AVX2 + FMA (bench/eigen_gemm_baseline.h); the reference's products with the kernel
//        --kernel names (the bits are the same with any).
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "bench/eigen_gemm_baseline.h"
#include "core/codecs/float_format.h"
#include "fixtures/checkpoint_quantizer.h"
#include "fixtures/fixture_model.h"
#include "reference_cpu/models/calibration.h"
#include "reference_cpu/models/model_loader.h"
#include "schemes/math/matmul.h"
#include "schemes/method/parallel.h"
#include "schemes/method/tensor_decode.h"

namespace {

using Clock = std::chrono::steady_clock;
namespace fs = std::filesystem;
using namespace qparity;

double seconds_since(Clock::time_point t0) {
  return std::chrono::duration<double>(Clock::now() - t0).count();
}

// Multiply-adds of one token through the model: every linear (active experts only for MoE) plus
// attention over `context` cached tokens (q.k and p.v per head).
double flops_per_token(const ModelConfig& c, int64_t context) {
  const auto d = [](int64_t v) { return static_cast<double>(v); };
  double macs = 0;
  for (int64_t i = 0; i < c.num_layers; ++i) {
    macs += d(c.hidden) * d(c.q_size() + 2 * c.kv_size()) + d(c.q_size()) * d(c.hidden);
    macs += 2.0 * d(c.num_heads) * d(c.head_dim) * d(context);
    if (c.is_moe_layer(i))
      macs += d(c.hidden) * d(c.num_experts) +
              3.0 * d(c.num_experts_per_tok) * d(c.hidden) * d(c.moe_intermediate_size);
    else
      macs += 3.0 * d(c.hidden) * d(c.intermediate);
  }
  macs += d(c.hidden) * d(c.vocab);
  return 2.0 * macs;
}

// One Llama-3-8B-shaped decoder layer's linears (qkv 6144x4096, o_proj 4096x4096, gate_up
// 28672x4096, down 4096x14336) at `tokens` tokens, through matmul_nt_rows with bf16 rows decoded
// on the fly, as the reference's unquantized linear runs them. Returns {GFLOP/s, the share of the
// time spent decoding and packing the weights} (that share measured by the same calls with no
// tokens: the rows decoded and packed, no products; one thread, as such calls run).
std::pair<double, double> layer_8b_linears(int64_t tokens, int repeats) {
  struct Shape {
    int64_t n, k;
  };
  const Shape shapes[] = {{6144, 4096}, {4096, 4096}, {28672, 4096}, {4096, 14336}};
  std::mt19937_64 rng(5);
  std::uniform_real_distribution<double> u(-1.0, 1.0);
  double flops = 0, all = 0, decode = 0;
  for (const Shape& sh : shapes) {
    std::vector<uint16_t> w(static_cast<size_t>(sh.n * sh.k));
    for (auto& c : w)
      c = codec::double_to_bf16(u(rng) * 0.05);
    Matrix x(tokens, sh.k), none(0, sh.k);
    for (double& v : x.data)
      v = u(rng);
    const std::span<const uint8_t> bytes(reinterpret_cast<const uint8_t*>(w.data()),
                                         w.size() * sizeof(uint16_t));
    const std::string where = "8B-shaped weight";
    const auto row = [&](int64_t r, int64_t k0, std::span<double> out) {  // as the linear does
      reference::decode_to_double(DType::kBF16, bytes, static_cast<uint64_t>(r * sh.k + k0), out,
                                  where);
    };
    double best = 1e300, best_decode = 1e300;
    for (int r = 0; r < repeats; ++r) {
      auto t0 = Clock::now();
      const Matrix y = reference::matmul_nt_rows(x, sh.n, row);
      best = std::min(best, seconds_since(t0));
      if (y(0, 0) == 12345.678) std::puts("");
      t0 = Clock::now();
      reference::matmul_nt_rows(none, sh.n, row);
      best_decode = std::min(best_decode, seconds_since(t0));
    }
    flops += 2.0 * static_cast<double>(tokens * sh.n * sh.k);
    all += best;
    decode += best_decode;
  }
  return {flops / all / 1e9, decode / all};
}

}  // namespace

int main(int argc, char** argv) {
  int64_t tokens = 32;
  int repeats = 3;
  std::vector<std::string> archs = {"llama", "qwen3", "qwen3-moe"};
  std::vector<std::string> schemes = {"bf16"};
  bool layer_8b = false;
  std::vector<int> thread_counts = {1};
  if (reference::reference_threads() > 1) thread_counts.push_back(reference::reference_threads());
  for (int i = 1; i + 1 < argc; i += 2) {
    if (!std::strcmp(argv[i], "--tokens")) tokens = std::stoll(argv[i + 1]);
    if (!std::strcmp(argv[i], "--repeats")) repeats = std::stoi(argv[i + 1]);
    if (!std::strcmp(argv[i], "--kernel"))
      reference::set_dot_kernel(reference::parse_dot_kernel(argv[i + 1]));
    if (!std::strcmp(argv[i], "--layer-8b")) layer_8b = std::strcmp(argv[i + 1], "0") != 0;
    for (auto [flag, list] : {std::pair{"--archs", &archs}, std::pair{"--schemes", &schemes}})
      if (!std::strcmp(argv[i], flag)) {
        list->clear();
        for (std::string items = argv[i + 1]; !items.empty();) {
          const size_t comma = items.find(',');
          list->push_back(items.substr(0, comma));
          items = comma == std::string::npos ? "" : items.substr(comma + 1);
        }
      }
    if (!std::strcmp(argv[i], "--threads")) {
      thread_counts.clear();
      for (const char* p = argv[i + 1]; *p;) {
        thread_counts.push_back(std::atoi(p));
        while (*p && *p != ',')
          ++p;
        if (*p == ',') ++p;
      }
    }
  }
  const fs::path root = fs::temp_directory_path() / "qparity_bench_forward";
  if (!__builtin_cpu_supports("avx2") || !__builtin_cpu_supports("fma")) {
    std::fprintf(stderr, "bench_reference_forward: the Eigen baseline needs AVX2 and FMA\n");
    return 1;
  }
  for (const std::string& arch : archs) {
    fixtures::FixtureSpec spec;
    spec.arch = fixtures::parse_fixture_arch(arch);
    spec.size = fixtures::FixtureSize::kSmall;
    spec.seed = 1;
    fixtures::write_fp_checkpoint(spec, root / arch, OverwritePolicy::kReplace);
    for (const std::string& scheme : schemes) {
      if (scheme == "bf16") continue;
      const ModelConfig cfg = load_model_config(root / arch / "config.json");
      fixtures::quantize_checkpoint(root / arch, parse_scheme_id(scheme), Dialect::kIdeal,
                                    root / (arch + "." + scheme),
                                    fixtures::calibrate_checkpoint(
                                        root / arch, reference::synthetic_tokens(64, cfg.vocab, 3)),
                                    OverwritePolicy::kReplace, nullptr);
    }
  }
  for (int threads : thread_counts) {
    reference::set_reference_threads(threads);
    const double eigen = bench::eigen_gemm_gflops(512, 5, threads);
    const char* kernel = reference::dot_kernel_name(reference::dot_kernel());
    std::printf(
        "Eigen fp64 GEMM 512^3 (%s), %d thread(s): %.2f GFLOP/s (baseline, same run); "
        "reference products: %s\n",
        bench::eigen_simd(), threads, eigen, kernel);
    std::printf("%-10s %-14s %8s %8s %14s %14s %12s %14s\n", "arch", "scheme", "threads", "tokens",
                "prefill tok/s", "decode tok/s", "GFLOP/s", "vs Eigen GEMM");
    for (const std::string& a : archs)
      for (const std::string& sc : schemes) {
        const char* arch = a.c_str();
        const char* scheme = sc.c_str();
        auto model = reference::load_model(sc == "bf16" ? root / a : root / (a + "." + sc));
        const auto t = reference::synthetic_tokens(tokens, model->config().vocab, 7);
        double prefill = 1e300, decode = 1e300;
        for (int r = 0; r < repeats; ++r) {
          model->reset_cache();
          auto t0 = Clock::now();
          model->forward(t);
          prefill = std::min(prefill, seconds_since(t0));
          model->reset_cache();
          t0 = Clock::now();
          for (size_t i = 0; i < t.size(); ++i)
            model->forward(std::span<const int64_t>(t).subspan(i, 1));
          decode = std::min(decode, seconds_since(t0));
        }
        double flops = 0;
        for (int64_t i = 0; i < tokens; ++i)
          flops += flops_per_token(model->config(), i + 1);
        const double gflops = flops / prefill / 1e9;
        const double n = static_cast<double>(tokens);
        std::printf("%-10s %-14s %8d %8lld %14.1f %14.1f %12.3f %13.1f%%\n", arch, scheme, threads,
                    static_cast<long long>(tokens), n / prefill, n / decode, gflops,
                    100.0 * gflops / eigen);
        std::printf(
            "{\"arch\":\"%s\",\"scheme\":\"%s\",\"size\":\"small\",\"kernel\":\"%s\","
            "\"threads\":%d,\"tokens\":%lld,"
            "\"prefill_tok_s\":%.3f,\"decode_tok_s\":%.3f,\"gflops\":%.4f,"
            "\"eigen_gemm_gflops\":%.4f,\"ratio\":%.4f}\n",
            arch, scheme, kernel, threads, static_cast<long long>(tokens), n / prefill, n / decode,
            gflops, eigen, gflops / eigen);
      }
  }
  fs::remove_all(root);
  if (layer_8b) {
    std::printf(
        "\nLlama-3-8B-shaped layer, the four linears (bf16 rows decoded on the fly), %lld "
        "tokens:\n%8s %12s %14s %16s\n",
        static_cast<long long>(tokens), "threads", "GFLOP/s", "vs Eigen GEMM", "decode+pack share");
    for (int threads : thread_counts) {
      reference::set_reference_threads(threads);
      const double eigen = bench::eigen_gemm_gflops(512, 5, threads);
      const auto [gflops, decode_share] = layer_8b_linears(tokens, repeats);
      // The decode-only calls have no products to split across threads: their share is
      // meaningful at one thread only.
      if (threads == 1)
        std::printf("%8d %12.3f %13.1f%% %15.1f%%\n", threads, gflops, 100.0 * gflops / eigen,
                    100.0 * decode_share);
      else
        std::printf("%8d %12.3f %13.1f%% %16s\n", threads, gflops, 100.0 * gflops / eigen, "-");
      std::printf(
          "{\"shape\":\"llama3-8b-layer\",\"threads\":%d,\"tokens\":%lld,"
          "\"gflops\":%.4f,\"eigen_gemm_gflops\":%.4f,\"ratio\":%.4f,"
          "\"decode_share\":%.4f}\n",
          threads, static_cast<long long>(tokens), gflops, eigen, gflops / eigen, decode_share);
    }
  }
  return 0;
}
