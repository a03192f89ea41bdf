// GPU engine throughput on synthetic Qwen3-0.6B-, Llama-3-8B- and Qwen3-30B-A3B-shaped models
// (random weights made on the device; the MoE model's experts in bf16, fp8-block or w4a16-g32,
// --experts; the dense models' linears in bf16 or a quantized format, --dense: compare a format's
// rows with the bf16 model's of the same call), each number beside a baseline measured in the
// same run:
//   - device-to-device copy bandwidth (cudaMemcpyAsync of 1 GiB, counted as bytes read + bytes
//     written, the convention of bandwidthTest), the roofline for memory-bound decode;
//   - decode tokens/s at batch 1, 8, 64 (every sequence prefilled with --context tokens, then
//     --steps decode steps through CUDA graphs, greedy argmax on the device included), and the
//     achieved bytes/s of weights + KV cache read per step as a fraction of the copy bandwidth
//     (MoE: the weights outside the experts plus the distinct experts the batch routes to,
//     counted per layer on a traced step);
//   - prefill tokens/s (--prefill tokens per forward).
// Output: a table on stdout and --json FILE. HF transformers on the same shapes runs from
// tools/device/bench_hf.py; the device script puts both in one report.
#include <cuda_runtime_api.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <iostream>
#include <map>
#include <sstream>
#include <stdexcept>

#include "core/capture/trace.h"
#include "core/json_util.h"
#include "engine_bench_util.h"
#include "gpu_engine/cuda_check.h"
#include "gpu_engine/device_info.h"
#include "gpu_engine/engine.h"
#include "gpu_engine/kernels/decode_attention.h"
#include "gpu_engine/kernels/gemm.h"
#include "gpu_engine/kernels/random_init.h"
#include "gpu_engine/kernels/skinny_gemm.h"
#include "gpu_engine/random_model.h"

