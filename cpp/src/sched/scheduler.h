// The scheduler: one rule. Each step it gives every running request, in admission order, as many
// new tokens as it still lacks, within a token budget (max_num_batched_tokens); then it fills free
// running slots (max_num_seqs) from the waiting queue, one at a time, with the request the policy
// ranks first:
//   fcfs      the queue's order (arrival; preempted requests go back to its front);
//   priority  the lowest SchedulingTag::priority, then the queue's order (vLLM's);
//   fair      the client with the fewest running requests, within it the parent request (group)
//             with the fewest, each tie going to the one admitted from least recently, then the
//             queue's order: round robin across clients and their requests, so no one request's
//             fan-out holds the others back.
// When blocks run out, the policy's victim is preempted (its blocks freed, recomputed later):
// fcfs the last admitted; priority the last admitted of the highest priority value; fair the last
// admitted of the most-served group of the most-served client. A waiting request that finds no
// slot or no blocks displaces that victim only when it ranks far ahead of it: priority, a strictly
// lower priority value; fair, the victim's client (the same client: its group) runs at least two
// more requests than the waiting one's, so a swap never reverses the order. fcfs never displaces.
#pragma once

#include <array>
#include <deque>
#include <map>
#include <memory>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include "cache/cache_manager.h"
#include "runtime/encoder_cache.h"
#include "sched/request.h"

namespace revolta {

enum class SchedulingPolicy { kFair, kFcfs, kPriority };
// "fair" | "fcfs" | "priority"; throws std::invalid_argument naming the option otherwise.
SchedulingPolicy parse_scheduling_policy(const std::string& name);

struct SchedulerConfig {
  int32_t max_num_seqs = 64;
  int32_t max_num_batched_tokens = 2048;
  int32_t max_model_len = 2048;
  SchedulingPolicy policy = SchedulingPolicy::kFair;
};

struct ScheduledRequest {
  Request* request;
  int32_t num_new_tokens;
};

struct SchedulerOutput {
  std::vector<ScheduledRequest> scheduled;
  int32_t num_batched_tokens = 0;
  bool empty() const { return scheduled.empty(); }
};

class Scheduler {
 public:
  Scheduler(const SchedulerConfig& config, KvCacheManager& cache);

  void add(std::unique_ptr<Request> r);
  SchedulerOutput schedule();
  // Multimodal prompts: a chunk that reaches a media span needs its encoder output, which the
  // engine makes before the step's forward unless the request holds it or `cache` has it. A step
  // encodes spans of at most `budget` placeholder tokens together (the first always fits, so a
  // larger one runs alone): a chunk stops before the first span past the budget, so one request's
  // many images spread over steps instead of stalling every decode behind them.
  void set_encoder(const EncoderCache* cache, int32_t budget) { encoder_cache_ = cache, encoder_budget_ = budget; }
  // Removes a request (running or waiting), frees its blocks and returns it; null if unknown.
  std::unique_ptr<Request> remove(uint64_t id);

  int64_t num_running() const { return int64_t(running_.size()); }
  int64_t num_waiting() const { return int64_t(waiting_.size()); }
  int64_t num_preemptions() const { return preemptions_; }
  bool has_work() const { return !running_.empty() || !waiting_.empty(); }
  // (priority, requests waiting), ascending by priority.
  std::vector<std::pair<int32_t, int64_t>> waiting_by_priority() const;
  // The running requests in the order a step schedules them.
  std::vector<Request*> running() const;
  // Every live request, for shutdown.
  std::vector<uint64_t> all_ids() const;
  // Every request, running ones first, each as preemption leaves it (blocks freed, to be
  // recomputed when added again): the engine's sleep mode.
  std::vector<std::unique_ptr<Request>> take_all();

 private:
  using Queue = std::deque<std::unique_ptr<Request>>;
  using Rank = std::array<int64_t, 4>;  // the policy's key, smaller first (ties: queue order)
  // Per client and per group: requests running and waiting, and when it was last admitted from
  // (an admission count), kept while it has requests.
  struct Share {
    int32_t running = 0, waiting = 0;
    int64_t last_admitted = 0;
  };

  Rank rank(const Request& r) const;
  // n cut before the first media span the step's encoder budget (`left`) cannot take.
  int32_t media_limit(const Request& r, int32_t n, int32_t& left, bool& encodes) const;
  Queue::iterator pick_waiting();  // the first ready waiting request by the policy, or end()
  Request* pick_victim() const;    // the running request the policy gives up first
  bool displaces(const Request& waiting, const Request& victim) const;
  // Preempts the victim for `waiting` when the policy lets it (its tokens of this step given back).
  bool displace_for(const Request& waiting, SchedulerOutput& out, int32_t& budget);
  void unschedule(Request* r, SchedulerOutput& out, int32_t& budget);
  void preempt(Request* r);
  void release_for_recompute(Request& r);  // drafts dropped, blocks freed, progress reset
  void count(const Request& r, int32_t running, int32_t waiting);
  uint64_t group_of(const Request& r) const;
  const Share& share(const std::unordered_map<uint64_t, Share>& m, uint64_t key) const;

  SchedulerConfig cfg_;
  KvCacheManager& cache_;
  std::vector<std::unique_ptr<Request>> running_;  // admission order
  Queue waiting_;
  std::unordered_map<uint64_t, Share> clients_, groups_;
  std::map<int32_t, int64_t> waiting_per_priority_;
  int64_t admissions_ = 0;
  int64_t preemptions_ = 0;
  const EncoderCache* encoder_cache_ = nullptr;
  int32_t encoder_budget_ = 0;
};

}  // namespace revolta
