// Hands KV blocks to requests: prefix matching on first schedule, slots for new tokens,
// registration of blocks as they fill, and release. It never looks inside the blocks.
#pragma once

#include <cstdint>
#include <list>
#include <unordered_map>
#include <utility>
#include <vector>

#include "cache/block_pool.h"
#include "cache/kv_tiers.h"
#include "sched/request.h"

namespace revolta {

// For hybrid models the manager also hands out recurrent-state slots (one per scheduled request)
// and keeps prefix-cache snapshots of those states at block boundaries ("align" mode): a prefix
// hit is only valid up to the last block whose snapshot exists.
class KvCacheManager {
 public:
  KvCacheManager(int32_t num_blocks, int32_t block_size, bool enable_prefix_caching,
                 int32_t state_slots = 0, int32_t snapshot_slots = 0);
  bool hybrid() const { return num_state_slots_ > 0; }
  // The last block boundary a later identical prompt could hit (0: none); hybrid prefills stop
  // there once so that a snapshot exists.
  int32_t snapshot_boundary(const Request& r) const;
  // Caps a request's new tokens so that a hybrid prefill stops on the snapshot boundary and on
  // block boundaries before it (each may become a snapshot).
  int32_t chunk_limit(const Request& r, int32_t n) const;
  // After a step: if the request sits on a block boundary of its prompt, returns the snapshot
  // slot its state must be copied to (and frees the request's superseded snapshot); else -1.
  int32_t snapshot_target(Request& r);

  // For a request with nothing computed: takes the longest chain of cached full blocks that
  // match its tokens (always leaving at least one token to compute, so there are logits to
  // sample from) and sets num_computed_tokens accordingly. Returns the hit length in tokens.
  int32_t match_prefix(Request& r);
  // KV offload: a new request's prompt blocks (and state snapshots) past the device chain that only
  // the disk tier holds are read ahead by the tiers' reader thread (r.tier_reads). While they are
  // being read, kv_loading(r) holds and the scheduler passes the request over.
  void prefetch(Request& r);
  bool kv_loading(Request& r) const;
  // Makes the block table cover num_computed_tokens + num_new_tokens. False (nothing taken)
  // when the pool is short.
  bool allocate_slots(Request& r, int32_t num_new_tokens);
  // Registers blocks that became full with computed tokens, so later requests can hit them.
  void cache_full_blocks(Request& r);
  // Releases every block of the request (tail first, so tails are evicted first).
  void free(Request& r);
  // Releases the blocks past those its tokens and the next one need (drafts rejected).
  void trim(Request& r);
  // A second state slot for a request that drafts (its state before a verify step); false when
  // none is free (it then does not draft).
  bool take_scratch_slot(Request& r);

  // The offload tiers (null: none). Full blocks and state snapshots are then written through to
  // them, and prefix matches go on in them past the device pool (cache/kv_tiers.h).
  void set_tiers(KvTiers* tiers);
  // The copies between device caches and tiers decided since the last call, in order; every rank
  // runs them before the next forward.
  std::vector<BlockTransfer> take_transfers();
  bool has_transfers() const { return !transfers_.empty(); }

  const BlockPool& pool() const { return pool_; }
  BlockPool& pool() { return pool_; }
  int32_t num_snapshots() const { return int32_t(snapshot_lru_.size()); }
  int64_t queries() const { return queries_; }
  int64_t hits() const { return hits_; }
  int64_t tier_hits() const { return tier_hits_; }  // prompt tokens of hits brought back from the tiers

 private:
  BlockPool pool_;
  int64_t queries_ = 0, hits_ = 0;
  int32_t num_state_slots_;
  std::vector<int32_t> free_state_slots_;
  // Snapshots: block hash -> slot, LRU order (front = oldest) with the hash each slot holds.
  std::vector<int32_t> free_snapshot_slots_;
  std::list<std::pair<int32_t, uint64_t>> snapshot_lru_;
  std::unordered_map<uint64_t, std::list<std::pair<int32_t, uint64_t>>::iterator> snapshots_;
  void drop_snapshot(int32_t slot);
  int32_t take_snapshot_slot(uint64_t block_hash);  // the slot for a new snapshot (LRU eviction)
  void match_in_tiers(Request& r, uint64_t parent, int32_t max_blocks);
  KvTiers* tiers_ = nullptr;
  uint64_t seed_ = 0;  // the hash chain's start
  int64_t tier_hits_ = 0;
  std::vector<BlockTransfer> transfers_;
};

}  // namespace revolta
