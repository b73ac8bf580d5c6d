// The Engine: one thread owns the scheduler, the caches and the model. Callers talk to it only
// through the inbox (new requests, aborts) and the outbox (outputs); neither lock is held while
// the model computes. A step's work is in engine_step.cpp.
#include "revolta/engine.h"

#include <algorithm>
#include <filesystem>
#include <limits>
#include <map>
#if defined(__GLIBC__)  // (defined by the headers above)
#include <malloc.h>
#endif

#include "core/error.h"
#include "engine/engine_impl.h"
#include "engine/kv_offload.h"
#include "engine/kv_calibration.h"
#include "engine/plan.h"

namespace revolta {
namespace fs = std::filesystem;

namespace {

DeviceMemory measure_memory(Device device) {
  size_t free_b = 0, total_b = 0;
  device_runtime(device).memory_info(&free_b, &total_b);
  return {int64_t(total_b), int64_t(free_b)};
}

}  // namespace

Engine::Impl::Impl(const EngineConfig& c) : cfg(c), seed_source(c.seed) {
  cfg.validate();
  RV_CHECK_ARG(fs::is_directory(cfg.model), "model: '", cfg.model, "' is not a directory");
  const std::string cfg_path = (fs::path(cfg.model) / "config.json").string();
  RV_CHECK_ARG(fs::exists(cfg_path), "model: no config.json in '", cfg.model, "'");
  const ModelConfig read = ModelConfig::from_file(cfg_path);
  check_architecture(read, cfg.model);
  DeviceMemory memory;
  if (cfg.device == "cuda" && cfg.gpu_memory_utilization > 0.0f) memory = measure_memory(Device::kCUDA);
  EnginePlan p = plan_engine(cfg, read, memory, int(std::thread::hardware_concurrency()));
  cfg = p.cfg;
  model_cfg = p.model;
  RV_CHECK_ARG(p.world == 1 || p.device == Device::kCPU || has_gpu_communicators(), "tensor_parallel_size ", p.world,
               " on device 'cuda' needs NCCL, which this build did not find (install nvidia-nccl-cu12 or -cu13, or ",
               "set NCCL_ROOT, and rebuild)");
  dev = p.device, weight_dtype = p.weight_dtype, world = p.world, ep = p.expert_parallel, threads = p.threads;
  speculative = p.speculative, mtp = p.mtp;
  ropts = p.runner;
  load_models();
  info.quantization = p.quantization;
  RV_CHECK_ARG(!mtp || model->num_mtp_layers() == model_cfg.num_mtp_layers, "speculative_config: method 'mtp' needs ",
               "the checkpoint's multi-token-prediction layers, and ", cfg.model, " (", model_cfg.architecture,
               ") carries ", model->num_mtp_layers(), " of the ", model_cfg.num_mtp_layers,
               " its config names (no mtp.* tensors); use 'ngram'");
  CachePlan plan = p.caches;
  if (p.by_utilization) plan.shrink_to(cache_budget_after_load(p, measure_memory(dev)));  // what the weights really left
  kv_scales = model->kv_scales();
  if (cfg.calculate_kv_scales) {  // under TP each rank measures its KV heads; a layer takes the largest
    auto calibrate = [&](CausalLM& m) {
      return calibrate_kv_scales(m, p.groups, cfg.calibration_prompts, cfg.block_size, cfg.max_model_len);
    };
    if (!tp) {
      kv_scales = calibrate(*model);
    } else {
      auto ranks = std::vector<std::vector<std::pair<float, float>>>(size_t(world));
      tp->on_models([&](CausalLM& m, int rank) { ranks[size_t(rank)] = calibrate(m); }, *model);
      kv_scales = ranks[0];
      for (const auto& r : ranks)
        for (size_t l = 0; l < r.size(); ++l)
          kv_scales[l] = {std::max(kv_scales[l].first, r[l].first), std::max(kv_scales[l].second, r[l].second)};
    }
  }
  cache_plan = std::make_unique<CachePlan>(plan);
  cache_limits = std::make_unique<CacheLimits>(p.limits);
  if (const int32_t missing = build_serving(); missing > 0)
    info.warnings.push_back(str_cat("kv_cache_dtype ", cfg.kv_cache_dtype, ": ", cfg.model, " carries no k_scale / v_scale for ",
                                    missing, " of its ", caches->kv().quant.size(),
                                    " attention layers; they scale by 1.0 (values past 448 saturate)"));
  async_scheduling = p.async_scheduling;
  if (tp) tp->keep_greedy_ids(async_scheduling);
  live.spec_accepted_per_position.assign(size_t(speculative ? cfg.num_speculative_tokens : 0), 0);
  pool = std::make_unique<ThreadPool>(std::max(1, threads / world));

  info.architecture = model_cfg.architecture;
  info.vocab_size = model_cfg.vocab_size;
  info.max_model_len = cfg.max_model_len;
  info.num_layers = model_cfg.num_layers;
  info.hidden_size = model_cfg.hidden_size;
  info.eos_token_ids = model_cfg.eos_token_ids;
  info.weight_dtype = dtype_name(model->weight_dtype());
  info.weight_bytes = model->weight_bytes() + (tp ? tp->worker_weight_bytes() : 0);  // every rank's
  info.kv_cache_bytes = caches->nbytes() * world;  // every rank holds the same blocks
  info.tensor_parallel_size = world;
  info.device = dev == Device::kCPU ? "cpu" : device_runtime(dev).name();
  info.kv_cache_dtype = dtype_name(plan.kv.dtype);
  info.kv_cache_tokens = plan.num_blocks * cfg.block_size;
  info.cuda_graph_batch_sizes = runner->recorded_batch_sizes();
  info.cuda_graph_bytes = runner->graph_memory_bytes();
  live.num_blocks_total = plan.num_blocks;
  live.num_blocks_free = plan.num_blocks;
  publish_stats();
  thread = std::thread([this] { loop(); });
}

void Engine::Impl::load_models() {
  auto load = [&](Communicator* comm) {
    return load_model(cfg.model, model_cfg, parse_dtype(weight_dtype), dev, cfg.load_format == "dummy",
                      cfg.load_format == "gguf", comm, ep);
  };
  if (world > 1) tp = std::make_unique<TensorParallelRanks>(world, dev, load, threads / world, cfg.block_activation_bits);
  model = load(tp ? tp->rank0() : nullptr);
}

int32_t Engine::Impl::build_serving() {
  caches = std::make_unique<CacheCoordinator>(*cache_plan, *cache_limits, dev);
  const int32_t missing = set_kv_scales(kv_scales, caches->kv());
  tiers = make_kv_tiers(cfg, kv_fingerprint(cfg, model_cfg, weight_dtype, dtype_name(cache_plan->kv.dtype), kv_scales), world,
                        caches->kv(), caches->states());
  caches->manager().set_tiers(tiers.get());
  scheduler = std::make_unique<Scheduler>(
      SchedulerConfig{cfg.max_num_seqs, cfg.max_num_batched_tokens, cfg.max_model_len,
                      parse_scheduling_policy(cfg.scheduling_policy)},
      caches->manager());
  if (tp) tp->make_runners(*cache_plan, *cache_limits, ropts, kv_scales);
  runner = std::make_unique<ModelRunner>(*model, caches->kv(), caches->states(), ropts);
  // Recorded now rather than when a size first comes: no step waits for a recording, and their
  // memory is taken before serving starts (the plan counted it in the activations).
  if (tp) tp->capture_graphs([&] { runner->capture_graphs(); });
  else runner->capture_graphs();
  return missing;
}

void Engine::Impl::change_sleep(int level) {
  if (level > 0 && sleep_level == 0) {
    // Every request waits outside the scheduler, its KV given back: it is recomputed after wake_up.
    move_kv_blocks(true);
    if (tiers) tiers->flush();
    for (auto& r : scheduler->take_all()) {
      r->tier_reads.reset();  // (the tiers go too)
      parked.push_back(std::move(r));
    }
    publish_stats();
    dropped = live;  // the counters of what goes now
    runner.reset();
    scheduler.reset();
    tiers.reset();
    caches.reset();
  }
  if (level > 0 && tp) tp->drop(level == 2);  // (each rank gives its device's cached blocks back)
  if (level == 2) {
    model.reset();  // (before the ranks: rank 0's model holds their communicator)
    tp.reset();
  }
  if (level > 0 && dev != Device::kCPU) device_runtime(dev).release_cached();
#if defined(__GLIBC__)
  if (level > 0) malloc_trim(0);  // the host's freed pages back to the system, not kept by the allocator
#endif
  if (level == 0 && sleep_level > 0) {
    if (!model) load_models();
    build_serving();
    if (tp) tp->keep_greedy_ids(async_scheduling);
    for (auto& r : parked) {
      caches->manager().prefetch(*r);
      scheduler->add(std::move(r));
    }
    parked.clear();
  }
  publish_stats();  // (a caller of sleep / wake_up sees the stats of the new state)
  {
    std::lock_guard<std::mutex> lk(in_mu);
    sleep_level = level;
  }
  sleep_cv.notify_all();
}

void Engine::Impl::publish_stats() {
  live.num_running = scheduler ? scheduler->num_running() : 0;
  live.num_waiting = scheduler ? scheduler->num_waiting() : int64_t(parked.size());
  std::map<int32_t, int64_t> by_priority;
  if (scheduler) {
    for (auto [priority, n] : scheduler->waiting_by_priority()) by_priority[priority] += n;
  } else {
    for (const auto& r : parked) ++by_priority[r->tag.priority];
  }
  const EngineStats& d = dropped;  // counters go on from where the parts that sleep freed left them
  if (caches) {
    const KvCacheManager& m = caches->manager();
    live.num_blocks_free = m.pool().num_free();
    live.num_blocks_used = live.num_blocks_total - live.num_blocks_free;
    live.prefix_cache_queries = d.prefix_cache_queries + m.queries();
    live.prefix_cache_hits = d.prefix_cache_hits + m.hits();
    live.kv_offload_hit_tokens = d.kv_offload_hit_tokens + m.tier_hits();
  } else {
    live.num_blocks_free = live.num_blocks_used = 0;
  }
  if (tiers) {
    const KvTierStats t = tiers->stats();
    live.kv_offload_host_hits = d.kv_offload_host_hits + t.host_hits;
    live.kv_offload_disk_hits = d.kv_offload_disk_hits + t.disk_hits;
    live.kv_offload_bytes_offloaded = d.kv_offload_bytes_offloaded + t.bytes_offloaded;
    live.kv_offload_bytes_restored = d.kv_offload_bytes_restored + t.bytes_restored;
    live.kv_offload_host_bytes = t.host_bytes;
    live.kv_offload_disk_bytes = t.disk.bytes;
    live.kv_offload_disk_bytes_written = d.kv_offload_disk_bytes_written + t.disk.bytes_written;
    live.kv_offload_disk_bytes_read = d.kv_offload_disk_bytes_read + t.disk.bytes_read;
    live.kv_offload_disk_rejected = d.kv_offload_disk_rejected + t.disk.rejected;
    live.kv_offload_disk_write_skips = d.kv_offload_disk_write_skips + t.disk.write_skips;
  } else {
    live.kv_offload_host_bytes = 0;
  }
  if (scheduler) live.num_preemptions = d.num_preemptions + scheduler->num_preemptions();
  if (runner) live.graph_replays = d.graph_replays + runner->graph_replays();
  std::lock_guard<std::mutex> lk(stats_mu);
  stats = live;
  {
    std::lock_guard<std::mutex> in_lk(in_mu);
    stats.num_waiting += int64_t(inbox.size());
    for (const auto& r : inbox) ++by_priority[r->tag.priority];
  }
  stats.waiting_by_priority.assign(by_priority.begin(), by_priority.end());
}

void Engine::Impl::emit(Request& r, bool finished) {
  RequestOutput o;
  o.request_id = r.id;
  o.tokens = std::move(r.pending);
  r.pending.clear();
  o.finished = finished;
  o.finish_reason = r.finish_reason;
  o.stop_token_id = r.stop_token_id;
  o.num_prompt_tokens = r.num_prompt_tokens;
  o.num_cached_tokens = std::max(0, r.num_cached_tokens);
  o.error = r.error;
  // Sent once, with the first output, which comes after the prompt's last chunk.
  if (!r.prompt_logprobs.empty() && r.num_computed_tokens >= r.num_prompt_tokens) o.prompt_logprobs = std::move(r.prompt_logprobs);
  staged.emplace_back(std::move(o), r.callback);
}

void Engine::Impl::deliver() {
  if (staged.empty()) return;
  {
    std::lock_guard<std::mutex> lk(out_mu);
    for (auto& [o, cb] : staged)
      if (!cb) outbox.push_back(std::move(o));
  }
  out_cv.notify_all();
  for (auto& [o, cb] : staged) {
    if (!cb) continue;
    try {
      cb(o);
    } catch (...) {
      // A failing callback must not take the engine down; that output is dropped.
    }
  }
  staged.clear();
}

void Engine::Impl::finish(Request& r, FinishReason reason, int32_t stop_token) {
  r.finish_reason = reason;
  r.stop_token_id = stop_token;
  auto owned = scheduler->remove(r.id);  // frees its blocks
  ++live.requests_finished;
  emit(*owned, true);
}

void Engine::Impl::run_step(bool may_run_ahead) {
  step_ids.clear();
  try {
    step(may_run_ahead);
  } catch (const DeviceError&) {
    throw;  // the device's state is unknown: fatal for every request
  } catch (const std::exception& e) {
    fail_step(e.what());
  }
}

void Engine::Impl::fail_step(const std::string& what) {
  if (ahead)
    for (const Request* r : ahead->samplers)
      if (r) step_ids.push_back(r->id);
  ahead.reset();
  for (uint64_t id : step_ids) {
    auto r = scheduler->remove(id);  // frees its blocks and state slot
    if (!r) continue;                // finished within the step before it failed
    r->finish_reason = FinishReason::kError;
    r->error = "engine step failed: " + what;
    ++live.requests_finished;
    emit(*r, true);
  }
  step_ids.clear();
}

void Engine::Impl::loop() {
  ops::set_cpu_thread_pool(pool.get());
  ops::set_cpu_block_activation_bits(cfg.block_activation_bits);
  try {
    for (;;) {
      std::deque<std::unique_ptr<Request>> fresh;
      std::vector<uint64_t> aborts;
      int level = 0;
      {
        std::unique_lock<std::mutex> lk(in_mu);
        enter(sleep_level ? "asleep" : "idle");
        in_cv.wait(lk, [&] {
          return stopping || !inbox.empty() || !abort_box.empty() || reset_prefix.load() || sleep_wanted != sleep_level ||
                 (!paused && scheduler && (scheduler->has_work() || ahead));
        });
        if (stopping) break;
        fresh.swap(inbox);
        aborts.swap(abort_box);
        level = sleep_wanted;
      }
      // A queued step holds its requests: read its tokens before anything joins or leaves.
      if (ahead && (!fresh.empty() || !aborts.empty() || level > 0)) run_step(false);
      if (level != sleep_level) {
        enter(level ? "going to sleep" : "waking up");
        change_sleep(level);
      }
      if (reset_prefix.exchange(false) && caches) caches->manager().pool().drop_unused_cache();
      for (auto& r : fresh) {
        if (!scheduler) {  // asleep: held until wake_up
          parked.push_back(std::move(r));
          continue;
        }
        caches->manager().prefetch(*r);  // its prefix's disk reads start now, off this thread
        scheduler->add(std::move(r));
      }
      for (uint64_t id : aborts) {
        std::unique_ptr<Request> r;
        if (scheduler) {
          r = scheduler->remove(id);
        } else if (auto it = std::find_if(parked.begin(), parked.end(), [&](const auto& p) { return p->id == id; });
                   it != parked.end()) {
          r = std::move(*it);
          parked.erase(it);
        }
        if (r) {
          r->finish_reason = FinishReason::kAbort;
          ++live.requests_finished;
          emit(*r, true);
        }
      }
      bool run = false;
      {
        std::lock_guard<std::mutex> lk(in_mu);
        run = scheduler && (!paused || ahead);  // (a queued step is finished even when pausing)
      }
      if (run && (scheduler->has_work() || ahead)) {
        const int64_t steps = live.num_steps;
        run_step(true);
        // Nothing ran: the requests left wait for their prefix's disk reads.
        if (live.num_steps == steps && !ahead && tiers) tiers->wait_for_reads(2);
      }
      if (scheduler && !scheduler->has_work() && !ahead) move_kv_blocks(true);  // idle: the last step's blocks written through
      publish_stats();
      deliver();
    }
  } catch (const std::exception& e) {
    std::lock_guard<std::mutex> lk(out_mu);
    fatal_error = e.what();
  }
  // Shutdown or fatal error: every live request ends now, so no caller waits forever.
  ahead.reset();  // its device work lands in buffers no one reads
  if (tiers && fatal_error.empty()) {  // what was computed stays on disk for the next start
    try {
      move_kv_blocks(true);
      tiers->flush();
    } catch (const std::exception&) {
    }
  }
  const bool fatal = !fatal_error.empty();
  std::deque<std::unique_ptr<Request>> fresh;
  {
    std::lock_guard<std::mutex> lk(in_mu);
    stopping = true;
    fresh.swap(inbox);
  }
  for (auto& r : fresh) parked.push_back(std::move(r));
  if (scheduler)
    for (uint64_t id : scheduler->all_ids()) parked.push_back(scheduler->remove(id));
  for (auto& r : parked) {
    r->finish_reason = fatal ? FinishReason::kError : FinishReason::kAbort;
    if (fatal) r->error = fatal_error;
    emit(*r, true);
  }
  parked.clear();
  publish_stats();
  deliver();
  out_cv.notify_all();
  sleep_cv.notify_all();
}

Engine::Engine(const EngineConfig& config) : impl_(std::make_unique<Impl>(config)) {}

Engine::~Engine() { shutdown(); }

namespace {

void validate_prompt(const std::vector<int32_t>& prompt, const SamplingParams& params, const ModelInfo& info) {
  params.validate();
  RV_CHECK_ARG(!prompt.empty(), "prompt must contain at least one token");
  // Prompt and output together fit in max_model_len, and the output has at least one token.
  RV_CHECK_ARG(int64_t(prompt.size()) < info.max_model_len, "prompt has ", prompt.size(), " tokens; max_model_len (",
               info.max_model_len, ") leaves room for at most ", info.max_model_len - 1, " prompt tokens");
  for (int32_t t : prompt)
    RV_CHECK_ARG(t >= 0 && t < info.vocab_size, "prompt token id ", t, " is outside the vocabulary [0, ",
                 info.vocab_size, ")");
}

}  // namespace

std::unique_ptr<GrammarMatcher> Engine::Impl::make_grammar(const SamplingParams& p) {
  if (p.guided_kind.empty()) return nullptr;
  std::lock_guard<std::mutex> lk(grammar_mu);
  if (!grammar_tokenizer) {
    RV_CHECK_ARG(!cfg.guided_decoding_library.empty(), "guided_decoding: this engine has no grammar library ",
                 "(install llguidance; revolta.LLM and the server find it)");
    RV_CHECK_ARG(!model_cfg.eos_token_ids.empty(), "guided_decoding: the model names no EOS token");
    grammar_tokenizer = std::make_unique<GrammarTokenizer>(
        cfg.guided_decoding_library, cfg.tokenizer_json.empty() ? cfg.model + "/tokenizer.json" : cfg.tokenizer_json,
        model_cfg.eos_token_ids.front());
  }
  return std::make_unique<GrammarMatcher>(*grammar_tokenizer, p.guided_kind, p.guided_data);
}

uint64_t Engine::add_request(std::vector<int32_t> prompt, const SamplingParams& params,
                             OutputCallback callback, const SchedulingTag& tag) {
  validate_prompt(prompt, params, impl_->info);
  auto r = std::make_unique<Request>();
  r->id = impl_->next_id.fetch_add(1);
  r->num_prompt_tokens = int32_t(prompt.size());
  r->tokens = std::move(prompt);
  r->params = params;
  r->tag = tag;
  r->grammar = impl_->make_grammar(params);
  r->callback = std::move(callback);
  const uint64_t id = r->id;
  {
    std::lock_guard<std::mutex> lk(impl_->in_mu);
    RV_CHECK(!impl_->stopping, "the engine is shut down");
    r->rng = Rng(params.seed ? *params.seed : impl_->seed_source.next());
    impl_->inbox.push_back(std::move(r));
  }
  impl_->in_cv.notify_one();
  return id;
}

std::vector<uint64_t> Engine::add_requests(const std::vector<std::vector<int32_t>>& prompts,
                                           const std::vector<SamplingParams>& params,
                                           const std::vector<SchedulingTag>& tags) {
  RV_CHECK_ARG(prompts.size() == params.size(), "add_requests: ", prompts.size(), " prompts but ",
               params.size(), " sampling params");
  RV_CHECK_ARG(tags.empty() || tags.size() == prompts.size(), "add_requests: ", prompts.size(), " prompts but ",
               tags.size(), " scheduling tags");
  for (size_t i = 0; i < prompts.size(); ++i) validate_prompt(prompts[i], params[i], impl_->info);
  std::vector<std::unique_ptr<Request>> batch;
  std::vector<uint64_t> ids;
  for (size_t i = 0; i < prompts.size(); ++i) {
    auto r = std::make_unique<Request>();
    r->id = impl_->next_id.fetch_add(1);
    r->num_prompt_tokens = int32_t(prompts[i].size());
    r->tokens = prompts[i];
    r->params = params[i];
    if (!tags.empty()) r->tag = tags[i];
    r->grammar = impl_->make_grammar(params[i]);
    ids.push_back(r->id);
    batch.push_back(std::move(r));
  }
  {
    std::lock_guard<std::mutex> lk(impl_->in_mu);
    RV_CHECK(!impl_->stopping, "the engine is shut down");
    for (auto& r : batch) {
      r->rng = Rng(r->params.seed ? *r->params.seed : impl_->seed_source.next());
      impl_->inbox.push_back(std::move(r));
    }
  }
  impl_->in_cv.notify_one();
  return ids;
}

void Engine::abort(uint64_t id) {
  {
    std::lock_guard<std::mutex> lk(impl_->in_mu);
    impl_->abort_box.push_back(id);
  }
  impl_->in_cv.notify_one();
}

std::vector<RequestOutput> Engine::await_outputs(std::chrono::milliseconds timeout) {
  std::unique_lock<std::mutex> lk(impl_->out_mu);
  impl_->out_cv.wait_for(lk, timeout, [&] {
    return !impl_->outbox.empty() || !impl_->fatal_error.empty();
  });
  std::vector<RequestOutput> out;
  out.swap(impl_->outbox);
  if (out.empty() && !impl_->fatal_error.empty())
    throw std::runtime_error("engine stopped by a fatal error: " + impl_->fatal_error);
  return out;
}

EngineStats Engine::stats() const {
  std::lock_guard<std::mutex> lk(impl_->stats_mu);
  return impl_->stats;
}

const ModelInfo& Engine::model_info() const { return impl_->info; }
const EngineConfig& Engine::config() const { return impl_->cfg; }

std::string Engine::activity() const {
  return str_cat("step ", impl_->phase_step.load(), ": ", impl_->phase.load(std::memory_order_acquire), " (",
                 impl_->phase_requests.load(), " requests)");
}

void Engine::reset_prefix_cache() {
  impl_->reset_prefix = true;
  impl_->in_cv.notify_all();
}

void Engine::set_paused(bool paused) {
  {
    std::lock_guard<std::mutex> lk(impl_->in_mu);
    impl_->paused = paused;
  }
  impl_->in_cv.notify_all();
}

void Engine::sleep(int level) {
  RV_CHECK_ARG(level == 1 || level == 2, "sleep level must be 1 (the KV cache) or 2 (the weights too), got ", level);
  change_sleep_level(level);
}

void Engine::wake_up() { change_sleep_level(0); }

void Engine::change_sleep_level(int level) {
  std::unique_lock<std::mutex> lk(impl_->in_mu);
  // (a deeper sleep stays: waking is what brings memory back)
  impl_->sleep_wanted = level == 0 ? 0 : std::max(level, impl_->sleep_wanted);
  const int want = impl_->sleep_wanted;
  impl_->in_cv.notify_all();
  impl_->sleep_cv.wait(lk, [&] { return impl_->stopping || impl_->sleep_level == want || impl_->sleep_wanted != want; });
  if (impl_->stopping) {
    lk.unlock();
    std::lock_guard<std::mutex> out(impl_->out_mu);
    RV_CHECK(impl_->fatal_error.empty(), "the engine failed: ", impl_->fatal_error);
    RV_CHECK(false, "the engine is shut down");
  }
}

int Engine::sleep_level() const {
  std::lock_guard<std::mutex> lk(impl_->in_mu);
  return impl_->sleep_level;
}

bool Engine::paused() const {
  std::lock_guard<std::mutex> lk(impl_->in_mu);
  return impl_->paused;
}

void Engine::shutdown() {
  if (!impl_) return;
  {
    std::lock_guard<std::mutex> lk(impl_->in_mu);
    impl_->stopping = true;
  }
  impl_->in_cv.notify_all();
  if (impl_->thread.joinable()) impl_->thread.join();
}

}  // namespace revolta
