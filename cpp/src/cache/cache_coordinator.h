// The cache side of the engine in one place: how one memory budget is split between
// the model's cache groups, the storage of each group, every request's block table and state
// slots (through the KvCacheManager, which the scheduler asks), and the decisions about
// recurrent states: which slots are zeroed or restored before a forward (actions the runner
// executes) and which are snapshotted after it. It knows groups and specs, never architectures.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "cache/cache_manager.h"
#include "cache/cache_spec.h"
#include "cache/state_cache.h"
#include "sched/scheduler.h"

namespace revolta {

struct CacheLimits {
  int32_t block_size = 16;
  int32_t max_num_seqs = 1;
  int32_t max_model_len = 1;
  bool prefix_caching = true;
};

// One budget split: recurrent-state slots first (slots_per_request for every running request,
// and one prefix-cache snapshot per running request when prefix caching is on), KV blocks from
// the rest.
struct CachePlan {
  KvCacheSpec kv;   // the paged group (num_layers 0: the model has none)
  TokenRowsSpec rows;  // per-token rows in the same blocks (num_layers 0: none)
  StateSpec state;  // the recurrent group (num_layers 0: none)
  int32_t state_slots = 0, snapshot_slots = 0;
  int64_t num_blocks = 0;
  int64_t block_bytes = 1, state_bytes = 0;
  int64_t need_blocks = 0;  // one request of max_model_len
  int64_t min_bytes() const { return state_bytes + need_blocks * block_bytes; }
  // Fewer blocks where a budget measured later is smaller, never fewer than one request needs.
  void shrink_to(int64_t budget);
};

// The split of `budget` bytes. Throws std::invalid_argument naming budget_option when the
// budget holds not even one request of max_model_len with every state slot.
CachePlan plan_caches(const CacheSpecs& groups, const CacheLimits& limits, int64_t budget, const std::string& budget_option);
// The same split's fixed part, before any budget is known (for messages and device budgets).
CachePlan plan_shape(const CacheSpecs& groups, const CacheLimits& limits);


class CacheCoordinator {
 public:
  CacheCoordinator(const CachePlan& plan, const CacheLimits& limits, Device device);
  KvCacheManager& manager() { return *manager_; }
  const KvCacheManager& manager() const { return *manager_; }
  KvCache& kv() { return *kv_; }
  StateCache* states() { return states_.get(); }
  int64_t num_blocks() const { return plan_.num_blocks; }
  int64_t nbytes() const;

  // The state slots of this step's requests that must be zeroed (new) or restored (a prefix hit),
  // and saved (a request verifying drafts: its scratch slot, for a rollback after rejections).
  std::vector<StateAction> prepare(const std::vector<ScheduledRequest>& scheduled);
  // After a forward computed the request's scheduled tokens: registers its full blocks for
  // prefix hits and, on a block boundary of its prompt, snapshots its state; returns that copy
  // (to < 0: none), which other tensor-parallel ranks' states repeat.
  StateAction commit(Request& r);

 private:
  CachePlan plan_;
  std::unique_ptr<KvCache> kv_;
  std::unique_ptr<StateCache> states_;
  std::unique_ptr<KvCacheManager> manager_;
};

}  // namespace revolta
