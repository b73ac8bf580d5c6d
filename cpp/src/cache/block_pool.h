// The block pool: fixed-size KV blocks with reference counts and prefix caching.
//
// A full block can be registered under the hash of (parent block hash, its tokens). A block whose
// reference count drops to zero keeps its contents and hash and waits in an LRU free queue; it is
// either revived by a prefix hit or, when it reaches the front, evicted and reused.
#pragma once

#include <cstdint>
#include <optional>
#include <unordered_map>
#include <vector>

namespace revolta {

class BlockPool {
 public:
  BlockPool(int32_t num_blocks, int32_t block_size, bool enable_prefix_caching);

  int32_t num_blocks() const { return num_blocks_; }
  int32_t block_size() const { return block_size_; }
  // Blocks with no references (including evictable cached ones).
  int32_t num_free() const { return num_free_; }
  bool prefix_caching() const { return prefix_caching_; }

  // Takes n blocks from the front of the free queue (evicting their hashes), refcount 1 each.
  // Returns nullopt (and takes nothing) when fewer than n are free.
  std::optional<std::vector<int32_t>> allocate(int32_t n);
  // Drops one reference from each block; blocks reaching zero go to the back of the free queue
  // in the given order (callers pass tail blocks first so they are evicted first).
  void release(const std::vector<int32_t>& blocks);
  // Adds a reference to a block found by lookup(), reviving it from the free queue if needed.
  void acquire(int32_t block);

  // Chained hash of a full block.
  static uint64_t hash_block(uint64_t parent_hash, const int32_t* tokens, int32_t n);
  // Finds a cached block whose parent hash and tokens match exactly (hash collisions cannot
  // alias because the tokens are compared); -1 when absent.
  int32_t lookup(uint64_t hash, uint64_t parent_hash, const int32_t* tokens) const;
  // Registers a full, referenced block under hash. A second block with the same contents is not
  // registered (the first one stays canonical).
  void register_block(int32_t block, uint64_t hash, uint64_t parent_hash, const int32_t* tokens);
  // Forgets the hashes of every cached block no request holds (reset_prefix_cache); returns how many.
  int32_t drop_unused_cache();

 private:
  struct BlockMeta {
    int32_t ref = 0;
    bool cached = false;
    uint64_t hash = 0, parent_hash = 0;
    int32_t prev = -1, next = -1;  // free-queue links
    bool in_free = false;
  };
  void push_free_back(int32_t b);
  void unlink_free(int32_t b);
  void evict(int32_t b);

  int32_t num_blocks_, block_size_;
  bool prefix_caching_;
  std::vector<BlockMeta> meta_;
  std::vector<int32_t> tokens_;  // block_size tokens per block, for exact hit checks
  int32_t free_head_ = -1, free_tail_ = -1, num_free_ = 0;
  std::unordered_map<uint64_t, int32_t> cached_;
};

}  // namespace revolta
