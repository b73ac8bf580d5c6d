#include "sched/scheduler.h"

#include <algorithm>

#include "core/error.h"

namespace revolta {

SchedulingPolicy parse_scheduling_policy(const std::string& name) {
  if (name == "fair") return SchedulingPolicy::kFair;
  if (name == "fcfs") return SchedulingPolicy::kFcfs;
  RV_CHECK_ARG(name == "priority", "scheduling_policy must be fair, fcfs or priority; got '", name, "'");
  return SchedulingPolicy::kPriority;
}

Scheduler::Scheduler(const SchedulerConfig& config, KvCacheManager& cache)
    : cfg_(config), cache_(cache) {}

uint64_t Scheduler::group_of(const Request& r) const {
  return r.tag.group ? r.tag.group : (r.id | (uint64_t(1) << 63));  // a group of its own
}

const Scheduler::Share& Scheduler::share(const std::unordered_map<uint64_t, Share>& m, uint64_t key) const {
  static const Share none;
  auto it = m.find(key);
  return it == m.end() ? none : it->second;
}

// Moves r between the counts: running and waiting deltas of +1 / -1; an admission (running +1,
// waiting -1) also stamps its client and group as the most recently admitted from.
void Scheduler::count(const Request& r, int32_t running, int32_t waiting) {
  const bool admitted = running > 0 && waiting < 0;
  if (admitted) ++admissions_;
  for (auto [m, key] : {std::pair{&clients_, r.tag.client}, std::pair{&groups_, group_of(r)}}) {
    Share& s = (*m)[key];
    s.running += running;
    s.waiting += waiting;
    if (admitted) s.last_admitted = admissions_;
    if (s.running == 0 && s.waiting == 0) m->erase(key);
  }
  if (waiting != 0 && (waiting_per_priority_[r.tag.priority] += waiting) == 0) waiting_per_priority_.erase(r.tag.priority);
}

void Scheduler::add(std::unique_ptr<Request> r) {
  r->status = RequestStatus::kWaiting;
  count(*r, 0, 1);
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
  count(*r, -1, 1);
  waiting_.push_front(std::move(*it));
  running_.erase(it);
}

Scheduler::Rank Scheduler::rank(const Request& r) const {
  switch (cfg_.policy) {
    case SchedulingPolicy::kFcfs:
      return {0, 0, 0, 0};
    case SchedulingPolicy::kPriority:
      return {r.tag.priority, 0, 0, 0};
    case SchedulingPolicy::kFair:
      break;
  }
  const Share &c = share(clients_, r.tag.client), &g = share(groups_, group_of(r));
  return {c.running, c.last_admitted, g.running, g.last_admitted};
}

Scheduler::Queue::iterator Scheduler::pick_waiting() {
  auto best = waiting_.end();
  Rank best_rank{};
  for (auto it = waiting_.begin(); it != waiting_.end(); ++it) {
    Request& r = **it;
    // One whose prefix is still being read from the KV offload disk tier is passed over until
    // its reads land.
    if (r.num_computed_tokens == 0 && cache_.kv_loading(r)) continue;
    if (cfg_.policy == SchedulingPolicy::kFcfs) return it;
    Rank k = rank(r);
    if (best == waiting_.end() || k < best_rank) {
      best = it;
      best_rank = k;
    }
  }
  return best;
}

Request* Scheduler::pick_victim() const {
  Request* victim = nullptr;
  Rank worst{};
  for (const auto& p : running_) {
    Rank k = rank(*p);
    if (!victim || k >= worst) {  // ties: the later admitted
      victim = p.get();
      worst = k;
    }
  }
  return victim;
}

bool Scheduler::displaces(const Request& w, const Request& v) const {
  switch (cfg_.policy) {
    case SchedulingPolicy::kFcfs:
      return false;
    case SchedulingPolicy::kPriority:
      return w.tag.priority < v.tag.priority;
    case SchedulingPolicy::kFair:
      break;
  }
  if (w.tag.client != v.tag.client)
    return share(clients_, v.tag.client).running >= share(clients_, w.tag.client).running + 2;
  const uint64_t wg = group_of(w), vg = group_of(v);
  return wg != vg && share(groups_, vg).running >= share(groups_, wg).running + 2;
}

void Scheduler::unschedule(Request* r, SchedulerOutput& out, int32_t& budget) {
  auto it = std::find_if(out.scheduled.begin(), out.scheduled.end(),
                         [&](const ScheduledRequest& s) { return s.request == r; });
  if (it == out.scheduled.end()) return;
  budget += it->num_new_tokens;
  out.num_batched_tokens -= it->num_new_tokens;
  out.scheduled.erase(it);
}

bool Scheduler::displace_for(const Request& waiting, SchedulerOutput& out, int32_t& budget) {
  Request* victim = pick_victim();
  if (!victim || !displaces(waiting, *victim)) return false;
  unschedule(victim, out, budget);
  preempt(victim);
  return true;
}

int32_t Scheduler::media_limit(const Request& r, int32_t n, int32_t& left, bool& encodes) const {
  if (!r.media || n <= 0) return n;
  const int32_t begin = r.num_computed_tokens, end = begin + n;
  for (size_t i = 0; i < r.media->spans.size(); ++i) {
    const MediaSpan& s = r.media->spans[i];
    if (s.end() <= begin) continue;
    if (s.input.offset >= end) break;
    if ((i < r.encoded.size() && r.encoded[i]) || (encoder_cache_ && encoder_cache_->contains(s.input.hash))) continue;
    if (encodes && s.tokens > left) return std::max(0, s.input.offset - begin);
    left -= s.tokens;
    encodes = true;
  }
  return n;
}

SchedulerOutput Scheduler::schedule() {
  SchedulerOutput out;
  int32_t budget = cfg_.max_num_batched_tokens;
  bool preempted = false;
  int32_t encoder_left = encoder_budget_;
  bool encodes = false;

  for (size_t i = 0; i < running_.size() && budget > 0;) {
    Request* r = running_[i].get();
    int32_t n = cache_.chunk_limit(*r, std::min(r->num_tokens() - r->num_computed_tokens, budget));
    if (r->num_draft_tokens > 0 && n < r->num_tokens() - r->num_computed_tokens) {  // drafts go whole or not at all
      r->drop_drafts();
      n = cache_.chunk_limit(*r, std::min(r->num_tokens() - r->num_computed_tokens, budget));
    }
    n = media_limit(*r, n, encoder_left, encodes);
    if (n <= 0) {
      ++i;
      continue;
    }
    bool scheduled = true;
    while (!cache_.allocate_slots(*r, n)) {
      Request* victim = pick_victim();
      // Requests before r in running_ keep their place: a victim among them moves r down by one.
      const bool before = std::find_if(running_.begin(), running_.begin() + i,
                                       [&](const auto& p) { return p.get() == victim; }) != running_.begin() + i;
      unschedule(victim, out, budget);  // a victim scheduled earlier in this step gives its tokens back
      preempt(victim);
      preempted = true;
      if (victim == r) {
        scheduled = false;
        break;
      }
      if (before) --i;
    }
    if (!scheduled) continue;  // r left running_; index i now names the next request
    out.scheduled.push_back({r, n});
    out.num_batched_tokens += n;
    budget -= n;
    ++i;
  }

  // Free slots go to waiting requests in the policy's order; a preemption above means blocks
  // are short, so nothing is admitted this step.
  for (int32_t displaced = 0; !preempted && budget > 0;) {
    auto it = pick_waiting();
    if (it == waiting_.end()) break;
    Request* r = it->get();
    if (int32_t(running_.size()) >= cfg_.max_num_seqs) {
      if (displaced >= cfg_.max_num_seqs || !displace_for(*r, out, budget)) break;
      ++displaced;
      continue;  // the victim went to the waiting queue; r still ranks first
    }
    if (r->num_computed_tokens == 0) {
      int32_t hit = cache_.match_prefix(*r);
      if (r->num_cached_tokens < 0) r->num_cached_tokens = std::min(hit, r->num_prompt_tokens);
    }
    int32_t n = cache_.chunk_limit(*r, std::min(r->num_tokens() - r->num_computed_tokens, budget));
    int32_t encoder_after = encoder_left;
    bool encodes_after = encodes;
    n = media_limit(*r, n, encoder_after, encodes_after);
    if (n <= 0) {  // its next media span waits for a step with encoder budget left
      cache_.free(*r);
      r->num_computed_tokens = 0;
      break;
    }
    if (!cache_.allocate_slots(*r, n)) {
      cache_.free(*r);  // give back the prefix blocks it took; they stay cached
      r->num_computed_tokens = 0;
      if (displaced >= cfg_.max_num_seqs || !displace_for(*r, out, budget)) break;
      ++displaced;
      continue;
    }
    encoder_left = encoder_after, encodes = encodes_after;
    r->status = RequestStatus::kRunning;
    count(*r, 1, -1);
    running_.push_back(std::move(*it));
    waiting_.erase(it);
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
    count(*r, -1, 0);
  } else {
    auto wit = std::find_if(waiting_.begin(), waiting_.end(), [&](const auto& p) { return p->id == id; });
    if (wit == waiting_.end()) return nullptr;
    r = std::move(*wit);
    waiting_.erase(wit);
    count(*r, 0, -1);
  }
  cache_.free(*r);
  r->status = RequestStatus::kFinished;
  return r;
}

std::vector<std::pair<int32_t, int64_t>> Scheduler::waiting_by_priority() const {
  return {waiting_per_priority_.begin(), waiting_per_priority_.end()};
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
  clients_.clear();
  groups_.clear();
  waiting_per_priority_.clear();
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
