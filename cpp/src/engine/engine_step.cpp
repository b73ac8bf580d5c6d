// One scheduler step of the engine thread: schedule, forward (engine_forward.cpp), sample (on the
// host, on the device, or greedy ids read a step later under async scheduling) and hand the tokens
// to the requests (engine_requests.cpp); with speculation the step is engine_spec.cpp's.
#include <algorithm>
#include <cmath>
#include <numeric>

#include "core/error.h"
#include "engine/engine_impl.h"
#include "ops/ops.h"
#include "sample/sampler.h"

namespace revolta {

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

void Engine::Impl::step(bool may_run_ahead) {
  finish_pooled();
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
