// The host-memory tier of the KV offload (cache/kv_tiers.h): entries keyed by a block's chained
// hash, held up to a byte capacity and evicted LRU or ARC (adaptive replacement: a recency list
// and a frequency list whose split follows the hits on recently evicted keys, so one long scan of
// new blocks does not push out blocks that are hit again and again).
#pragma once

#include <cstdint>
#include <list>
#include <memory>
#include <string>
#include <unordered_map>
#include <vector>

namespace revolta {

// An offloaded KV block (every attention layer's K and V rows of its tokens, all tensor-parallel
// ranks' shards in rank order) or a recurrent-state snapshot; tokens and parent make a hit exact.
struct TierEntry {
  uint64_t key = 0, parent = 0;
  std::vector<int32_t> tokens;  // the block's tokens (a state snapshot: none)
  std::vector<uint8_t> bytes;
};
using TierEntryPtr = std::shared_ptr<TierEntry>;

enum class TierEviction { kLru, kArc };
TierEviction parse_tier_eviction(const std::string& name);  // "lru" | "arc"; throws naming the option

class HostTier {
 public:
  HostTier(int64_t capacity_bytes, TierEviction policy);
  bool contains(uint64_t key) const { return where_.count(key) > 0; }
  // The entry, counted as a use (null when absent).
  TierEntryPtr get(uint64_t key);
  // Adds (or refreshes) an entry, evicting others to make room; an entry larger than the whole
  // capacity is not kept.
  void put(TierEntryPtr e);
  int64_t used_bytes() const { return used_; }
  int64_t capacity_bytes() const { return capacity_; }
  size_t size() const { return where_.size(); }

 private:
  using List = std::list<TierEntryPtr>;
  struct Slot {
    List* list;
    List::iterator it;
  };
  struct Ghost {  // ARC: a key evicted lately, remembered with its size
    std::list<std::pair<uint64_t, int64_t>> order;
    std::unordered_map<uint64_t, std::list<std::pair<uint64_t, int64_t>>::iterator> at;
    int64_t bytes = 0;
    bool take(uint64_t key);
    void add(uint64_t key, int64_t size);
    void trim(int64_t limit);
  };
  static int64_t size_of(const TierEntry& e) { return int64_t(e.bytes.size() + e.tokens.size() * 4); }
  void evict_one(bool from_recent);
  void make_room(int64_t need, bool hit_in_frequent_ghost);

  int64_t capacity_, used_ = 0;
  TierEviction policy_;
  List recent_, frequent_;  // LRU: recent_ only; front = least recently used
  int64_t recent_bytes_ = 0, frequent_bytes_ = 0;
  int64_t target_recent_ = 0;  // ARC's p: the bytes the recency list aims for
  Ghost recent_ghost_, frequent_ghost_;
  std::unordered_map<uint64_t, Slot> where_;
};

}  // namespace revolta
