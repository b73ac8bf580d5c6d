// Encoder outputs by media hash, least recently used first out once they pass the byte budget. A
// request holds the outputs of its media until its prompt has read them, so an eviction never
// takes what a running prefill still needs; the cache only decides what a later request finds.
#pragma once

#include <cstdint>
#include <list>
#include <memory>
#include <string>
#include <unordered_map>

#include "core/tensor.h"

namespace revolta {

class EncoderCache {
 public:
  explicit EncoderCache(int64_t capacity_bytes) : capacity_(capacity_bytes) {}
  // The output cached under `hash` (null when none), now the most recently used.
  std::shared_ptr<const Tensor> get(const std::string& hash);
  bool contains(const std::string& hash) const { return index_.count(hash) > 0; }
  void put(const std::string& hash, std::shared_ptr<const Tensor> output);
  void clear();
  int64_t bytes() const { return bytes_; }
  int64_t hits() const { return hits_; }
  int64_t misses() const { return misses_; }

 private:
  using Entry = std::pair<std::string, std::shared_ptr<const Tensor>>;
  int64_t capacity_;
  int64_t bytes_ = 0, hits_ = 0, misses_ = 0;
  std::list<Entry> lru_;  // most recent first
  std::unordered_map<std::string, std::list<Entry>::iterator> index_;
};

}  // namespace revolta
