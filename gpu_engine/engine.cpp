#include "gpu_engine/engine.h"

#include <algorithm>
#include <cmath>

#include "core/capture/trace.h"
#include "core/error.h"
#include "core/parallel/tp_gather.h"
#include "gpu_engine/cuda_check.h"
#include "gpu_engine/kernels/prefill_attention.h"
#include "gpu_engine/kernels/sampling.h"
#include "gpu_engine/kernels/skinny_gemm.h"

namespace qparity::gpu {

Engine::Engine(std::unique_ptr<GpuModel> model, const EngineOptions& o, TpComm* comm)
    : model_(std::move(model)),
      options_(o),
      // Eight probed kernels a layer at most, plus the head's.
      timeline_(o.kernel_timeline, 8 * model_->cfg.num_layers + 8) {
  const ModelConfig& c = model_->kcfg();
  if (o.max_tokens <= 0 || o.max_seqs <= 0 || o.max_context <= 0 || o.block_size <= 0)
    throw Error("engine", "max_tokens, max_seqs, max_context and block_size must be > 0");
  QPARITY_CUDA_CHECK(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking));
  KvCacheShape ks;
  ks.block_size = o.block_size;
  ks.max_seqs = o.max_seqs;
  ks.max_blocks_per_seq = (o.max_context + o.block_size - 1) / o.block_size;
  ks.num_blocks = ks.max_seqs * ks.max_blocks_per_seq;
  cache_ = std::make_unique<PagedKvCache>(c, ks, model_->kv_formats());
  const size_t t = static_cast<size_t>(o.max_tokens);
  // [tokens | slots | positions | prefill tiles (count, then first row and rows per tile)]
  // ... then, at a fixed offset, decode-sized batches' per-token block-table rows.
  const size_t input_ints = static_cast<size_t>(runs_offset()) + 2 * t + 1;
  inputs_ = DeviceBuffer<int32_t>(input_ints);
  QPARITY_CUDA_CHECK(
      cudaMallocHost(reinterpret_cast<void**>(&pinned_inputs_), input_ints * sizeof(int32_t)));
  next_ids_ = DeviceBuffer<int32_t>(t);
  decoder_ = std::make_unique<Decoder>(*model_, *cache_, o, stream_, timeline_, comm);
  QPARITY_CUDA_CHECK(cudaGetDevice(&device_));
}

void Engine::attach_peers(std::vector<std::unique_ptr<Engine>> peers,
                          std::vector<std::unique_ptr<TpComm>> comms) {
  if (!peers_.empty()) throw Error("engine", "peers are attached once");
  if (comms.size() != peers.size() + 1 || model_->rank != 0 ||
      static_cast<int>(comms.size()) != model_->tp)
    throw Error("engine", "rank 0 of tp " + std::to_string(model_->tp) + " needs " +
                              std::to_string(model_->tp - 1) + " peers and " +
                              std::to_string(model_->tp) + " communicators");
  for (size_t i = 0; i < peers.size(); ++i)
    if (!peers[i] || peers[i]->model_->rank != static_cast<int>(i) + 1)
      throw Error("engine", "peer " + std::to_string(i) + " is not rank " + std::to_string(i + 1));
  comms_ = std::move(comms);
  peers_ = std::move(peers);
  for (const auto& p : peers_)
    workers_.push_back(std::make_unique<RankWorker>(p->device_));
}

void Engine::on_ranks(Trace* tr, const std::function<void(Engine&, Trace*)>& f) {
  if (peers_.empty()) {
    f(*this, tr);
    return;
  }
  std::vector<std::unique_ptr<Trace>> traces;
  if (tr)
    for (size_t r = 0; r <= peers_.size(); ++r)
      traces.push_back(std::make_unique<Trace>(tr->pattern()));
  const auto trace_of = [&](size_t r) { return tr ? traces[r].get() : nullptr; };
  for (size_t i = 0; i < peers_.size(); ++i)
    workers_[i]->post([&, i] { f(*peers_[i], trace_of(i + 1)); });
  // Every rank validates the same batch the same way, so a refusal comes from all of them
  // before any collective starts; a rank failing inside a forward leaves the others waiting in
  // NCCL (the engine is then unusable, as a production engine's ranks are).
  std::exception_ptr first;
  try {
    QPARITY_CUDA_CHECK(cudaSetDevice(device_));
    f(*this, trace_of(0));
  } catch (...) {
    first = std::current_exception();
  }
  for (auto& w : workers_) {
    try {
      w->wait();
    } catch (...) {
      if (!first) first = std::current_exception();
    }
  }
  if (first) std::rethrow_exception(first);
  if (!tr) return;
  std::vector<const Trace*> ranks;
  for (const auto& t : traces)
    ranks.push_back(t.get());
  GatheredTrace g = gather_tp_trace(ranks, model_->whole());
  for (const auto& [name, m] : g.trace.points())
    tr->record(name, m);
  for (const AbsentTpPoint& a : g.absent) {
    bool known = false;
    for (const AbsentPoint& k : tp_absent_)
      known = known || k.name == a.name;
    if (!known) tp_absent_.push_back({a.name, a.reason});
  }
}

