#include "runtime/encoder_cache.h"

namespace revolta {

std::shared_ptr<const Tensor> EncoderCache::get(const std::string& hash) {
  auto it = index_.find(hash);
  if (it == index_.end()) {
    ++misses_;
    return nullptr;
  }
  ++hits_;
  lru_.splice(lru_.begin(), lru_, it->second);
  return it->second->second;
}

void EncoderCache::put(const std::string& hash, std::shared_ptr<const Tensor> output) {
  if (index_.count(hash)) return;
  const int64_t size = int64_t(output->nbytes());
  if (size > capacity_) return;
  lru_.emplace_front(hash, std::move(output));
  index_[hash] = lru_.begin();
  bytes_ += size;
  while (bytes_ > capacity_) {
    bytes_ -= int64_t(lru_.back().second->nbytes());
    index_.erase(lru_.back().first);
    lru_.pop_back();
  }
}

void EncoderCache::clear() {
  lru_.clear();
  index_.clear();
  bytes_ = 0;
}

}  // namespace revolta