namespace {

using namespace qparity;
using namespace qparity::bench;

// Each decode-shaped linear of a model (M = 1 and 8) through the skinny GEMM and through
// cuBLASLt on the same buffers: microseconds per launch and weight bytes/s, the skinny kernel's
// speedup. Launches cycle through copies of the weight (256 MiB in all), so each reads its
// weight from DRAM as a real forward does, where consecutive layers have other weights.
Json bench_linears(const std::string& name, const ModelConfig& c, double bw) {
  struct Shape {
    const char* what;
    int64_t n, k;
  };
  const int64_t qkv = c.q_size() + 2 * c.kv_size();
  const std::vector<Shape> shapes = {{"qkv", qkv, c.hidden},
                                     {"o_proj", c.hidden, c.q_size()},
                                     {"gate_up", 2 * c.intermediate, c.hidden},
                                     {"down", c.hidden, c.intermediate},
                                     {"lm_head", c.vocab, c.hidden}};
  gpu::BlasLtGemm gemm;
  cudaStream_t s;
  QPARITY_CUDA_CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  cudaEvent_t e0, e1;
  QPARITY_CUDA_CHECK(cudaEventCreate(&e0));
  QPARITY_CUDA_CHECK(cudaEventCreate(&e1));
  Json out = Json::array();
  for (const Shape& sh : shapes) {
    // Several copies of the weight, cycled, so each launch reads its weight from DRAM.
    const size_t wsize = static_cast<size_t>(sh.n * sh.k);
    const int copies = static_cast<int>(std::max<size_t>(1, (size_t{256} << 20) / (wsize * 2)));
    gpu::Bf16Buffer w(wsize * static_cast<size_t>(copies)), x(static_cast<size_t>(8 * sh.k)),
        y(static_cast<size_t>(8 * sh.n));
    gpu::launch_fill_random_bf16(w.get(), static_cast<int64_t>(w.size()), 0.f, 0.02f, 7, s);
    gpu::launch_fill_random_bf16(x.get(), static_cast<int64_t>(x.size()), 0.f, 1.f, 8, s);
    for (const int64_t m : {1, 2, 4, 8}) {
      // 200 launches captured in one CUDA graph, as the engine's decode step runs them: the
      // host's launch cost is out of the measurement, the launch-to-launch gaps are in.
      const auto time = [&](auto&& launch) {
        for (int i = 0; i < 3; ++i)
          launch(w.get());
        const int reps = 200;
        cudaGraph_t graph;
        cudaGraphExec_t exec;
        QPARITY_CUDA_CHECK(cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal));
        for (int i = 0; i < reps; ++i)
          launch(w.get() + static_cast<size_t>(i % copies) * wsize);
        QPARITY_CUDA_CHECK(cudaStreamEndCapture(s, &graph));
        QPARITY_CUDA_CHECK(cudaGraphInstantiate(&exec, graph, 0));
        QPARITY_CUDA_CHECK(cudaGraphLaunch(exec, s));  // warm-up
        QPARITY_CUDA_CHECK(cudaEventRecord(e0, s));
        QPARITY_CUDA_CHECK(cudaGraphLaunch(exec, s));
        QPARITY_CUDA_CHECK(cudaEventRecord(e1, s));
        QPARITY_CUDA_CHECK(cudaEventSynchronize(e1));
        float ms = 0;
        QPARITY_CUDA_CHECK(cudaEventElapsedTime(&ms, e0, e1));
        cudaGraphExecDestroy(exec);
        cudaGraphDestroy(graph);
        return ms * 1e3 / reps;
      };
      const double us_blas = time([&](const __nv_bfloat16* wp) {
        gemm.nt(x.get(), wp, y.get(), gpu::GemmOut::kBf16, m, sh.n, sh.k, s);
      });
      double us_skinny = 0;
      if (gpu::skinny_gemm_fits(m, sh.k))
        us_skinny = time([&](const __nv_bfloat16* wp) {
          gpu::SkinnyGemmParams p;
          p.x = x.get(), p.w = wp, p.y = y.get(), p.m = m, p.n = sh.n, p.k = sh.k;
          gpu::launch_skinny_gemm(p, s);
        });
      const double bytes = static_cast<double>(wsize) * 2;
      std::cout << "  " << name << " " << sh.what << " M=" << m << " N=" << sh.n << " K=" << sh.k
                << ": cuBLASLt " << us_blas << " us (" << bytes / us_blas / 1e3 << " GB/s)";
      if (us_skinny > 0)
        std::cout << ", skinny " << us_skinny << " us (" << bytes / us_skinny / 1e3 << " GB/s, "
                  << 100 * bytes / (us_skinny * 1e-6) / bw << " % of copy bandwidth), speedup "
                  << us_blas / us_skinny;
      std::cout << "\n";
      out.push_back({{"model", name},
                     {"linear", sh.what},
                     {"m", m},
                     {"n", sh.n},
                     {"k", sh.k},
                     {"cublaslt_us", us_blas},
                     {"skinny_us", us_skinny},
                     {"weight_bytes", bytes}});
    }
  }
  cudaEventDestroy(e0);
  cudaEventDestroy(e1);
  cudaStreamDestroy(s);
  return out;
}

