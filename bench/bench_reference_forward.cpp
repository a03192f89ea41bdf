// Reference forward speed on the `small` fixtures (fixtures/fixture_model.h): prefill and decode
// tokens/s of the fp64 reference for Llama, Qwen3 and Qwen3-MoE, and the GFLOP/s that is, against
// Eigen's fp64 GEMM measured in the same run on the same core (the unit of measurement: what a
// tuned dense kernel gets here). Each thread count is measured for both: the reference splits
// weight rows across OpenMP threads (results bit-identical for any count), Eigen parallelizes its
// GEMM with the same number of threads.
//
// Usage: bench_reference_forward [--tokens T] [--repeats R] [--threads 1,2,...]
//        (default threads: 1 and the OpenMP maximum; prints a table and JSON lines)
#include <Eigen/Dense>
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <string>
#include <vector>

#include "fixtures/fixture_model.h"
#include "reference_cpu/models/calibration.h"
#include "reference_cpu/models/model_loader.h"
#include "reference_cpu/quant/parallel.h"

namespace {

using Clock = std::chrono::steady_clock;
namespace fs = std::filesystem;
using namespace qparity;

double seconds_since(Clock::time_point t0) {
  return std::chrono::duration<double>(Clock::now() - t0).count();
}

// Best-of-`repeats` GFLOP/s of an n x n x n fp64 GEMM (2 n^3 flops).
double eigen_gemm_gflops(int n, int repeats, int threads) {
  Eigen::setNbThreads(threads);
  Eigen::MatrixXd a = Eigen::MatrixXd::Random(n, n), b = Eigen::MatrixXd::Random(n, n), c(n, n);
  double best = 1e300;
  for (int r = 0; r < repeats; ++r) {
    const auto t0 = Clock::now();
    c.noalias() = a * b;
    best = std::min(best, seconds_since(t0));
  }
  if (c(0, 0) == 12345.678) std::puts("");  // keep the product observable
  const double m = static_cast<double>(n);
  return 2.0 * m * m * m / best / 1e9;
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

}  // namespace

int main(int argc, char** argv) {
  int64_t tokens = 32;
  int repeats = 3;
  std::vector<int> thread_counts = {1};
  if (reference::reference_threads() > 1) thread_counts.push_back(reference::reference_threads());
  for (int i = 1; i + 1 < argc; i += 2) {
    if (!std::strcmp(argv[i], "--tokens")) tokens = std::stoll(argv[i + 1]);
    if (!std::strcmp(argv[i], "--repeats")) repeats = std::stoi(argv[i + 1]);
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
  const char* const archs[] = {"llama", "qwen3", "qwen3-moe"};
  for (const char* arch : archs) {
    fixtures::FixtureSpec spec;
    spec.arch = fixtures::parse_fixture_arch(arch);
    spec.size = fixtures::FixtureSize::kSmall;
    spec.seed = 1;
    fixtures::write_fp_checkpoint(spec, root / arch, OverwritePolicy::kReplace);
  }
  for (int threads : thread_counts) {
    reference::set_reference_threads(threads);
    const double eigen = eigen_gemm_gflops(512, 5, threads);
    std::printf("Eigen fp64 GEMM 512^3, %d thread(s): %.2f GFLOP/s (baseline, same run)\n", threads,
                eigen);
    std::printf("%-10s %8s %8s %14s %14s %12s %14s\n", "arch", "threads", "tokens", "prefill tok/s",
                "decode tok/s", "GFLOP/s", "vs Eigen GEMM");
    for (const char* arch : archs) {
      auto model = reference::load_model(root / arch);
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
      std::printf("%-10s %8d %8lld %14.1f %14.1f %12.3f %13.1f%%\n", arch, threads,
                  static_cast<long long>(tokens), n / prefill, n / decode, gflops,
                  100.0 * gflops / eigen);
      std::printf(
          "{\"arch\":\"%s\",\"size\":\"small\",\"threads\":%d,\"tokens\":%lld,"
          "\"prefill_tok_s\":%.3f,\"decode_tok_s\":%.3f,\"gflops\":%.4f,"
          "\"eigen_gemm_gflops\":%.4f,\"ratio\":%.4f}\n",
          arch, threads, static_cast<long long>(tokens), n / prefill, n / decode, gflops, eigen,
          gflops / eigen);
    }
  }
  fs::remove_all(root);
  return 0;
}
