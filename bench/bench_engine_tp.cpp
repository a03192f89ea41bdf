// Tensor-parallel decode: the same model shape at TP = 1 and TP = N in one run on one host
// (random weights made on each rank's device, each rank its tp_rank_config shard), batch-1 and
// batch-8 decode through CUDA graphs (NCCL collectives captured), greedy argmax included:
//   - tokens/s at TP = N over tokens/s at TP = 1 (the goal: >= 1.6x at TP = 2);
//   - bytes/s of weights (all ranks; the embedding table counts one row) + KV cache read per
//     step over the aggregate copy bandwidth of the N devices (each measured, bandwidthTest's
//     read + write convention);
//   - a model that needs TP (Llama-3-70B's shape, fp8-block) at TP = N alone.
// Output: a table on stdout and --json FILE.
#include <cuda_runtime_api.h>

#include <CLI/CLI.hpp>
#include <iostream>
#include <sstream>

#include "core/json_util.h"
#include "core/parallel/tp_sharding.h"
#include "engine_bench_util.h"
#include "gpu_engine/cuda_check.h"
#include "gpu_engine/device_info.h"
#include "gpu_engine/random_model.h"
#include "gpu_engine/tensor_parallel.h"

namespace {

using namespace qparity;
using namespace qparity::bench;

struct Options {
  int tp = 2;
  int64_t context = 512, steps = 64;
  std::vector<int64_t> batches = {1, 8};
  std::string runs = "llama3-8b/bf16,llama3-8b/fp8-block,llama3-70b/fp8-block";
  std::string json;
};

ModelConfig shape_of(const std::string& name) {
  if (name == "llama3-8b") return llama3_8b();
  if (name == "llama3-70b") return llama3_70b();
  if (name == "qwen3-0.6b") return qwen3_06b();
  throw std::runtime_error("unknown model shape '" + name + "'");
}

// One run: decode of `cfg` with dense linears in `scheme` at tensor parallelism tp.
Json decode_run(const ModelConfig& cfg, const std::string& scheme, int tp, const Options& o,
                double aggregate_bw) {
  double read_bytes = 0;  // weights read per step, over all ranks
  auto e = gpu::make_tp_engine(
      tp,
      [&](int rank) {
        auto m = gpu::random_gpu_model(tp_rank_config(cfg, tp), 1 + static_cast<uint64_t>(rank),
                                       "bf16", scheme);
        if (tp > 1) m->whole_cfg = cfg;
        m->tp = tp;
        m->rank = rank;
        read_bytes += static_cast<double>(m->weight_bytes);
        if (!cfg.tie_word_embeddings) read_bytes -= static_cast<double>(m->embed.bytes());
        return m;
      },
      [&] {
        gpu::EngineOptions eo;
        eo.max_tokens = std::max<int64_t>(o.context, 64);
        eo.max_seqs = 64;
        eo.max_context = o.context + o.steps + 16;
        return eo;
      }());
  const double kv_per_token = 2.0 * 2 * static_cast<double>(cfg.num_layers * cfg.kv_size());
  Json rows = Json::array();
  for (const int64_t batch : o.batches) {
    const auto prefill_all = [&] { prefill_sequences(*e, batch, o.context); };
    std::vector<int32_t> next(static_cast<size_t>(batch), 1);
    const auto step = [&](int64_t k) {
      gpu::Batch b;
      for (int32_t s = 0; s < batch; ++s) {
        b.tokens.push_back(next[static_cast<size_t>(s)]);
        b.slots.push_back(s);
        b.positions.push_back(static_cast<int32_t>(o.context + k));
      }
      e->forward_graph(b);
      next = e->greedy(batch);
      for (const int32_t id : next)
        if (id < 0) throw std::runtime_error("a decode step gave NaN logits");
    };
    prefill_all();
    step(0);  // captures the graph of this batch size on every rank
    for (int32_t s = 0; s < batch; ++s)
      e->release(s);
    prefill_all();
    const auto t0 = std::chrono::steady_clock::now();
    for (int64_t k = 0; k < o.steps; ++k)
      step(k);
    const double secs = seconds(t0);
    double kv_bytes = 0;
    for (int64_t k = 0; k < o.steps; ++k)
      kv_bytes +=
          static_cast<double>(batch) * static_cast<double>(o.context + k + 1) * kv_per_token;
    const double bytes = read_bytes * static_cast<double>(o.steps) + kv_bytes;
    const double tps = static_cast<double>(batch * o.steps) / secs;
    e->replay_graph(batch, 8);
    const auto t2 = std::chrono::steady_clock::now();
    e->replay_graph(batch, o.steps);
    const double replay = seconds(t2) / static_cast<double>(o.steps);
    rows.push_back({{"batch", batch},
                    {"tokens_per_s", tps},
                    {"ms_per_step", secs / static_cast<double>(o.steps) * 1e3},
                    {"replayed_ms_per_step", replay * 1e3},
                    {"bytes_per_s", bytes / secs},
                    {"fraction_of_aggregate_copy_bandwidth", bytes / secs / aggregate_bw}});
    std::cout << "  tp " << tp << " batch " << batch << ": " << tps << " tokens/s, "
              << secs / static_cast<double>(o.steps) * 1e3 << " ms/step (graph replayed "
              << replay * 1e3 << " ms), weights+KV " << bytes / secs / 1e9
              << " GB/s = " << 100 * bytes / secs / aggregate_bw << " % of " << tp
              << " GPUs' copy bandwidth\n";
    for (int32_t s = 0; s < batch; ++s)
      e->release(s);
  }
  return {{"tp", tp}, {"weight_bytes_read_per_step", read_bytes}, {"decode", rows}};
}

}  // namespace

