// One scheduler step of the engine thread: the forward, the bookkeeping after it, sampling (on
// the host, on the device, or greedy ids read a step later under async scheduling) and the
// tokens' effects on the requests (stops, lengths, outputs).
#include <algorithm>
#include <cmath>
#include <numeric>

#include "core/error.h"
#include "engine/engine_impl.h"
#include "ops/ops.h"
#include "sample/sampler.h"

namespace revolta {

void Engine::Impl::commit(const std::vector<ScheduledRequest>& scheduled) {
  for (const auto& s : scheduled) commit_one(*s.request, s.num_new_tokens);
}

void Engine::Impl::commit_one(Request& r, int32_t num_new_tokens) {
  const int32_t before = r.num_computed_tokens;
  r.num_computed_tokens += num_new_tokens;
  live.prompt_tokens_computed += std::max(0, std::min(r.num_computed_tokens, r.num_prompt_tokens) - before);
  const StateAction snapshot = serving->caches->commit(r);
  if (tp && snapshot.to >= 0) rank_snapshots.push_back(snapshot);
}

bool Engine::Impl::accept(Request& r, TokenOutput tok) {
  const int32_t t = tok.token;
  if (r.last_token_on_device) r.tokens.back() = t;  // the placeholder a queued step was fed for
  else r.tokens.push_back(t);
  r.last_token_on_device = false;
  const bool off_grammar = r.grammar && !r.grammar->consume(t);  // (drawn from its mask: not expected)
  r.pending.push_back(std::move(tok));
  ++live.generation_tokens;

  const auto& stops = r.params.stop_token_ids;
  const auto& eos = model_cfg.eos_token_ids;
  if (std::find(stops.begin(), stops.end(), t) != stops.end() ||
      (!r.params.ignore_eos && std::find(eos.begin(), eos.end(), t) != eos.end())) {
    finish(r, FinishReason::kStop, t);
    return true;
  }
  if (off_grammar || r.num_output_tokens() >= r.params.max_tokens || r.num_tokens() >= cfg.max_model_len) {
    finish(r, FinishReason::kLength);
    return true;
  }
  emit(r, false);
  return false;
}

Engine::Impl::Queued Engine::Impl::queue_greedy(const std::vector<ScheduledRequest>& scheduled, StepLogits& result) {
  Queued q;
  q.scheduled = scheduled;
  q.samplers = result.samplers;
  const int64_t n = int64_t(q.samplers.size());
  const Device dev = result.logits.device();
  q.ids = Tensor::uninitialized({n}, DType::kI32, dev);
  ops::argmax(result.logits, q.ids);
  q.host.resize(size_t(n));
  if (dev == Device::kCPU) std::copy(q.ids.ptr<int32_t>(), q.ids.ptr<int32_t>() + n, q.host.begin());
  else q.copy = device_runtime(dev).copy_to_host_later(q.host.data(), q.ids.data(), size_t(n) * 4);
  return q;
}

const std::vector<int32_t>& Engine::Impl::Queued::tokens() {
  if (copy) copy->wait();
  copy.reset();
  return host;
}

void Engine::Impl::Queued::drop(Request* r) {
  std::replace(samplers.begin(), samplers.end(), r, static_cast<Request*>(nullptr));
  scheduled.erase(std::remove_if(scheduled.begin(), scheduled.end(), [&](const ScheduledRequest& s) { return s.request == r; }),
                  scheduled.end());
}

bool Engine::Impl::can_run_ahead(const Queued& cur) {
  if (!async_scheduling || serving->scheduler->num_waiting() > 0) return false;
  {
    std::lock_guard<std::mutex> lk(in_mu);  // new requests or aborts: settle the queued step first
    if (stopping || !inbox.empty() || !abort_box.empty()) return false;
  }
  // Exactly the running requests, in the order the next step schedules them, so row i of cur's ids
  // is the input of the next step's request i.
  if (serving->scheduler->running() != cur.samplers) return false;
  const BlockPool& pool = serving->caches->manager().pool();
  const int32_t bs = pool.block_size();
  int32_t new_blocks = 0;
  for (const Request* r : cur.samplers) {
    // It goes on unless its token turns out to be a stop token (that step is then discarded).
    if (r->num_output_tokens() + 1 >= r->params.max_tokens || r->num_tokens() + 1 >= cfg.max_model_len) return false;
    new_blocks += (r->num_computed_tokens + 1 + bs - 1) / bs > int32_t(r->block_table.size());
  }
  return new_blocks <= pool.num_free();  // no preemption can happen
}

Engine::Impl::Queued Engine::Impl::run_ahead(const Queued& cur) {
  for (Request* r : cur.samplers) {
    r->tokens.push_back(0);  // a placeholder until cur's tokens are read
    r->last_token_on_device = true;
  }
  SchedulerOutput plan = serving->scheduler->schedule();
  phase_step = live.num_steps + 1;
  enter("forward (queued ahead)", int32_t(plan.scheduled.size()));
  begin_step(plan.scheduled);
  bool same = plan.scheduled.size() == cur.samplers.size();
  for (size_t i = 0; same && i < plan.scheduled.size(); ++i)
    same = plan.scheduled[i].request == cur.samplers[i] && plan.scheduled[i].num_new_tokens == 1;
  RV_CHECK(same, "async scheduling: the step queued ahead is not one decode token of each running request");
  StepLogits result = forward(plan, &cur.ids);
  ++live.num_steps;
  ++live.steps_run_ahead;
  return queue_greedy(plan.scheduled, result);
}

void Engine::Impl::begin_step(const std::vector<ScheduledRequest>& scheduled) {
  for (const ScheduledRequest& s : scheduled) step_ids.push_back(s.request->id);
  fault.check(scheduled);
}

void Engine::Impl::move_kv_blocks(bool settle) {
  if (!serving->tiers) return;
  settle_kv_saves();  // the last batch's downloads were queued before the forward since: long done
  if (serving->caches->manager().has_transfers()) {
    std::vector<BlockTransfer> t = serving->caches->manager().take_transfers();
    if (!tp) {
      kv_saves.pending.push_back(run_transfers(t, serving->caches->kv(), serving->caches->states(), 0));
    } else {  // the other ranks first repeat rank 0's snapshots, which state saves read
      kv_saves.pending = tp->run_transfers(t, rank_snapshots, [&] { return run_transfers(t, serving->caches->kv(), serving->caches->states(), 0); });
      rank_snapshots.clear();
    }
    std::vector<BlockTransfer> loads;
    for (BlockTransfer& x : t) (is_save(x) ? kv_saves.transfers : loads).push_back(std::move(x));
    serving->tiers->finish(loads);
  }
  if (settle) settle_kv_saves();
}

void Engine::Impl::settle_kv_saves() {
  for (auto& p : kv_saves.pending)
    if (p) p->wait();
  kv_saves.pending.clear();
  serving->tiers->finish(kv_saves.transfers);
  kv_saves.transfers.clear();
}

StepLogits Engine::Impl::forward(const SchedulerOutput& plan, const Tensor* fed_ids) {
  if (serving->tiers) {  // blocks brought back before the forward reads them
    const char* was = phase.load();
    enter("kv offload copies", phase_requests.load());
    move_kv_blocks();
    enter(was, phase_requests.load());
  }
  const std::vector<StateAction> actions = serving->caches->prepare(plan.scheduled);
  StepLogits result;
  if (!tp) {
    result = serving->runner->execute(plan, actions, fed_ids);
  } else {
    // The other ranks take the state snapshots rank 0 made after the last step, then this step's actions.
    std::vector<StateAction> rank_actions = std::move(rank_snapshots);
    rank_snapshots.clear();
    rank_actions.insert(rank_actions.end(), actions.begin(), actions.end());
    // Fed ids: each rank feeds the greedy ids of its own last logits (the same tokens).
    result = tp->execute(plan, rank_actions, [&] { return serving->runner->execute(plan, actions, fed_ids); }, fed_ids != nullptr);
  }
  if (!result.prompt.empty()) collect_prompt_logprobs(result);
  return result;
}

void Engine::Impl::collect_prompt_logprobs(const StepLogits& result) {
  const Tensor host = result.prompt_logits.device() == Device::kCPU ? result.prompt_logits
                                                                     : result.prompt_logits.to(Device::kCPU);
  const int64_t V = host.size(1);
  std::vector<int32_t> order(static_cast<size_t>(V));
  int64_t row = 0;
  for (const StepLogits::PromptRows& pr : result.prompt) {
    Request& r = *pr.request;
    const int32_t k = std::min<int32_t>(r.params.prompt_logprobs, ops::kMaxTopLogprobs);
    r.prompt_logprobs.resize(size_t(pr.first_position));  // (a preempted request computes its prompt again)
    for (int32_t i = 0; i < pr.count; ++i, ++row) {
      const float* x = host.ptr<float>() + row * V;
      const float top = *std::max_element(x, x + V);
      double sum = 0.0;
      for (int64_t v = 0; v < V; ++v) sum += std::exp(double(x[v] - top));
      const float lse = top + float(std::log(sum));
      TokenOutput t;
      t.token = r.tokens[size_t(pr.first_position + i + 1)];
      t.logprob = x[t.token] - lse;
      if (k > 0) {
        std::iota(order.begin(), order.end(), 0);
        std::partial_sort(order.begin(), order.begin() + k, order.end(),
                          [&](int32_t a, int32_t b) { return x[a] > x[b] || (x[a] == x[b] && a < b); });
        for (int32_t j = 0; j < k; ++j) t.top_logprobs.push_back({order[size_t(j)], x[order[size_t(j)]] - lse});
      }
      r.prompt_logprobs.push_back(std::move(t));
    }
  }
}

void Engine::Impl::step(bool may_run_ahead) {
  std::optional<Queued> cur = std::move(ahead);
  ahead.reset();
  if (cur) {
    for (const ScheduledRequest& s : cur->scheduled) step_ids.push_back(s.request->id);
  } else if (speculative) {
    speculative_step();
    return;
  } else {
    phase_step = live.num_steps + 1;
    enter("scheduling");
    SchedulerOutput plan = serving->scheduler->schedule();
    if (plan.empty()) return;
    enter("forward", int32_t(plan.scheduled.size()));
    begin_step(plan.scheduled);
    // Constrained rows that sample in this step: their masks are computed while the forward runs.
    MaskJobs masks;
    std::vector<GrammarMatcher*> guided;
    for (const ScheduledRequest& s : plan.scheduled)
      if (s.request->grammar && s.request->num_computed_tokens + s.num_new_tokens >= s.request->num_tokens())
        guided.push_back(s.request->grammar.get());
    masks.start(std::move(guided));
    StepLogits result = forward(plan);
    ++live.num_steps;
    commit(plan.scheduled);
    const bool queueable = !result.samplers.empty() &&
                           (result.logits.device() != Device::kCPU || async_scheduling) &&
                           std::all_of(result.samplers.begin(), result.samplers.end(), plain_greedy);
    if (!queueable) {
      enter("sampling", int32_t(result.samplers.size()));
      masks.wait();
      sample_now(result);
      return;
    }
    cur = queue_greedy(plan.scheduled, result);
  }
  // The next step goes in before this one's tokens are read; requests that stop on them drop out
  // of it (their rows are discarded) before its bookkeeping, which wants the real tokens.
  std::optional<Queued> next;
  if (may_run_ahead && can_run_ahead(*cur)) next = run_ahead(*cur);
  const std::vector<int32_t>& ids = cur->tokens();
  for (size_t i = 0; i < cur->samplers.size(); ++i) {
    Request* r = cur->samplers[i];
    if (!r) continue;
    TokenOutput tok;
    tok.token = ids[i];
    if (accept(*r, std::move(tok)) && next) next->drop(r);
  }
  if (!next) return;
  commit(next->scheduled);
  if (std::any_of(next->samplers.begin(), next->samplers.end(), [](const Request* r) { return r != nullptr; }))
    ahead = std::move(next);
}

// Sampling of a step whose rows are not all plain greedy on a device (or any step on the CPU
// without async scheduling): one semantics on every device (sample/sampler.h).
void Engine::Impl::sample_now(StepLogits& result) {
  std::vector<SamplingContext> rows;
  rows.reserve(result.samplers.size());
  for (Request* r : result.samplers)
    rows.push_back({&r->params, &r->tokens, r->num_prompt_tokens, &model_cfg.eos_token_ids, &r->rng,
                    SamplingContext::kAllTokens, r->grammar.get()});
  std::vector<TokenOutput> sampled = sample_rows(result.logits, rows);
  for (size_t i = 0; i < result.samplers.size(); ++i) accept(*result.samplers[i], std::move(sampled[i]));
}

}  // namespace revolta