// Where a decode step's time goes (EngineOptions::kernel_timeline): `steps` more steps, each
// probed kernel's run after its wait release and the gap before that release (since the kernel
// before it ended), averaged per kernel family; printed and returned.
Json timeline_study(gpu::Engine& e, const std::function<void(int64_t)>& step, int64_t steps,
                    const std::string& name, int64_t batch) {
  struct Acc {
    int64_t n = 0;
    double run = 0, gap = 0, early = 0, late_start = 0, late_release = 0;
  };
  std::map<std::string, Acc> by;
  std::vector<std::string> order;
  double span = 0;
  for (int64_t k = 0; k < steps; ++k) {
    step(k);
    const std::vector<gpu::TimelineEntry> t = e.timeline();
    if (t.empty()) throw std::runtime_error("no timeline: is the batch decode-sized?");
    span += t.back().end_us - t.front().start_us;
    for (size_t i = 0; i < t.size(); ++i) {
      if (!by.count(t[i].kernel)) order.push_back(t[i].kernel);
      Acc& a = by[t[i].kernel];
      a.n += 1;
      a.run += t[i].end_us - t[i].release_us;
      a.early += t[i].release_us - t[i].start_us;
      a.late_start += t[i].last_start_us - t[i].release_us;
      a.late_release += t[i].last_release_us - t[i].release_us;
      if (i > 0) a.gap += t[i].release_us - t[i - 1].end_us;
    }
  }
  const double per = static_cast<double>(steps);
  std::cout << name << " batch " << batch << " timeline, mean over " << steps
            << " probed steps: first start to last end " << span / per << " us\n"
            << "  kernel          per step   run after release (us)   gap before release (us)"
               "   started early by (us)   last start / last release after release (us)   total "
               "(us/step)\n";
  Json rows = Json::array();
  for (const std::string& k : order) {
    const Acc& a = by[k];
    const double n = static_cast<double>(a.n);
    const double total = (a.run + a.gap) / per;
    std::printf("  %-14s %9.1f %24.2f %25.2f %23.2f %22.2f / %-22.2f %17.1f\n", k.c_str(), n / per,
                a.run / n, a.gap / n, a.early / n, a.late_start / n, a.late_release / n, total);
    rows.push_back({{"kernel", k},
                    {"per_step", n / per},
                    {"run_us", a.run / n},
                    {"gap_us", a.gap / n},
                    {"early_us", a.early / n},
                    {"last_start_after_release_us", a.late_start / n},
                    {"last_release_after_release_us", a.late_release / n},
                    {"total_us_per_step", total}});
  }
  return {{"span_us", span / per}, {"kernels", rows}};
}

// Where the decode attention's time goes (--attention-stages, batch 1): `steps` more steps with
// the per-block stage stamps on (decode_attention.h); for each step's last layer, the min /
// median / max over the token's blocks of each stage in us from the first block's release,
// averaged over the steps; and for each head the block that counted last (the one that merges
// the chunks): when it counted and when it exited.
void attention_stage_study(const std::function<void(int64_t)>& step, int64_t steps, int64_t heads,
                           int64_t max_context, int64_t chunk) {
  const int64_t chunks_max = (max_context + chunk - 1) / chunk;
  const int S = gpu::kStageSlots;
  std::vector<double> lo(8), med(8), hi(8);
  double m_count = 0, m_exit = 0, m_dur = 0, nonm_exit = 0, active = 0;
  for (int64_t k = 0; k < steps; ++k) {
    gpu::reset_decode_attention_stages();
    step(k);
    const std::vector<unsigned long long> st =
        gpu::read_decode_attention_stages(heads * chunks_max);
    std::vector<int64_t> blocks;
    unsigned long long r = ~0ull;
    for (int64_t b = 0; b < heads * chunks_max; ++b) {
      const unsigned long long* x = &st[static_cast<size_t>(b * S)];
      if (x[0] == 0 || b % chunks_max >= static_cast<int64_t>(x[8])) continue;
      blocks.push_back(b);
      r = std::min(r, x[2]);
    }
    active += static_cast<double>(blocks.size());
    for (int s2 = 0; s2 < 8; ++s2) {
      std::vector<double> v;
      for (const int64_t b : blocks) {
        const unsigned long long t = st[static_cast<size_t>(b * S + s2)];
        if (s2 == 6 && t == 0) continue;
        v.push_back((static_cast<double>(t) - static_cast<double>(r)) * 1e-3);
      }
      if (v.empty()) continue;
      std::sort(v.begin(), v.end());
      lo[s2] += v.front();
      med[s2] += v[v.size() / 2];
      hi[s2] += v.back();
    }
    double me = 0, mc = 0, md = 0, ne = 0;
    int nn = 0;
    for (int64_t h = 0; h < heads; ++h) {
      int64_t best = -1;
      for (const int64_t b : blocks)
        if (b / chunks_max == h && (best < 0 || st[static_cast<size_t>(b * S + 6)] >
                                                    st[static_cast<size_t>(best * S + 6)]))
          best = b;
      if (best < 0) continue;
      const unsigned long long* x = &st[static_cast<size_t>(best * S)];
      mc += (static_cast<double>(x[6]) - static_cast<double>(r)) * 1e-3;
      me += (static_cast<double>(x[7]) - static_cast<double>(r)) * 1e-3;
      md += (static_cast<double>(x[7]) - static_cast<double>(x[6])) * 1e-3;
      for (const int64_t b : blocks)
        if (b / chunks_max == h && b != best) {
          ne += (static_cast<double>(st[static_cast<size_t>(b * S + 7)]) - static_cast<double>(r)) *
                1e-3;
          ++nn;
        }
    }
    m_count += mc / static_cast<double>(heads);
    m_exit += me / static_cast<double>(heads);
    m_dur += md / static_cast<double>(heads);
    nonm_exit += nn ? ne / nn : 0;
  }
  const double n = static_cast<double>(steps);
  const char* names[8] = {"entry",        "before wait",  "released", "q ready",
                          "softmax done", "warps merged", "counted",  "exit"};
  std::printf(
      "attention stages (last layer, us from the first release, mean over %lld steps, "
      "%.1f active blocks):\n",
      static_cast<long long>(steps), active / n);
  for (int s2 = 0; s2 < 8; ++s2)
    std::printf("  %-14s min %8.2f  median %8.2f  max %8.2f\n", names[s2], lo[s2] / n, med[s2] / n,
                hi[s2] / n);
  std::printf("  merging blocks: counted at %.2f, exit at %.2f (merge %.2f); others exit at %.2f\n",
              m_count / n, m_exit / n, m_dur / n, nonm_exit / n);
}

