#include "cache/host_tier.h"

#include <algorithm>

#include "core/error.h"

namespace revolta {

TierEviction parse_tier_eviction(const std::string& name) {
  if (name == "lru") return TierEviction::kLru;
  if (name == "arc") return TierEviction::kArc;
  throw std::invalid_argument("kv_offloading_eviction must be lru or arc, got '" + name + "'");
}

HostTier::HostTier(int64_t capacity, TierEviction policy) : capacity_(capacity), policy_(policy) {}

bool HostTier::Ghost::take(uint64_t key) {
  auto it = at.find(key);
  if (it == at.end()) return false;
  bytes -= it->second->second;
  order.erase(it->second);
  at.erase(it);
  return true;
}

void HostTier::Ghost::add(uint64_t key, int64_t size) {
  take(key);
  order.emplace_back(key, size);
  at[key] = std::prev(order.end());
  bytes += size;
}

void HostTier::Ghost::trim(int64_t limit) {
  while (bytes > limit && !order.empty()) {
    bytes -= order.front().second;
    at.erase(order.front().first);
    order.pop_front();
  }
}

TierEntryPtr HostTier::get(uint64_t key) {
  auto it = where_.find(key);
  if (it == where_.end()) return nullptr;
  Slot& s = it->second;
  TierEntryPtr e = *s.it;
  // LRU: to the back of its one list; ARC: a second use moves it to the frequency list.
  List& to = policy_ == TierEviction::kArc ? frequent_ : recent_;
  if (s.list == &recent_ && &to == &frequent_) recent_bytes_ -= size_of(*e), frequent_bytes_ += size_of(*e);
  to.splice(to.end(), *s.list, s.it);
  s.list = &to;
  return e;
}

void HostTier::evict_one(bool from_recent) {
  List& l = from_recent ? recent_ : frequent_;
  const TierEntryPtr e = l.front();
  const int64_t sz = size_of(*e);
  (from_recent ? recent_bytes_ : frequent_bytes_) -= sz;
  used_ -= sz;
  where_.erase(e->key);
  l.pop_front();
  if (policy_ == TierEviction::kArc) (from_recent ? recent_ghost_ : frequent_ghost_).add(e->key, sz);
}

void HostTier::make_room(int64_t need, bool hit_in_frequent_ghost) {
  while (used_ + need > capacity_ && (!recent_.empty() || !frequent_.empty())) {
    const bool recent_first = !recent_.empty() && (frequent_.empty() || recent_bytes_ > target_recent_ ||
                                                   (hit_in_frequent_ghost && recent_bytes_ == target_recent_));
    evict_one(recent_first);
  }
}

void HostTier::put(TierEntryPtr e) {
  const int64_t sz = size_of(*e);
  if (where_.count(e->key)) {  // the same block again: its bytes are the same; count a use
    get(e->key);
    return;
  }
  if (sz > capacity_) return;
  List* into = &recent_;
  if (policy_ == TierEviction::kArc) {
    // A key evicted lately comes back: the list it left deserved more room.
    const int64_t rg = recent_ghost_.bytes, fg = frequent_ghost_.bytes;
    if (recent_ghost_.take(e->key)) {
      target_recent_ = std::min(capacity_, target_recent_ + sz * std::max<int64_t>(1, fg / std::max<int64_t>(1, rg)));
      make_room(sz, false);
      into = &frequent_;
    } else if (frequent_ghost_.take(e->key)) {
      target_recent_ = std::max<int64_t>(0, target_recent_ - sz * std::max<int64_t>(1, rg / std::max<int64_t>(1, fg)));
      make_room(sz, true);
      into = &frequent_;
    } else {
      make_room(sz, false);
    }
    recent_ghost_.trim(capacity_);
    frequent_ghost_.trim(capacity_);
  } else {
    make_room(sz, false);
  }
  into->push_back(e);
  (into == &recent_ ? recent_bytes_ : frequent_bytes_) += sz;
  used_ += sz;
  where_[e->key] = Slot{into, std::prev(into->end())};
}

}  // namespace revolta
