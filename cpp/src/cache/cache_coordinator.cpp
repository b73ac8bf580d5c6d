#include "cache/cache_coordinator.h"

#include <algorithm>
#include <limits>

#include "core/error.h"

namespace revolta {

CachePlan plan_shape(const CacheSpecs& groups, const CacheLimits& limits) {
  CachePlan p;
  int32_t kv_groups = 0, state_groups = 0, row_groups = 0, state_slots_per_request = 0;
  for (const CacheGroupSpec& g : groups) {
    if (g.kind == CacheGroupSpec::Kind::kPagedKv) {
      p.kv = g.kv;
      ++kv_groups;
    } else if (g.kind == CacheGroupSpec::Kind::kTokenRows) {
      p.rows = g.rows;
      ++row_groups;
    } else {
      p.state = g.state;
      state_slots_per_request = g.slots_per_request;
      ++state_groups;
    }
  }
  // Layers of different KV specs (sliding windows, other head sizes) would need a pool each.
  RV_CHECK_ARG(kv_groups <= 1 && state_groups <= 1 && row_groups <= 1, "the model declares ", kv_groups, " paged-KV, ",
               state_groups, " recurrent-state and ", row_groups, " token-row cache groups; the cache supports one of each");
  p.state_slots = !p.state.empty() ? limits.max_num_seqs * state_slots_per_request : 0;
  p.snapshot_slots = limits.prefix_caching && !p.state.empty() ? limits.max_num_seqs : 0;
  p.state_bytes = p.state.bytes_per_slot() * (p.state_slots + p.snapshot_slots);
  p.block_bytes = std::max<int64_t>(1, (p.kv.bytes_per_token() + p.rows.bytes_per_token()) * limits.block_size);
  p.need_blocks = (limits.max_model_len + limits.block_size - 1) / limits.block_size;
  return p;
}

CachePlan plan_caches(const CacheSpecs& groups, const CacheLimits& limits, int64_t budget, const std::string& option) {
  CachePlan p = plan_shape(groups, limits);
  RV_CHECK_ARG(p.state_bytes < budget, option, " (", budget, " bytes for caches) does not even hold the recurrent "
               "states of max_num_seqs (", limits.max_num_seqs, ") requests (", p.state_bytes,
               " bytes with prefix-cache snapshots); raise it or lower max_num_seqs");
  p.num_blocks = (budget - p.state_bytes) / p.block_bytes;
  RV_CHECK_ARG(p.num_blocks >= p.need_blocks, option, " (", budget, " bytes for caches) holds ", p.num_blocks,
               " blocks of ", limits.block_size, " tokens, fewer than one request of max_model_len (", limits.max_model_len,
               ") needs beside the recurrent states; raise ", option, " to at least ", p.min_bytes(), " bytes or lower max_model_len");
  // Blocks also index prefix-cache hashes and state snapshots, so a model without attention
  // layers (KV bytes 0) still gets a pool: enough for every sequence at full length, twice.
  if (p.kv.bytes_per_token() + p.rows.bytes_per_token() == 0) p.num_blocks = std::min(p.num_blocks, int64_t(2) * limits.max_num_seqs * p.need_blocks);
  p.num_blocks = std::min<int64_t>(p.num_blocks, std::numeric_limits<int32_t>::max() / limits.block_size);
  return p;
}

void CachePlan::shrink_to(int64_t budget) {
  num_blocks = std::max(need_blocks, std::min(num_blocks, (budget - state_bytes) / block_bytes));
}

CacheCoordinator::CacheCoordinator(const CachePlan& plan, const CacheLimits& limits, Device device) : plan_(plan) {
  kv_ = std::make_unique<KvCache>(plan.kv, int32_t(plan.num_blocks), limits.block_size, device, plan.rows);
  if (plan.state_slots) states_ = std::make_unique<StateCache>(plan.state, plan.state_slots + plan.snapshot_slots, device);
  manager_ = std::make_unique<KvCacheManager>(int32_t(plan.num_blocks), limits.block_size, limits.prefix_caching,
                                              plan.state_slots, plan.snapshot_slots);
}

int64_t CacheCoordinator::nbytes() const { return kv_->nbytes() + (states_ ? states_->nbytes() : 0); }

std::vector<StateAction> CacheCoordinator::prepare(const std::vector<ScheduledRequest>& scheduled) {
  std::vector<StateAction> actions;
  for (const ScheduledRequest& s : scheduled) {
    Request& r = *s.request;
    if (!states_) continue;
    if (r.state_restore >= 0) actions.push_back({r.state_restore, r.state_slot});  // a prefix hit
    else if (r.state_fresh) actions.push_back({-1, r.state_slot});
    r.state_fresh = false;
    r.state_restore = -1;
    // A verify step: the state before it, in case drafts are rejected (speculative decoding).
    if (r.num_draft_tokens > 0) actions.push_back({r.state_slot, r.scratch_slot});
  }
  return actions;
}

StateAction CacheCoordinator::commit(Request& r) {
  manager_->cache_full_blocks(r);
  const int32_t snapshot = manager_->snapshot_target(r);
  if (snapshot < 0) return {};
  states_->copy(r.state_slot, snapshot);
  return {r.state_slot, snapshot};
}

}  // namespace revolta