struct Options {
  int64_t context = 512, steps = 64, prefill = 2048;
  std::string models = "qwen3-0.6b,llama3-8b", json;
  std::vector<int64_t> batches = {1, 8, 64};
  bool linears = true;
  int64_t attention_chunk = gpu::EngineOptions{}.decode_attention_chunk;
  bool timeline = false, attention_stages = false;
  std::string ablate;                                // "", "attention", "linears"
  std::string experts = "bf16,fp8-block,w4a16-g32";  // qwen3-30b-a3b's expert formats
  std::string dense = "bf16";  // the dense models' linear formats, a model each
};

Json bench_model(const std::string& name, const ModelConfig& cfg, const Options& o, double bw,
                 const std::string& expert_scheme = "bf16",
                 const std::string& dense_scheme = "bf16") {
  auto model = gpu::random_gpu_model(cfg, 1, expert_scheme, dense_scheme);
  const double weight_bytes = static_cast<double>(model->weight_bytes);
  // MoE: a step reads the weights outside the experts (the untied embedding table aside: only the
  // batch's rows) and, per layer, the experts its tokens route to; one expert's w13 + w2 bytes.
  double expert_bytes = 0, non_expert_bytes = weight_bytes;
  int64_t moe_layers = 0;
  for (const gpu::GpuLayerWeights& l : model->layers) {
    if (!l.moe) continue;
    ++moe_layers;
    double all = static_cast<double>(l.w13.bytes() + l.w2.bytes());
    for (const auto* stack : {&l.w13_q, &l.w2_q})
      for (const auto& m : *stack)
        all += static_cast<double>(m->device_bytes());
    expert_bytes = all / static_cast<double>(cfg.num_experts);
    non_expert_bytes -= all;
  }
  if (moe_layers > 0 && !cfg.tie_word_embeddings)
    non_expert_bytes -= static_cast<double>(model->embed.bytes());
  gpu::EngineOptions eo;
  eo.max_tokens = std::max<int64_t>({o.prefill, o.context, 64});
  eo.max_seqs = 64;
  // Decode reaches context + steps; the prefill study runs sequences of up to 512 positions.
  eo.max_context = std::max<int64_t>(o.context + o.steps + 16, 512);
  eo.decode_attention_chunk = o.attention_chunk;
  eo.kernel_timeline = o.timeline;
  eo.attention_stages = o.attention_stages;
  eo.ablate_attention = o.ablate == "attention";
  eo.ablate_linears = o.ablate == "linears";
  const bool ablated = !o.ablate.empty();
  gpu::Engine e(std::move(model), eo);
  Json out = {{"model", name},
              {"weight_bytes", weight_bytes},
              {"ablate", o.ablate},
              {"experts", expert_scheme},
              {"dense", dense_scheme}};
  if (moe_layers > 0) {
    out["expert_bytes"] = expert_bytes;
    out["non_expert_bytes_read_per_step"] = non_expert_bytes;
  }
  const double kv_per_token = 2.0 * 2 * static_cast<double>(cfg.num_layers * cfg.kv_size());
  Json decode = Json::array();
  for (const int64_t batch : o.batches) {
    if (batch < 1 || batch > eo.max_seqs)
      throw std::runtime_error("--batches: " + std::to_string(batch) + " outside [1, " +
                               std::to_string(eo.max_seqs) + "]");
    // Prefill every sequence (one forward per sequence keeps the token count in bounds).
    const auto prefill_all = [&] { prefill_sequences(e, batch, o.context); };
    prefill_all();
    std::vector<int32_t> next(static_cast<size_t>(batch), 1);
    double sampling_secs = 0;  // the greedy argmax and the ids' trip to the host, within a step
    const auto step = [&](int64_t k) {
      gpu::Batch b;
      for (int32_t s = 0; s < batch; ++s) {
        b.tokens.push_back(next[static_cast<size_t>(s)]);
        b.slots.push_back(s);
        b.positions.push_back(static_cast<int32_t>(o.context + k));
      }
      e.forward_graph(b);
      const auto t1 = std::chrono::steady_clock::now();
      next = e.greedy(batch);
      sampling_secs += seconds(t1);
      for (int32_t& id : next) {
        if (id >= 0) continue;
        // An ablated forward computes nothing meaningful; a real one must never give NaN logits.
        if (!ablated) throw std::runtime_error(name + ": decode step gave NaN logits");
        id = 1;
      }
    };
    step(0);  // captures the graph for this batch size
    // MoE: the distinct experts a decode step of this batch reads per layer, counted on one
    // traced step (the router's top-k ids of every layer).
    double active_experts = 0;
    if (moe_layers > 0) {
      Trace tr("*.moe.topk_ids");
      gpu::Batch b;
      for (int32_t s = 0; s < batch; ++s) {
        b.tokens.push_back(next[static_cast<size_t>(s)]);
        b.slots.push_back(s);
        b.positions.push_back(static_cast<int32_t>(o.context + 1));
      }
      e.forward(b, &tr);
      for (const auto& [point, ids] : tr.points()) {
        std::vector<bool> seen(static_cast<size_t>(cfg.num_experts), false);
        for (int64_t r = 0; r < ids.rows; ++r)
          for (int64_t j = 0; j < ids.cols; ++j)
            seen[static_cast<size_t>(ids(r, j))] = true;
        active_experts += static_cast<double>(std::count(seen.begin(), seen.end(), true));
      }
      active_experts /= static_cast<double>(moe_layers);
    }
    for (int32_t s = 0; s < batch; ++s)
      e.release(s);
    prefill_all();  // again, so the timed steps start at the same positions
    sampling_secs = 0;
    const auto t0 = std::chrono::steady_clock::now();
    for (int64_t k = 0; k < o.steps; ++k)
      step(k);
    const double secs = seconds(t0);
    double kv_bytes = 0;
    for (int64_t k = 0; k < o.steps; ++k)
      kv_bytes +=
          static_cast<double>(batch) * static_cast<double>(o.context + k + 1) * kv_per_token;
    const double step_weights =
        moe_layers > 0
            ? non_expert_bytes + active_experts * static_cast<double>(moe_layers) * expert_bytes
            : weight_bytes;
    const double bytes = step_weights * static_cast<double>(o.steps) + kv_bytes;
    const double tps = static_cast<double>(batch * o.steps) / secs;
    decode.push_back({{"batch", batch},
                      {"tokens_per_s", tps},
                      {"ms_per_step", secs / static_cast<double>(o.steps) * 1e3},
                      {"sampling_ms_per_step", sampling_secs / static_cast<double>(o.steps) * 1e3},
                      {"bytes_per_s", bytes / secs},
                      {"fraction_of_copy_bandwidth", bytes / secs / bw}});
    std::cout << name << " decode batch " << batch << (ablated ? " [without " + o.ablate + "]" : "")
              << ": " << tps << " tokens/s, " << secs / static_cast<double>(o.steps) * 1e3
              << " ms/step, weights+KV " << bytes / secs / 1e9
              << " GB/s = " << 100 * bytes / secs / bw << " % of copy bandwidth (greedy sampling "
              << sampling_secs / static_cast<double>(o.steps) * 1e3 << " ms/step of it)\n";
    if (moe_layers > 0) {
      const double active = active_experts * static_cast<double>(moe_layers) * expert_bytes;
      decode.back()["active_experts_per_layer"] = active_experts;
      decode.back()["active_expert_bytes_per_step"] = active;
      decode.back()["moe_on_device"] = e.moe_on_device(batch);
      std::cout << name << " decode batch " << batch << ": " << active_experts
                << " distinct experts a layer, " << active / 1e9 << " GB of active experts a step"
                << " (+ " << non_expert_bytes / 1e9 << " GB other weights); experts "
                << (e.moe_on_device(batch) ? "grouped on the device (CUDA graph)"
                                           : "per expert from the host")
                << "\n";
    }
    if (moe_layers == 0 || e.moe_on_device(batch)) {
      // the last step's graph replayed back to back: a step without the host's per-step work
      e.replay_graph(batch, 8);
      const auto t2 = std::chrono::steady_clock::now();
      e.replay_graph(batch, o.steps);
      const double rs = seconds(t2) / static_cast<double>(o.steps);
      decode.back()["replayed_ms_per_step"] = rs * 1e3;
      std::cout << name << " decode batch " << batch << ": the step's graph replayed back to back "
                << rs * 1e3 << " ms/step (" << static_cast<double>(batch) / rs << " tokens/s)\n";
    }
    if (o.timeline) decode.back()["timeline"] = timeline_study(e, step, o.steps, name, batch);
    if (o.attention_stages && batch == 1)
      attention_stage_study(step, o.steps, cfg.num_heads, eo.max_context, o.attention_chunk);
    for (int32_t s = 0; s < batch; ++s)
      e.release(s);
  }
  out["decode"] = decode;
  {
    gpu::Batch b;
    // Sequences of up to 512 tokens, --prefill tokens in all (a forward takes at most max_tokens).
    const int64_t per = std::min<int64_t>(512, std::max<int64_t>(o.prefill, 1)),
                  seqs = std::max<int64_t>(1, o.prefill / per);
    for (int32_t s = 0; s < seqs; ++s)
      for (int64_t i = 0; i < per; ++i) {
        b.tokens.push_back(static_cast<int32_t>((s * 31 + i * 17) % cfg.vocab));
        b.slots.push_back(s);
        b.positions.push_back(static_cast<int32_t>(i));
      }
    e.forward(b);  // warm-up (GEMM plans)
    for (int32_t s = 0; s < seqs; ++s)
      e.release(s);
    const auto t0 = std::chrono::steady_clock::now();
    const int reps = 3;
    for (int r = 0; r < reps; ++r) {
      e.forward(b);
      for (int32_t s = 0; s < seqs; ++s)
        e.release(s);
    }
    const double tps = static_cast<double>(b.size() * reps) / seconds(t0);
    out["prefill"] = {{"tokens", b.size()}, {"sequences", seqs}, {"tokens_per_s", tps}};
    std::cout << name << " prefill " << b.size() << " tokens (" << seqs << " x " << per
              << "): " << tps << " tokens/s\n";
  }
  return out;
}

}  // namespace