void Engine::release(int32_t slot) {
  cache_->release(slot);
  for (auto& p : peers_)
    p->cache_->release(slot);
}

Engine::~Engine() {
  // The other ranks first, each torn down on its own device's thread.
  for (size_t i = 0; i < peers_.size(); ++i) {
    workers_[i]->post([this, i] { peers_[i].reset(); });
    try {
      workers_[i]->wait();
    } catch (...) {  // a destructor must not throw; the process is ending the engine anyway
    }
  }
  if (!peers_.empty()) cudaSetDevice(device_);
  for (auto& [n, g] : graphs_)
    cudaGraphExecDestroy(g);
  if (stream_) {
    cudaStreamSynchronize(stream_);
    decoder_.reset();  // frees its buffers while the stream is idle
    cudaStreamDestroy(stream_);
  }
  if (pinned_inputs_) cudaFreeHost(pinned_inputs_);
}

void Engine::prepare(const Batch& b, bool advances_state) {
  const int64_t t = b.size();
  if (t == 0 || t > options_.max_tokens)
    throw Error("engine batch", std::to_string(t) + " tokens; a forward takes 1.." +
                                    std::to_string(options_.max_tokens));
  if (b.slots.size() != b.tokens.size() || b.positions.size() != b.tokens.size())
    throw Error("engine batch", "tokens, slots and positions differ in length");
  const std::vector<int32_t> runs = recurrent_runs(b);
  for (int64_t i = 0; i < t; ++i) {
    const size_t u = static_cast<size_t>(i);
    if (b.tokens[u] < 0 || b.tokens[u] >= config().vocab)
      throw Error("engine batch", "token " + std::to_string(i) + " has id " +
                                      std::to_string(b.tokens[u]) + ", outside the vocabulary (" +
                                      std::to_string(config().vocab) + ")");
    if (b.positions[u] < 0 || b.positions[u] >= options_.max_context)
      throw Error("engine batch", "token " + std::to_string(i) + " at position " +
                                      std::to_string(b.positions[u]) + ", outside [0, " +
                                      std::to_string(options_.max_context) + ")");
    // The attention kernels compute full causal attention, which a sliding window (Mistral)
    // equals only while every key lies inside it.
    if (config().sliding_window > 0 && b.positions[u] >= config().sliding_window)
      throw Error("engine batch",
                  "token " + std::to_string(i) + " at position " + std::to_string(b.positions[u]) +
                      ": sliding_window " + std::to_string(config().sliding_window) +
                      " attention past the window is not in the GPU engine yet (positions below "
                      "it are exact: the window then holds every key)");
    cache_->reserve(b.slots[u], b.positions[u] + 1);  // checks the slot
  }
  cache_->sync(stream_);
  timeline_.end();  // run() starts it; a forward that threw must not leave it to the next
  // The previous forward's upload is done: forward() and forward_graph() synchronize the stream.
  std::copy(b.tokens.begin(), b.tokens.end(), pinned_inputs_);
  std::copy(b.slots.begin(), b.slots.end(), pinned_inputs_ + t);
  std::copy(b.positions.begin(), b.positions.end(), pinned_inputs_ + 2 * t);
  // Prefill tiles: batches with a sequence of several rows (prefill chunks) take the query-tiled
  // attention; decode-only batches (one row per sequence) keep the per-token kernel.
  const std::vector<int32_t> tiles = plan_prefill_tiles(b.slots);
  const int64_t head_dim = model_->kcfg().head_dim;
  tiled_attention_ = t > kSkinnyMaxM && tiles[0] < t && (head_dim == 64 || head_dim == 128);
  attention_tiles_ = tiles[0];
  std::copy(tiles.begin(), tiles.end(), pinned_inputs_ + 3 * t);
  QPARITY_CUDA_CHECK(cudaMemcpyAsync(inputs_.get(), pinned_inputs_,
                                     static_cast<size_t>(3 * t) * 4 + tiles.size() * 4,
                                     cudaMemcpyHostToDevice, stream_));
  if (t <= kSkinnyMaxM) {  // the decode attention reads each token's table row directly
    const int64_t mb = cache_->shape().max_blocks_per_seq;
    int32_t* rows = pinned_inputs_ + token_tables_offset();
    for (int64_t i = 0; i < t; ++i) {
      const int32_t* row = cache_->host_row(b.slots[static_cast<size_t>(i)]);
      std::copy(row, row + mb, rows + i * mb);
    }
    QPARITY_CUDA_CHECK(cudaMemcpyAsync(inputs_.get() + token_tables_offset(), rows,
                                       static_cast<size_t>(t * mb) * sizeof(int32_t),
                                       cudaMemcpyHostToDevice, stream_));
  }
  if (!runs.empty()) {
    std::copy(runs.begin(), runs.end(), pinned_inputs_ + runs_offset());
    QPARITY_CUDA_CHECK(
        cudaMemcpyAsync(inputs_.get() + runs_offset(), pinned_inputs_ + runs_offset(),
                        runs.size() * sizeof(int32_t), cudaMemcpyHostToDevice, stream_));
  }
  prepare_images(b);
  // The batch is valid: the slots' recurrent states will have taken its tokens. (A layer or the
  // head run alone moves no whole-model state forward: a re-run of each layer on the same
  // positions stays allowed.)
  if (advances_state)
    for (int32_t r = 0; !runs.empty() && r < runs[0]; ++r) {
      const int32_t first = runs[static_cast<size_t>(1 + 2 * r)];
      cache_->advance_recurrent(b.slots[static_cast<size_t>(first)],
                                b.positions[static_cast<size_t>(first)],
                                runs[static_cast<size_t>(2 + 2 * r)]);
    }
  decoder_->begin(step_inputs(t));
}

