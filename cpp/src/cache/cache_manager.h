// Hands KV blocks to requests: prefix matching on first schedule, slots for new tokens,
// registration of blocks as they fill, and release. It never looks inside the blocks.
#pragma once

#include <cstdint>

#include "cache/block_pool.h"
#include "sched/request.h"

namespace revolta {

class KvCacheManager {
 public:
  KvCacheManager(int32_t num_blocks, int32_t block_size, bool enable_prefix_caching);

  // For a request with nothing computed: takes the longest chain of cached full blocks that
  // match its tokens (always leaving at least one token to compute, so there are logits to
  // sample from) and sets num_computed_tokens accordingly. Returns the hit length in tokens.
  int32_t match_prefix(Request& r);
  // Makes the block table cover num_computed_tokens + num_new_tokens. False (nothing taken)
  // when the pool is short.
  bool allocate_slots(Request& r, int32_t num_new_tokens);
  // Registers blocks that became full with computed tokens, so later requests can hit them.
  void cache_full_blocks(Request& r);
  // Releases every block of the request (tail first, so tails are evicted first).
  void free(Request& r);

  const BlockPool& pool() const { return pool_; }
  int64_t queries() const { return queries_; }
  int64_t hits() const { return hits_; }

 private:
  BlockPool pool_;
  int64_t queries_ = 0, hits_ = 0;
};

}  // namespace revolta