int main(int argc, char** argv) {
  Options o;
  CLI::App app("Tensor-parallel decode against TP = 1 and the GPUs' aggregate copy bandwidth");
  app.add_option("--tp", o.tp, "tensor parallelism (GPUs 0..N-1)")->capture_default_str();
  app.add_option("--context", o.context, "prefilled tokens per sequence")->capture_default_str();
  app.add_option("--steps", o.steps, "timed decode steps")->capture_default_str();
  app.add_option("--batches", o.batches, "decode batch sizes")
      ->delimiter(',')
      ->capture_default_str();
  app.add_option("--runs", o.runs,
                 "model/scheme pairs; llama3-70b runs at --tp alone (it needs the GPUs)")
      ->capture_default_str();
  app.add_option("--json", o.json, "write the results here");
  CLI11_PARSE(app, argc, argv);
  try {
    int visible = 0;
    QPARITY_CUDA_CHECK(cudaGetDeviceCount(&visible));
    if (visible < o.tp) {
      std::cerr << "bench_engine_tp: --tp " << o.tp << " needs that many GPUs; " << visible
                << " visible\n";
      return 2;
    }
    double aggregate = 0, one = 0;
    Json devices = Json::array();
    for (int d = 0; d < o.tp; ++d) {
      QPARITY_CUDA_CHECK(cudaSetDevice(d));
      const double bw = copy_bandwidth();
      if (d == 0) one = bw;
      aggregate += bw;
      std::string why;
      const auto dev = gpu::query_device(d, &why);
      devices.push_back(
          {{"name", dev ? dev->name + " " + dev->sm() : why}, {"copy_bytes_per_s", bw}});
      std::cout << "device " << d << " " << (dev ? dev->name + " " + dev->sm() : why) << ": copy "
                << bw / 1e9 << " GB/s\n";
    }
    QPARITY_CUDA_CHECK(cudaSetDevice(0));
    Json runs = Json::array();
    std::stringstream list(o.runs);
    for (std::string run; std::getline(list, run, ',');) {
      const size_t slash = run.find('/');
      const std::string model = run.substr(0, slash),
                        scheme = slash == std::string::npos ? "bf16" : run.substr(slash + 1);
      const ModelConfig cfg = shape_of(model);
      std::cout << model << " " << scheme << ":\n";
      Json r = {{"model", model}, {"scheme", scheme}};
      Json at_tp = decode_run(cfg, scheme, o.tp, o, aggregate);
      if (model != "llama3-70b") {
        Json at_1 = decode_run(cfg, scheme, 1, o, one);
        Json speedup = Json::array();
        for (size_t i = 0; i < o.batches.size(); ++i) {
          const double s = at_tp["decode"][i]["tokens_per_s"].get<double>() /
                           at_1["decode"][i]["tokens_per_s"].get<double>();
          speedup.push_back({{"batch", o.batches[i]}, {"tp_over_tp1", s}});
          std::cout << "  batch " << o.batches[i] << ": tp " << o.tp << " / tp 1 = " << s << "x\n";
        }
        r["tp1"] = at_1;
        r["speedup"] = speedup;
      }
      r["tpn"] = at_tp;
      runs.push_back(r);
    }
    Json j = {{"devices", devices}, {"tp", o.tp}, {"runs", runs}};
    if (!o.json.empty()) write_bench_json(o.json, j);
  } catch (const std::exception& e) {
    std::cerr << "bench_engine_tp: " << e.what() << "\n";
    return 1;
  }
  return 0;
}