void Engine::prepare_images(const Batch& b) {
  mrope_ = rope_shift_ = false;
  image_count_ = deepstack_taps_ = 0;
  if (!b.has_images()) return;
  const ModelConfig& c = config();
  const std::string where = "engine batch";
  if (!c.image_text || model_->mrope_rows.size() == 0)
    throw Error(where, c.arch_name + " takes no image prompts (rope_rows / image_rows)");
  if (model_->tp > 1)
    throw Error(where, "image prompts under tensor parallelism are not in the GPU engine yet");
  const int64_t t = b.size(), hd = c.hidden, n = static_cast<int64_t>(b.image_rows.size());
  std::vector<int32_t> ints(static_cast<size_t>(4 * t + n), 0);
  if (!b.rope_rows.empty()) {
    if (static_cast<int64_t>(b.rope_rows.size()) != 3 * t)
      throw Error(where, "rope_rows holds " + std::to_string(b.rope_rows.size()) +
                             " values; a batch of " + std::to_string(t) +
                             " tokens needs 3 rows of them (time, height, width)");
    for (int64_t i = 0; i < t; ++i) {
      const auto at = [&](int64_t r) { return b.rope_rows[static_cast<size_t>(r * t + i)]; };
      for (int64_t r = 0; r < 3; ++r)
        if (at(r) < 0)
          throw Error(where, "token " + std::to_string(i) + " has a negative rotary position");
      mrope_ = mrope_ || at(1) != at(0) || at(2) != at(0);
      rope_shift_ = rope_shift_ || at(0) != b.positions[static_cast<size_t>(i)];
      ints[static_cast<size_t>(3 * t + i)] = at(0);
    }
    std::copy(b.rope_rows.begin(), b.rope_rows.end(), ints.begin());
  }
  const auto deepstack_taps = static_cast<int64_t>(b.deepstack.size());
  if (deepstack_taps > c.num_layers)
    throw Error(where, std::to_string(deepstack_taps) + " deepstack features for a decoder of " +
                           std::to_string(c.num_layers) + " layers");
  if (n > 0) {
    std::vector<__nv_bfloat16> feats(static_cast<size_t>((1 + deepstack_taps) * n * hd));
    const auto take = [&](const std::vector<double>& v, int64_t slot, const std::string& name) {
      if (static_cast<int64_t>(v.size()) != n * hd)
        throw Error(where, name + " holds " + std::to_string(v.size()) + " values for " +
                               std::to_string(n) + " image rows of hidden " + std::to_string(hd));
      for (size_t k = 0; k < v.size(); ++k) {
        if (!std::isfinite(v[k]))
          throw Error(where, name + ": value " + std::to_string(k) + " is not finite");
        feats[static_cast<size_t>(slot * n * hd) + k] = __double2bfloat16(v[k]);
      }
    };
    take(b.image_embeds, 0, "image_embeds");
    for (int64_t k = 0; k < deepstack_taps; ++k)
      take(b.deepstack[static_cast<size_t>(k)], 1 + k, "deepstack " + std::to_string(k));
    for (int64_t j = 0; j < n; ++j) {
      const int32_t r = b.image_rows[static_cast<size_t>(j)];
      if (r < 0 || r >= t || (j > 0 && r <= b.image_rows[static_cast<size_t>(j - 1)]))
        throw Error(where, "image_rows entry " + std::to_string(j) + " (" + std::to_string(r) +
                               ") is not an ascending row of the batch's " + std::to_string(t));
      ints[static_cast<size_t>(4 * t + j)] = r;
    }
    if (image_feats_.size() < feats.size())
      image_feats_ = DeviceBuffer<__nv_bfloat16>(feats.size());
    QPARITY_CUDA_CHECK(cudaMemcpyAsync(image_feats_.get(), feats.data(), feats.size() * 2,
                                       cudaMemcpyHostToDevice, stream_));
  } else if (deepstack_taps > 0 || !b.image_embeds.empty()) {
    throw Error(where, "image features without image_rows");
  }
  if (image_ints_.size() < ints.size()) image_ints_ = DeviceBuffer<int32_t>(ints.size());
  QPARITY_CUDA_CHECK(cudaMemcpyAsync(image_ints_.get(), ints.data(), ints.size() * 4,
                                     cudaMemcpyHostToDevice, stream_));
  image_count_ = n;
  deepstack_taps_ = n > 0 ? deepstack_taps : 0;
}

