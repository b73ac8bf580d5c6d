#include "cache/cache_manager.h"

#include <algorithm>

namespace revolta {

namespace {

// Block i's tokens as the cache keys them: the tokens themselves, or with media spans replaced by
// their content keys (Request::cache_token), written to buf.
const int32_t* block_keys(const Request& r, int32_t i, int32_t bs, std::vector<int32_t>& buf) {
  if (!r.media) return r.tokens.data() + size_t(i) * size_t(bs);
  buf.resize(size_t(bs));
  for (int32_t k = 0; k < bs; ++k) buf[size_t(k)] = r.cache_token(i * bs + k);
  return buf.data();
}

}  // namespace

KvCacheManager::KvCacheManager(int32_t num_blocks, int32_t block_size, bool prefix, int32_t state_slots,
                               int32_t snapshot_slots)
    : pool_(num_blocks, block_size, prefix), num_state_slots_(state_slots) {
  for (int32_t i = state_slots; i-- > 0;) free_state_slots_.push_back(i);
  if (prefix)
    for (int32_t i = snapshot_slots; i-- > 0;) free_snapshot_slots_.push_back(state_slots + i);
}

int32_t KvCacheManager::snapshot_boundary(const Request& r) const {
  if (!hybrid() || !pool_.prefix_caching()) return 0;
  const int32_t bs = pool_.block_size();
  return (r.num_prompt_tokens - 1) / bs * bs;
}

int32_t KvCacheManager::chunk_limit(const Request& r, int32_t n) const {
  const int32_t boundary = snapshot_boundary(r), done = r.num_computed_tokens;
  if (boundary <= done) return n;
  n = std::min(n, boundary - done);
  const int32_t bs = pool_.block_size();
  const int32_t end = (done + n) / bs * bs;
  return done + n < boundary && end > done ? end - done : n;
}

void KvCacheManager::set_tiers(KvTiers* tiers) {
  tiers_ = tiers;
  seed_ = tiers ? tiers->seed() : 0;
}

std::vector<BlockTransfer> KvCacheManager::take_transfers() {
  std::vector<BlockTransfer> t;
  t.swap(transfers_);
  return t;
}

void KvCacheManager::drop_snapshot(int32_t slot) {
  // A snapshot not yet written through is lost with its slot (the slot is about to hold another).
  std::erase_if(transfers_, [&](const BlockTransfer& t) { return t.kind == BlockTransfer::Kind::kSaveState && t.index == slot; });
  for (auto it = snapshot_lru_.begin(); it != snapshot_lru_.end(); ++it)
    if (it->first == slot) {
      snapshots_.erase(it->second);
      snapshot_lru_.erase(it);
      free_snapshot_slots_.push_back(slot);
      return;
    }
}

int32_t KvCacheManager::snapshot_target(Request& r) {
  const int32_t bs = pool_.block_size();
  const int32_t n = r.num_computed_tokens;
  if (!hybrid() || !pool_.prefix_caching() || n == 0 || n % bs != 0 || n > snapshot_boundary(r)) return -1;
  if (int32_t(r.block_hashes.size()) < n / bs) return -1;
  const uint64_t h = r.block_hashes[size_t(n / bs - 1)];
  if (snapshots_.count(h)) return -1;  // this prefix already has one
  if (r.snapshot_slot >= 0) drop_snapshot(r.snapshot_slot);  // superseded by the longer prefix
  r.snapshot_slot = take_snapshot_slot(h);
  // Written through once the step's copy into the slot is done (the next transfers run after it).
  if (r.snapshot_slot >= 0 && tiers_ && !tiers_->has(KvTiers::state_key(h)))
    transfers_.push_back({BlockTransfer::Kind::kSaveState, r.snapshot_slot, tiers_->new_state(KvTiers::state_key(h))});
  return r.snapshot_slot;
}

int32_t KvCacheManager::take_snapshot_slot(uint64_t h) {
  if (free_snapshot_slots_.empty()) {
    if (snapshot_lru_.empty()) return -1;
    drop_snapshot(snapshot_lru_.front().first);  // evict the least recently used
  }
  const int32_t slot = free_snapshot_slots_.back();
  free_snapshot_slots_.pop_back();
  snapshot_lru_.emplace_back(slot, h);
  snapshots_[h] = std::prev(snapshot_lru_.end());
  return slot;
}

void KvCacheManager::match_in_tiers(Request& r, uint64_t parent, int32_t max_blocks) {
  const int32_t bs = pool_.block_size();
  std::vector<int32_t> keys;
  for (int32_t i = int32_t(r.block_table.size()); i < max_blocks; ++i) {
    const int32_t* toks = block_keys(r, i, bs, keys);
    const uint64_t h = BlockPool::hash_block(parent, toks, bs);
    TierEntryPtr e = tiers_->fetch_block(h, parent, toks, bs);
    if (!e) break;
    auto b = pool_.allocate(1);
    if (!b) break;
    pool_.register_block(b->front(), h, parent, toks);
    transfers_.push_back({BlockTransfer::Kind::kLoadBlock, b->front(), std::move(e)});
    r.block_table.push_back(b->front());
    r.block_hashes.push_back(h);
    parent = h;
  }
}

void KvCacheManager::prefetch(Request& r) {
  if (!tiers_ || !pool_.prefix_caching()) return;
  const int32_t bs = pool_.block_size();
  std::vector<int32_t> block;
  const int32_t max_blocks = (r.num_tokens() - 1) / bs;
  std::vector<uint64_t> keys;
  uint64_t parent = seed_;
  bool past_device = false;
  for (int32_t i = 0; i < max_blocks; ++i) {
    const int32_t* toks = block_keys(r, i, bs, block);
    const uint64_t h = BlockPool::hash_block(parent, toks, bs);
    past_device = past_device || pool_.lookup(h, parent, toks) < 0;
    if (past_device) keys.push_back(h);
    if (hybrid() && !snapshots_.count(h)) keys.push_back(KvTiers::state_key(h));
    parent = h;
  }
  r.tier_reads = tiers_->prefetch(keys);
}

bool KvCacheManager::kv_loading(Request& r) const {
  if (!r.tier_reads) return false;
  if (r.tier_reads->left.load() > 0) return true;
  r.tier_reads.reset();
  return false;
}

int32_t KvCacheManager::match_prefix(Request& r) {
  if (!pool_.prefix_caching() || r.num_computed_tokens != 0 || !r.block_table.empty()) return 0;
  // Every prompt position's logits or hidden state is wanted: computed, not read from the cache.
  if (r.params.prompt_logprobs >= 0 || r.params.pooling == "mean") return 0;
  const int32_t bs = pool_.block_size();
  std::vector<int32_t> keys;
  const int32_t max_blocks = (r.num_tokens() - 1) / bs;
  uint64_t parent = seed_;
  for (int32_t i = 0; i < max_blocks; ++i) {
    const int32_t* toks = block_keys(r, i, bs, keys);
    uint64_t h = BlockPool::hash_block(parent, toks, bs);
    int32_t b = pool_.lookup(h, parent, toks);
    if (b < 0) break;
    pool_.acquire(b);
    r.block_table.push_back(b);
    r.block_hashes.push_back(h);
    parent = h;
  }
  const size_t on_device = r.block_table.size();
  if (tiers_) match_in_tiers(r, parent, max_blocks);
  if (hybrid()) {  // only as far as a state snapshot reaches (on the device, or brought back)
    size_t keep = r.block_table.size();
    for (; keep > 0; --keep) {
      const uint64_t h = r.block_hashes[keep - 1];
      if (snapshots_.count(h)) break;
      TierEntryPtr e = tiers_ ? tiers_->fetch_state(KvTiers::state_key(h)) : nullptr;
      if (!e) continue;
      const int32_t slot = take_snapshot_slot(h);
      if (slot < 0) continue;
      transfers_.push_back({BlockTransfer::Kind::kLoadState, slot, std::move(e)});
      break;
    }
    std::vector<int32_t> extra(r.block_table.rbegin(), r.block_table.rend() - ptrdiff_t(keep));
    pool_.release(extra);
    r.block_table.resize(keep);
    r.block_hashes.resize(keep);
    if (keep > 0) {
      auto it = snapshots_.at(r.block_hashes[keep - 1]);
      r.state_restore = it->first;
      snapshot_lru_.splice(snapshot_lru_.end(), snapshot_lru_, it);  // most recently used
    }
  }
  tier_hits_ += int64_t(std::max<size_t>(r.block_table.size(), on_device) - on_device) * bs;
  const int32_t hit = int32_t(r.block_table.size()) * bs;
  queries_ += r.num_tokens();
  hits_ += hit;
  r.num_computed_tokens = hit;
  return hit;
}

bool KvCacheManager::allocate_slots(Request& r, int32_t num_new_tokens) {
  const int32_t bs = pool_.block_size();
  if (hybrid() && r.state_slot < 0) {
    if (free_state_slots_.empty()) return false;
    r.state_slot = free_state_slots_.back();
    free_state_slots_.pop_back();
    r.state_fresh = true;
  }
  const int32_t need = (r.num_computed_tokens + num_new_tokens + bs - 1) / bs;
  const int32_t missing = need - int32_t(r.block_table.size());
  if (missing <= 0) return true;
  auto blocks = pool_.allocate(missing);
  if (!blocks) return false;
  r.block_table.insert(r.block_table.end(), blocks->begin(), blocks->end());
  return true;
}

void KvCacheManager::cache_full_blocks(Request& r) {
  if (!pool_.prefix_caching()) return;
  const int32_t bs = pool_.block_size();
  std::vector<int32_t> keys;
  const size_t full = size_t(r.num_computed_tokens / bs);
  for (size_t i = r.block_hashes.size(); i < full; ++i) {
    uint64_t parent = i ? r.block_hashes[i - 1] : seed_;
    const int32_t* toks = block_keys(r, int32_t(i), bs, keys);
    uint64_t h = BlockPool::hash_block(parent, toks, bs);
    pool_.register_block(r.block_table[i], h, parent, toks);
    if (tiers_ && !tiers_->has(h))  // written through (the block's K and V are computed by now)
      transfers_.push_back({BlockTransfer::Kind::kSaveBlock, r.block_table[i], tiers_->new_block(h, parent, toks, bs)});
    r.block_hashes.push_back(h);
  }
}

void KvCacheManager::trim(Request& r) {
  const size_t keep = size_t(r.num_tokens() / pool_.block_size() + 1);
  if (r.block_table.size() <= keep) return;
  std::vector<int32_t> tail(r.block_table.rbegin(), r.block_table.rend() - ptrdiff_t(keep));
  pool_.release(tail);
  r.block_table.resize(keep);
}

bool KvCacheManager::take_scratch_slot(Request& r) {
  if (r.scratch_slot >= 0) return true;
  if (free_state_slots_.empty()) return false;
  r.scratch_slot = free_state_slots_.back();
  free_state_slots_.pop_back();
  return true;
}

void KvCacheManager::free(Request& r) {
  std::vector<int32_t> reversed(r.block_table.rbegin(), r.block_table.rend());
  pool_.release(reversed);
  r.block_table.clear();
  r.block_hashes.clear();
  if (r.state_slot >= 0) free_state_slots_.push_back(r.state_slot);
  if (r.scratch_slot >= 0) free_state_slots_.push_back(r.scratch_slot);
  r.state_slot = r.scratch_slot = -1;
  r.state_restore = -1;
  r.state_fresh = false;
}

}  // namespace revolta
