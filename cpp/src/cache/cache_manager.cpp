#include "cache/cache_manager.h"

#include <algorithm>

namespace revolta {

KvCacheManager::KvCacheManager(int32_t num_blocks, int32_t block_size, bool prefix)
    : pool_(num_blocks, block_size, prefix) {}

int32_t KvCacheManager::match_prefix(Request& r) {
  if (!pool_.prefix_caching() || r.num_computed_tokens != 0 || !r.block_table.empty()) return 0;
  const int32_t bs = pool_.block_size();
  const int32_t max_blocks = (r.num_tokens() - 1) / bs;
  uint64_t parent = 0;
  for (int32_t i = 0; i < max_blocks; ++i) {
    const int32_t* toks = r.tokens.data() + size_t(i) * size_t(bs);
    uint64_t h = BlockPool::hash_block(parent, toks, bs);
    int32_t b = pool_.lookup(h, parent, toks);
    if (b < 0) break;
    pool_.acquire(b);
    r.block_table.push_back(b);
    r.block_hashes.push_back(h);
    parent = h;
  }
  const int32_t hit = int32_t(r.block_table.size()) * bs;
  queries_ += r.num_tokens();
  hits_ += hit;
  r.num_computed_tokens = hit;
  return hit;
}

bool KvCacheManager::allocate_slots(Request& r, int32_t num_new_tokens) {
  const int32_t bs = pool_.block_size();
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
  const size_t full = size_t(r.num_computed_tokens / bs);
  for (size_t i = r.block_hashes.size(); i < full; ++i) {
    uint64_t parent = i ? r.block_hashes[i - 1] : 0;
    const int32_t* toks = r.tokens.data() + i * size_t(bs);
    uint64_t h = BlockPool::hash_block(parent, toks, bs);
    pool_.register_block(r.block_table[i], h, parent, toks);
    r.block_hashes.push_back(h);
  }
}

void KvCacheManager::free(Request& r) {
  std::vector<int32_t> reversed(r.block_table.rbegin(), r.block_table.rend());
  pool_.release(reversed);
  r.block_table.clear();
  r.block_hashes.clear();
}

}  // namespace revolta