std::vector<int32_t> Engine::recurrent_runs(const Batch& b) const {
  if (!cache_->recurrent()) return {};
  std::vector<int32_t> runs{0};
  std::vector<bool> seen(static_cast<size_t>(options_.max_seqs), false);
  const int64_t t = b.size();
  for (int64_t i = 0; i < t;) {
    const int32_t slot = b.slots[static_cast<size_t>(i)];
    if (slot < 0 || slot >= options_.max_seqs)
      throw Error("engine batch", "token " + std::to_string(i) + " has slot " +
                                      std::to_string(slot) + ", outside [0, " +
                                      std::to_string(options_.max_seqs) + ")");
    if (seen[static_cast<size_t>(slot)])
      throw Error(
          "engine batch",
          "slot " + std::to_string(slot) + "'s tokens are not consecutive rows (token " +
              std::to_string(i) +
              "): a recurrent (Gated DeltaNet) model takes each sequence's tokens in order");
    seen[static_cast<size_t>(slot)] = true;
    int64_t n = 1;
    while (i + n < t && b.slots[static_cast<size_t>(i + n)] == slot) {
      if (b.positions[static_cast<size_t>(i + n)] != b.positions[static_cast<size_t>(i)] + n)
        throw Error("engine batch", "token " + std::to_string(i + n) + " of slot " +
                                        std::to_string(slot) + " at position " +
                                        std::to_string(b.positions[static_cast<size_t>(i + n)]) +
                                        ", not the next position: a recurrent (Gated DeltaNet) "
                                        "model takes each sequence's tokens in order");
      ++n;
    }
    cache_->check_recurrent_run(slot, b.positions[static_cast<size_t>(i)]);
    runs.push_back(static_cast<int32_t>(i));
    runs.push_back(static_cast<int32_t>(n));
    ++runs[0];
    i += n;
  }
  return runs;
}

