// The Engine: one thread owns the model and the serving parts. Callers talk to it only through
// the inbox (new requests, aborts) and the outbox (outputs); neither lock is held while the model
// computes. Construction and sleep are in engine_build.cpp, a step's work in engine_step.cpp.
#include "revolta/engine.h"

#include <algorithm>
#include <limits>

#include "core/error.h"
#include "engine/engine_impl.h"

namespace revolta {

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
    auto r = serving->scheduler->remove(id);  // frees its blocks and state slot
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
                 (!paused && serving && (serving->scheduler->has_work() || ahead));
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
      if (reset_prefix.exchange(false) && serving) serving->caches->manager().pool().drop_unused_cache();
      for (auto& r : fresh) {
        if (!serving) {  // asleep: held until wake_up
          parked.push_back(std::move(r));
          continue;
        }
        serving->caches->manager().prefetch(*r);  // its prefix's disk reads start now, off this thread
        serving->scheduler->add(std::move(r));
      }
      for (uint64_t id : aborts) {
        std::unique_ptr<Request> r;
        if (serving) {
          r = serving->scheduler->remove(id);
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
        run = serving && (!paused || ahead);  // (a queued step is finished even when pausing)
      }
      if (run && (serving->scheduler->has_work() || ahead)) {
        const int64_t steps = live.num_steps;
        run_step(true);
        // Nothing ran: the requests left wait for their prefix's disk reads.
        if (live.num_steps == steps && !ahead && serving->tiers) serving->tiers->wait_for_reads(2);
      }
      if (serving && !serving->scheduler->has_work() && !ahead) move_kv_blocks(true);  // idle: the last step's blocks written through
      publish_stats();
      deliver();
    }
  } catch (const std::exception& e) {
    std::lock_guard<std::mutex> lk(out_mu);
    fatal_error = e.what();
  }
  // Shutdown or fatal error: every live request ends now, so no caller waits forever.
  ahead.reset();  // its device work lands in buffers no one reads
  if (serving && serving->tiers && fatal_error.empty()) {  // what was computed stays on disk for the next start
    try {
      move_kv_blocks(true);
      serving->tiers->flush();
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
  if (serving)
    for (uint64_t id : serving->scheduler->all_ids()) parked.push_back(serving->scheduler->remove(id));
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

void Engine::Impl::refuse_stopped() {
  std::lock_guard<std::mutex> out(out_mu);
  RV_CHECK(fatal_error.empty(), "the engine failed: ", fatal_error);
  RV_CHECK(false, "the engine is shut down");
  std::abort();  // (not reached)
}

Engine::Engine(const EngineConfig& config) : impl_(std::make_unique<Impl>(config)) {
  impl_->thread = std::thread([impl = impl_.get()] { impl->loop(); });  // (built: now it serves)
}

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
  for (const auto& [t, bias] : params.logit_bias)
    RV_CHECK_ARG(t < info.vocab_size, "logit_bias: token id ", t, " is outside the vocabulary [0, ", info.vocab_size, ")");
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
  auto g = std::make_unique<GrammarMatcher>(*grammar_tokenizer, p.guided_kind, p.guided_data);
  g->reason_first(p.reasoning_start_token, p.reasoning_end_token, p.reasoning_answer_token, p.in_reasoning);
  return g;
}

void Engine::Impl::attach_media(Request& r, std::vector<MediaInput> media) const {
  if (media.empty()) return;
  RV_CHECK_ARG(vision != nullptr, "multimodal input: ", model_cfg.architecture, " at ", cfg.model,
               " takes text only here (no vision tower this engine runs)");
  r.media = make_media_prompt(std::move(media), r.tokens, model_cfg.vision);
  r.encoded.resize(r.media->spans.size());
}

uint64_t Engine::add_request(std::vector<int32_t> prompt, const SamplingParams& params,
                             OutputCallback callback, const SchedulingTag& tag, std::vector<MediaInput> media) {
  validate_prompt(prompt, params, impl_->info);
  auto r = std::make_unique<Request>();
  r->id = impl_->next_id.fetch_add(1);
  r->num_prompt_tokens = int32_t(prompt.size());
  r->tokens = std::move(prompt);
  r->params = params;
  r->tag = tag;
  impl_->attach_media(*r, std::move(media));
  r->grammar = impl_->make_grammar(params);
  r->callback = std::move(callback);
  const uint64_t id = r->id;
  {
    std::lock_guard<std::mutex> lk(impl_->in_mu);
    if (!impl_->stopping) {
      r->rng = Rng(params.seed ? *params.seed : impl_->seed_source.next());
      impl_->inbox.push_back(std::move(r));
    }
  }
  if (r) impl_->refuse_stopped();
  impl_->in_cv.notify_one();
  return id;
}

std::vector<uint64_t> Engine::add_requests(const std::vector<std::vector<int32_t>>& prompts,
                                           const std::vector<SamplingParams>& params,
                                           const std::vector<SchedulingTag>& tags,
                                           const std::vector<std::vector<MediaInput>>& media) {
  RV_CHECK_ARG(prompts.size() == params.size(), "add_requests: ", prompts.size(), " prompts but ",
               params.size(), " sampling params");
  RV_CHECK_ARG(tags.empty() || tags.size() == prompts.size(), "add_requests: ", prompts.size(), " prompts but ",
               tags.size(), " scheduling tags");
  RV_CHECK_ARG(media.empty() || media.size() == prompts.size(), "add_requests: ", prompts.size(), " prompts but ",
               media.size(), " media lists");
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
    if (!media.empty()) impl_->attach_media(*r, media[i]);
    r->grammar = impl_->make_grammar(params[i]);
    ids.push_back(r->id);
    batch.push_back(std::move(r));
  }
  {
    std::lock_guard<std::mutex> lk(impl_->in_mu);
    if (!impl_->stopping)
      for (auto& r : batch) {
        r->rng = Rng(r->params.seed ? *r->params.seed : impl_->seed_source.next());
        impl_->inbox.push_back(std::move(r));
      }
  }
  if (!batch.empty() && batch.front()) impl_->refuse_stopped();
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
