#include "cache/block_pool.h"

#include <algorithm>

#include "core/error.h"

namespace revolta {

BlockPool::BlockPool(int32_t num_blocks, int32_t block_size, bool enable_prefix_caching)
    : num_blocks_(num_blocks),
      block_size_(block_size),
      prefix_caching_(enable_prefix_caching),
      meta_(size_t(num_blocks)),
      tokens_(enable_prefix_caching ? size_t(num_blocks) * size_t(block_size) : 0) {
  for (int32_t b = 0; b < num_blocks; ++b) push_free_back(b);
}

void BlockPool::push_free_back(int32_t b) {
  BlockMeta& m = meta_[size_t(b)];
  m.prev = free_tail_;
  m.next = -1;
  m.in_free = true;
  if (free_tail_ >= 0) meta_[size_t(free_tail_)].next = b;
  else free_head_ = b;
  free_tail_ = b;
  ++num_free_;
}

void BlockPool::unlink_free(int32_t b) {
  BlockMeta& m = meta_[size_t(b)];
  if (!m.in_free) return;
  if (m.prev >= 0) meta_[size_t(m.prev)].next = m.next;
  else free_head_ = m.next;
  if (m.next >= 0) meta_[size_t(m.next)].prev = m.prev;
  else free_tail_ = m.prev;
  m.prev = m.next = -1;
  m.in_free = false;
  --num_free_;
}

void BlockPool::evict(int32_t b) {
  BlockMeta& m = meta_[size_t(b)];
  if (!m.cached) return;
  auto it = cached_.find(m.hash);
  if (it != cached_.end() && it->second == b) cached_.erase(it);
  m.cached = false;
}

int32_t BlockPool::drop_unused_cache() {
  int32_t n = 0;
  for (int32_t b = 0; b < num_blocks_; ++b)
    if (meta_[size_t(b)].ref == 0 && meta_[size_t(b)].cached) {
      evict(b);
      ++n;
    }
  return n;
}

std::optional<std::vector<int32_t>> BlockPool::allocate(int32_t n) {
  if (n > num_free_) return std::nullopt;
  std::vector<int32_t> out;
  out.reserve(size_t(n));
  for (int32_t i = 0; i < n; ++i) {
    int32_t b = free_head_;
    unlink_free(b);
    evict(b);
    meta_[size_t(b)].ref = 1;
    out.push_back(b);
  }
  return out;
}

void BlockPool::release(const std::vector<int32_t>& blocks) {
  for (int32_t b : blocks) {
    BlockMeta& m = meta_[size_t(b)];
    RV_CHECK(m.ref > 0, "block ", b, " released more often than acquired");
    if (--m.ref == 0) push_free_back(b);
  }
}

void BlockPool::acquire(int32_t b) {
  BlockMeta& m = meta_[size_t(b)];
  if (m.ref == 0) unlink_free(b);
  ++m.ref;
}

uint64_t BlockPool::hash_block(uint64_t parent, const int32_t* tokens, int32_t n) {
  // splitmix64-style mixing of each token into the running state.
  uint64_t h = parent ^ 0x9e3779b97f4a7c15ull;
  for (int32_t i = 0; i < n; ++i) {
    h ^= uint64_t(uint32_t(tokens[i])) + 0x9e3779b97f4a7c15ull + (h << 6) + (h >> 2);
    h ^= h >> 30;
    h *= 0xbf58476d1ce4e5b9ull;
    h ^= h >> 27;
    h *= 0x94d049bb133111ebull;
    h ^= h >> 31;
  }
  return h;
}

int32_t BlockPool::lookup(uint64_t hash, uint64_t parent_hash, const int32_t* tokens) const {
  if (!prefix_caching_) return -1;
  auto it = cached_.find(hash);
  if (it == cached_.end()) return -1;
  const BlockMeta& m = meta_[size_t(it->second)];
  const int32_t* stored = tokens_.data() + size_t(it->second) * size_t(block_size_);
  if (m.parent_hash != parent_hash || !std::equal(stored, stored + block_size_, tokens)) return -1;
  return it->second;
}

void BlockPool::register_block(int32_t b, uint64_t hash, uint64_t parent_hash,
                               const int32_t* tokens) {
  if (!prefix_caching_ || cached_.count(hash)) return;
  BlockMeta& m = meta_[size_t(b)];
  m.cached = true;
  m.hash = hash;
  m.parent_hash = parent_hash;
  std::copy(tokens, tokens + block_size_, tokens_.data() + size_t(b) * size_t(block_size_));
  cached_[hash] = b;
}

}  // namespace revolta