StepInputs Engine::step_inputs(int64_t t) const {
  const int32_t* in = inputs_.get();
  return {
      .t = t,
      .tokens = in,
      .slots = in + t,
      .positions = in + 2 * t,
      .tiles = in + 3 * t,
      .token_tables = in + token_tables_offset(),
      .runs = in + runs_offset(),
      .mrope = mrope_ ? image_ints_.get() : nullptr,
      .rope_positions = rope_shift_ && !mrope_ ? image_ints_.get() + 3 * t : nullptr,
      .image_rows = image_count_ > 0 ? image_ints_.get() + 4 * t : nullptr,
      .image_embeds = image_count_ > 0 ? image_feats_.get() : nullptr,
      .deepstack = image_count_ > 0 ? image_feats_.get() + image_count_ * config().hidden : nullptr,
      .image_count = image_count_,
      .deepstack_taps = deepstack_taps_,
      .tiled_attention = tiled_attention_,
      .attention_tiles = attention_tiles_};
}

void Engine::run(int64_t t, Trace* tr) {
  if (options_.kernel_timeline && t <= kSkinnyMaxM) timeline_.begin(t, stream_);
  decoder_->forward(tr);
  timeline_.end();
}

void Engine::forward(const Batch& b, Trace* capture_to) {
  on_ranks(capture_to, [&](Engine& e, Trace* t) { e.forward_rank(b, t); });
}

void Engine::forward_graph(const Batch& b) {
  on_ranks(nullptr, [&](Engine& e, Trace*) { e.forward_graph_rank(b); });
}

void Engine::replay_graph(int64_t t, int64_t times) {
  on_ranks(nullptr, [&](Engine& e, Trace*) { e.replay_graph_rank(t, times); });
}

void Engine::forward_layer(int64_t layer, const std::vector<double>& input, const Batch& b,
                           Trace* capture_to) {
  on_ranks(capture_to, [&](Engine& e, Trace* t) { e.forward_layer_rank(layer, input, b, t); });
}

void Engine::forward_embed(const Batch& b, Trace* capture_to) {
  on_ranks(capture_to, [&](Engine& e, Trace* t) { e.forward_embed_rank(b, t); });
}

void Engine::forward_final(const std::vector<double>& input, const Batch& b, Trace* capture_to) {
  on_ranks(capture_to, [&](Engine& e, Trace* t) { e.forward_final_rank(input, b, t); });
}

void Engine::forward_rank(const Batch& b, Trace* capture_to) {
  prepare(b);
  run(b.size(), capture_to);
  QPARITY_CUDA_CHECK(cudaStreamSynchronize(stream_));
  decoder_->check_moe_ids();
}

void Engine::forward_graph_rank(const Batch& b) {
  // (An image batch's rotary rows and features live in buffers a graph would not follow.)
  if ((decoder_->any_moe() && !decoder_->moe_on_device(b.size())) || b.has_images()) {
    forward_rank(b, nullptr);
    return;
  }
  const int64_t t = b.size();
  prepare(b);
  // One graph per (size, attention kind); its tiled attention covers up to t tiles.
  const int64_t key = 2 * t + (tiled_attention_ ? 1 : 0);
  if (tiled_attention_) {  // the graph's grid covers up to t tiles, whatever this batch has
    attention_tiles_ = t;
    decoder_->begin(step_inputs(t));
  }
  auto it = graphs_.find(key);
  if (it == graphs_.end()) {
    // Everything the decoder launches reads its inputs from the device buffers prepare()
    // filled, so the captured graph replays correctly for any tokens, slots and positions of
    // this size.
    if (model_->tp > 1) {
      // Tensor parallelism: one eager step first, so NCCL sets up whatever this message size
      // needs outside the capture (it rewrites the same cache rows the graph then rewrites).
      run(t, nullptr);
      QPARITY_CUDA_CHECK(cudaStreamSynchronize(stream_));
    }
    cudaGraph_t g;
    QPARITY_CUDA_CHECK(cudaStreamBeginCapture(stream_, cudaStreamCaptureModeThreadLocal));
    run(t, nullptr);
    QPARITY_CUDA_CHECK(cudaStreamEndCapture(stream_, &g));
    cudaGraphExec_t exec;
    QPARITY_CUDA_CHECK(cudaGraphInstantiate(&exec, g, 0));
    QPARITY_CUDA_CHECK(cudaGraphDestroy(g));
    it = graphs_.emplace(key, exec).first;
  }
  QPARITY_CUDA_CHECK(cudaGraphLaunch(it->second, stream_));
  QPARITY_CUDA_CHECK(cudaStreamSynchronize(stream_));
  decoder_->graph_replayed(t);  // the graph copied the fused argmax's keys to the host
  decoder_->check_moe_ids();
}

