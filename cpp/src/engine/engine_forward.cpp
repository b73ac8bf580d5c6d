// The forward of a step and what surrounds it: the step's requests noted (for failures and fault
// injection), KV copies to and from the offload tiers, every rank's forward, prompt logprobs.
#include <algorithm>
#include <cmath>
#include <numeric>

#include "core/error.h"
#include "engine/engine_impl.h"
#include "ops/ops.h"

namespace revolta {

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
  encode_media(plan);
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
  if (!result.pooled.empty()) collect_pooled(result);
  return result;
}

void Engine::Impl::collect_pooled(const StepLogits& result) {
  const Tensor host = result.hidden.device() == Device::kCPU ? result.hidden : result.hidden.to(Device::kCPU);
  const int64_t H = host.size(1);
  for (const StepLogits::PooledRows& pr : result.pooled) {
    Request& r = *pr.request;
    const bool mean = r.params.pooling == "mean";
    if (pr.first_position == 0 || r.pooled.empty()) r.pooled.assign(size_t(H), 0.0);  // (recomputed after preemption)
    for (int32_t i = mean ? 0 : pr.count - 1; i < pr.count; ++i) {
      const float* x = host.ptr<float>() + int64_t(pr.row + i) * H;
      for (int64_t h = 0; h < H; ++h) r.pooled[size_t(h)] = mean ? r.pooled[size_t(h)] + x[h] : x[h];
    }
    if (pr.first_position + pr.count == r.num_prompt_tokens) pooled_done.push_back(r.id);
  }
}

void Engine::Impl::finish_pooled() {
  if (pooled_done.empty()) return;
  for (Request* r : serving->scheduler->running()) {
    if (std::find(pooled_done.begin(), pooled_done.end(), r->id) == pooled_done.end()) continue;
    if (r->params.pooling == "mean")
      for (double& x : r->pooled) x /= double(r->num_prompt_tokens);
    finish(*r, FinishReason::kStop);
  }
  pooled_done.clear();
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

}  // namespace revolta
