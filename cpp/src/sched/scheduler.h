// The scheduler: one rule (DESIGN 4.1). Each step it gives every running request, then waiting
// requests in arrival order, as many new tokens as it still lacks, within a token budget
// (max_num_batched_tokens) and a sequence limit (max_num_seqs). When blocks run out, the most
// recently admitted running request is preempted: its blocks are freed and it recomputes later.
#pragma once

#include <deque>
#include <memory>
#include <vector>

#include "cache/cache_manager.h"
#include "sched/request.h"

namespace revolta {

struct SchedulerConfig {
  int32_t max_num_seqs = 64;
  int32_t max_num_batched_tokens = 2048;
  int32_t max_model_len = 2048;
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
  // Removes a request (running or waiting), frees its blocks and returns it; null if unknown.
  std::unique_ptr<Request> remove(uint64_t id);

  int64_t num_running() const { return int64_t(running_.size()); }
  int64_t num_waiting() const { return int64_t(waiting_.size()); }
  int64_t num_preemptions() const { return preemptions_; }
  bool has_work() const { return !running_.empty() || !waiting_.empty(); }
  // The running requests in the order a step schedules them.
  std::vector<Request*> running() const;
  // Every live request, for shutdown.
  std::vector<uint64_t> all_ids() const;
  // Every request, running ones first, each as preemption leaves it (blocks freed, to be
  // recomputed when added again): the engine's sleep mode.
  std::vector<std::unique_ptr<Request>> take_all();

 private:
  void preempt(Request* r);
  void release_for_recompute(Request& r);  // drafts dropped, blocks freed, progress reset

  SchedulerConfig cfg_;
  KvCacheManager& cache_;
  std::vector<std::unique_ptr<Request>> running_;  // admission order
  std::deque<std::unique_ptr<Request>> waiting_;
  int64_t preemptions_ = 0;
};

}  // namespace revolta