void Engine::replay_graph_rank(int64_t t, int64_t times) {
  const auto it = graphs_.find(2 * t);  // (decode graphs: no tiled attention, forward_graph's key)
  if (it == graphs_.end())
    throw Error("engine", "replay_graph: no decode graph of batch size " + std::to_string(t) +
                              " was captured (forward_graph runs one first)");
  for (int64_t i = 0; i < times; ++i)
    QPARITY_CUDA_CHECK(cudaGraphLaunch(it->second, stream_));
  QPARITY_CUDA_CHECK(cudaStreamSynchronize(stream_));
  // Each replay fed the same tokens to the recurrent states again: no slot's state is what its
  // sequence left any more.
  cache_->invalidate_recurrent();
}

void Engine::forward_layer_rank(int64_t layer, const std::vector<double>& input, const Batch& b,
                                Trace* capture_to) {
  const ModelConfig& c = model_->cfg;
  if (layer < 0 || layer >= c.num_layers)
    throw Error("engine layer", "layer " + std::to_string(layer) + " of a model with " +
                                    std::to_string(c.num_layers));
  upload_input(input, b, "engine layer");
  decoder_->forward_layer(layer, capture_to);
  QPARITY_CUDA_CHECK(cudaStreamSynchronize(stream_));
  decoder_->check_moe_ids();
}

void Engine::upload_input(const std::vector<double>& input, const Batch& b, const char* what) {
  const int64_t hd = model_->cfg.hidden;
  if (static_cast<int64_t>(input.size()) != b.size() * hd)
    throw Error(what, "the input has " + std::to_string(input.size()) +
                          " values, the batch needs " + std::to_string(b.size()) + " x " +
                          std::to_string(hd));
  prepare(b, false);
  std::vector<__nv_bfloat16> x(input.size());
  for (size_t i = 0; i < x.size(); ++i) {
    if (!std::isfinite(input[i]))
      throw Error(what, "input value " + std::to_string(i) + " is not finite");
    x[i] = __double2bfloat16(input[i]);  // golden values from an emulate-mode run are exact
  }
  QPARITY_CUDA_CHECK(cudaMemcpyAsync(decoder_->residual(), x.data(), x.size() * 2,
                                     cudaMemcpyHostToDevice, stream_));
}

void Engine::forward_embed_rank(const Batch& b, Trace* capture_to) {
  prepare(b, false);
  decoder_->forward_embed(capture_to);
  QPARITY_CUDA_CHECK(cudaStreamSynchronize(stream_));
}

void Engine::forward_final_rank(const std::vector<double>& input, const Batch& b,
                                Trace* capture_to) {
  upload_input(input, b, "engine final");
  decoder_->forward_final(capture_to);
  QPARITY_CUDA_CHECK(cudaStreamSynchronize(stream_));
}

std::vector<float> Engine::logits_host(int64_t rows) const {
  std::vector<float> out(static_cast<size_t>(rows * config().vocab));
  QPARITY_CUDA_CHECK(
      cudaMemcpy(out.data(), decoder_->logits(), out.size() * 4, cudaMemcpyDeviceToHost));
  return out;
}

std::vector<int32_t> Engine::greedy(int64_t rows) {
  if (rows >= 1 && rows <= decoder_->argmax_rows()) {  // the lm_head's fused argmax, on the host
    std::vector<int32_t> ids(static_cast<size_t>(rows));
    for (int64_t r = 0; r < rows; ++r)
      ids[static_cast<size_t>(r)] = argmax_id(decoder_->argmax_keys()[r]);
    return ids;
  }
  launch_argmax({decoder_->logits(), next_ids_.get(), rows, config().vocab}, stream_);
  std::vector<int32_t> ids(static_cast<size_t>(rows));
  QPARITY_CUDA_CHECK(cudaMemcpyAsync(ids.data(), next_ids_.get(), ids.size() * 4,
                                     cudaMemcpyDeviceToHost, stream_));
  QPARITY_CUDA_CHECK(cudaStreamSynchronize(stream_));
  return ids;
}

}  // namespace qparity::gpu
