#include "sched/scheduler.h"

#include <algorithm>

namespace revolta {

Scheduler::Scheduler(const SchedulerConfig& config, KvCacheManager& cache)
    : cfg_(config), cache_(cache) {}

void Scheduler::add(std::unique_ptr<Request> r) {
  r->status = RequestStatus::kWaiting;
  waiting_.push_back(std::move(r));
}

void Scheduler::release_for_recompute(Request& r) {
  r.drop_drafts();
  cache_.free(r);
  r.num_computed_tokens = 0;
  r.status = RequestStatus::kWaiting;
}

void Scheduler::preempt(Request* r) {
  release_for_recompute(*r);
  ++preemptions_;
  auto it = std::find_if(running_.begin(), running_.end(),
                         [&](const auto& p) { return p.get() == r; });
  waiting_.push_front(std::move(*it));
  running_.erase(it);
}

SchedulerOutput Scheduler::schedule() {
  SchedulerOutput out;
  int32_t budget = cfg_.max_num_batched_tokens;
  bool preempted = false;

  for (size_t i = 0; i < running_.size() && budget > 0;) {
    Request* r = running_[i].get();
    int32_t n = cache_.chunk_limit(*r, std::min(r->num_tokens() - r->num_computed_tokens, budget));
    if (r->num_draft_tokens > 0 && n < r->num_tokens() - r->num_computed_tokens) {  // drafts go whole or not at all
      r->drop_drafts();
      n = cache_.chunk_limit(*r, std::min(r->num_tokens() - r->num_computed_tokens, budget));
    }
    if (n <= 0) {
      ++i;
      continue;
    }
    bool scheduled = true;
    while (!cache_.allocate_slots(*r, n)) {
      Request* victim = running_.back().get();
      // A victim scheduled earlier in this step gives its tokens back.
      auto it = std::find_if(out.scheduled.begin(), out.scheduled.end(),
                             [&](const ScheduledRequest& s) { return s.request == victim; });
      if (it != out.scheduled.end()) {
        budget += it->num_new_tokens;
        out.num_batched_tokens -= it->num_new_tokens;
        out.scheduled.erase(it);
      }
      preempt(victim);
      preempted = true;
      if (victim == r) {
        scheduled = false;
        break;
      }
    }
    if (!scheduled) continue;  // r left running_; index i now names the next request
    out.scheduled.push_back({r, n});
    out.num_batched_tokens += n;
    budget -= n;
    ++i;
  }

  // Waiting requests in arrival order; one whose prefix is still being read from the KV offload
  // disk tier is passed over until its reads land.
  for (auto it = waiting_.begin(); !preempted && budget > 0 && it != waiting_.end() &&
                                   int32_t(running_.size()) < cfg_.max_num_seqs;) {
    Request* r = it->get();
    if (r->num_computed_tokens == 0 && cache_.kv_loading(*r)) {
      ++it;
      continue;
    }
    if (r->num_computed_tokens == 0) {
      int32_t hit = cache_.match_prefix(*r);
      if (r->num_cached_tokens < 0) r->num_cached_tokens = std::min(hit, r->num_prompt_tokens);
    }
    int32_t n = cache_.chunk_limit(*r, std::min(r->num_tokens() - r->num_computed_tokens, budget));
    if (!cache_.allocate_slots(*r, n)) {
      cache_.free(*r);  // give back the prefix blocks it took; they stay cached
      r->num_computed_tokens = 0;
      break;
    }
    r->status = RequestStatus::kRunning;
    running_.push_back(std::move(*it));
    it = waiting_.erase(it);
    out.scheduled.push_back({r, n});
    out.num_batched_tokens += n;
    budget -= n;
  }
  return out;
}

std::unique_ptr<Request> Scheduler::remove(uint64_t id) {
  std::unique_ptr<Request> r;
  auto rit = std::find_if(running_.begin(), running_.end(), [&](const auto& p) { return p->id == id; });
  if (rit != running_.end()) {
    r = std::move(*rit);
    running_.erase(rit);
  } else {
    auto wit = std::find_if(waiting_.begin(), waiting_.end(), [&](const auto& p) { return p->id == id; });
    if (wit == waiting_.end()) return nullptr;
    r = std::move(*wit);
    waiting_.erase(wit);
  }
  cache_.free(*r);
  r->status = RequestStatus::kFinished;
  return r;
}

std::vector<Request*> Scheduler::running() const {
  std::vector<Request*> out;
  for (const auto& r : running_) out.push_back(r.get());
  return out;
}

std::vector<std::unique_ptr<Request>> Scheduler::take_all() {
  std::vector<std::unique_ptr<Request>> all;
  for (auto& r : running_) all.push_back(std::move(r));
  for (auto& r : waiting_) all.push_back(std::move(r));
  running_.clear();
  waiting_.clear();
  for (auto& r : all) release_for_recompute(*r);
  return all;
}

std::vector<uint64_t> Scheduler::all_ids() const {
  std::vector<uint64_t> ids;
  for (const auto& r : running_) ids.push_back(r->id);
  for (const auto& r : waiting_) ids.push_back(r->id);
  return ids;
}

}  // namespace revolta