int main(int argc, char** argv) {
  Options o;
  CLI::App app("GPU engine decode / prefill throughput against the device's copy bandwidth");
  app.add_option("--context", o.context, "prefilled tokens per sequence before decode")
      ->capture_default_str();
  app.add_option("--steps", o.steps, "timed decode steps")->capture_default_str();
  app.add_option("--prefill", o.prefill, "prefill tokens per forward")->capture_default_str();
  app.add_option("--models", o.models, "qwen3-0.6b,llama3-8b,qwen3-30b-a3b")->capture_default_str();
  app.add_option("--experts", o.experts,
                 "qwen3-30b-a3b: the experts' formats, each a model (bf16, fp8-block, w4a16-g32)")
      ->capture_default_str();
  app.add_option("--dense", o.dense,
                 "qwen3-0.6b, llama3-8b: the attention and MLP linears' formats, each a model "
                 "(bf16, fp8-block, w4a16-g32, ct-w4a16-g128, w8a16-ch; the head stays bf16)")
      ->capture_default_str();
  app.add_option("--batches", o.batches, "decode batch sizes")
      ->delimiter(',')
      ->capture_default_str();
  app.add_flag("!--no-linears", o.linears, "skip the per-linear skinny vs cuBLASLt comparison");
  app.add_option("--attention-chunk", o.attention_chunk, "decode attention: keys per block")
      ->capture_default_str();
  app.add_flag("--attention-stages", o.attention_stages,
               "decode batch 1: stamp the decode attention's stages per block (decode_attention.h) "
               "and print, for each step's last layer, when its blocks reach each stage");
  app.add_flag("--timeline", o.timeline,
               "decode: stamp the main kernels (kernel_probe.h) and print where a step's time goes "
               "(the timed steps then carry the probes' small cost)");
  app.add_option("--ablate", o.ablate,
                 "timing study: leave out 'attention' (prologue + attention) or 'linears' (every "
                 "GEMM) and report the step time without them (results meaningless)")
      ->check(CLI::IsMember({"attention", "linears"}));
  app.add_option("--json", o.json, "write the results here");
  CLI11_PARSE(app, argc, argv);
  try {
    std::string why;
    const auto dev = gpu::query_device(0, &why);
    if (!dev) {
      std::cerr << "bench_engine: no CUDA device: " << why << "\n";
      return 2;
    }
    const double bw = copy_bandwidth();
    std::cout << "device " << dev->name << " " << dev->sm() << ": device-to-device copy "
              << bw / 1e9 << " GB/s (read + write)\n";
    Json j = {{"device", dev->name + " " + dev->sm()}, {"copy_bytes_per_s", bw}};
    Json linears = Json::array();
    for (const auto& [name, cfg] : {std::pair{std::string("qwen3-0.6b"), qwen3_06b()},
                                    std::pair{std::string("llama3-8b"), llama3_8b()}})
      if (o.linears && o.models.find(name) != std::string::npos)
        for (auto& r : bench_linears(name, cfg, bw))
          linears.push_back(r);
    j["linears"] = linears;
    Json models = Json::array();
    const auto dense_models = [&](const std::string& name, const ModelConfig& cfg) {
      std::stringstream list(o.dense);
      for (std::string x; std::getline(list, x, ',');)
        models.push_back(bench_model(x == "bf16" ? name : name + "/" + x, cfg, o, bw, "bf16", x));
    };
    if (o.models.find("qwen3-0.6b") != std::string::npos) dense_models("qwen3-0.6b", qwen3_06b());
    if (o.models.find("llama3-8b") != std::string::npos) dense_models("llama3-8b", llama3_8b());
    if (o.models.find("qwen3-30b-a3b") != std::string::npos) {
      std::stringstream list(o.experts);
      for (std::string x; std::getline(list, x, ',');)
        models.push_back(bench_model("qwen3-30b-a3b/" + x, qwen3_30b_a3b(), o, bw, x));
    }
    j["models"] = models;
    if (!o.json.empty()) write_bench_json(o.json, j);
  } catch (const std::exception& e) {
    std::cerr << "bench_engine: " << e.what() << "\n";
    return 1;
  }
  return 0;
}
