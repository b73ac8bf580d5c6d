// KV offload tiers below the device pool (as vLLM's offloading connector and LMCache do it): every
// full KV block registered for prefix hits is also written through to a host-memory tier
// (cache/host_tier.h, kv_offloading_size bytes, LRU or ARC) and from there, by a background
// thread, to a disk tier (cache/disk_tier.h). A prefix match that runs past the device pool goes
// on in the tiers: each block found is given a device block and brought back before the step's
// forward (BlockTransfer). Hybrid models' recurrent-state snapshots go along under their block's
// hash. Entries hold every tensor-parallel rank's shard (rank order); each rank copies its own.
#pragma once

#include <condition_variable>
#include <deque>
#include <memory>
#include <mutex>
#include <thread>
#include <unordered_set>
#include <vector>

#include "cache/disk_tier.h"
#include "cache/host_tier.h"
#include "cache/kv_cache.h"
#include "cache/state_cache.h"
#include "sched/request.h"
#include "core/device_runtime.h"

namespace revolta {

struct KvTierConfig {
  int64_t host_bytes = 0;
  TierEviction eviction = TierEviction::kLru;
  DiskTierConfig disk;  // root_dir empty: no disk tier
};

struct KvTierStats {
  int64_t host_hits = 0, disk_hits = 0;             // entries found in each tier (blocks and states)
  int64_t bytes_offloaded = 0, bytes_restored = 0;  // device -> host, host -> device
  int64_t host_entries = 0, host_bytes = 0;
  DiskTierStats disk;
};

// One copy between a device cache and a tier entry, run by every rank before a forward.
struct BlockTransfer {
  enum class Kind : uint8_t { kSaveBlock, kLoadBlock, kSaveState, kLoadState };
  Kind kind;
  int32_t index;  // the KV block, or the state slot
  TierEntryPtr entry;
};

inline bool is_save(const BlockTransfer& t) {
  return t.kind == BlockTransfer::Kind::kSaveBlock || t.kind == BlockTransfer::Kind::kSaveState;
}

// A rank's share of an entry: its KV block over every attention layer (K, V, and int8's row
// scales), or its recurrent state slot over every DeltaNet layer.
int64_t kv_block_bytes(const KvCache& kv);
int64_t state_slot_bytes(const StateCache* states);
// This rank's part of each transfer, queued in the device's work order as one batched copy each way:
// loads need nothing more (their entries may be dropped at once); the saves' entries hold their
// bytes once the returned copy is waited for (null: at once, as on the CPU).
std::unique_ptr<PendingCopy> run_transfers(const std::vector<BlockTransfer>& transfers, KvCache& kv,
                                           StateCache* states, int rank);

class KvTiers {
 public:
  // block_bytes / state_bytes: an entry's size over all ranks.
  KvTiers(const KvTierConfig& cfg, uint64_t fingerprint, int world, int64_t block_bytes, int64_t state_bytes);
  // Where the prefix-hash chain starts: the disk tier's stored seed, else a random one.
  uint64_t seed() const { return seed_; }
  static uint64_t state_key(uint64_t block_hash) { return block_hash ^ 0x5eed5a75eed5a75eull; }
  bool has(uint64_t key) const;
  // A block whose parent and tokens match exactly (host tier, else disk, brought into the host
  // tier); null: a miss. fetch_state: a snapshot's entry.
  TierEntryPtr fetch_block(uint64_t key, uint64_t parent, const int32_t* tokens, int32_t n);
  TierEntryPtr fetch_state(uint64_t key);
  TierEntryPtr new_block(uint64_t key, uint64_t parent, const int32_t* tokens, int32_t n) const;
  TierEntryPtr new_state(uint64_t key) const;
  // After every rank ran `transfers` (and their saves were waited for): the saved entries join the
  // tiers; counts bytes moved.
  void finish(const std::vector<BlockTransfer>& transfers);
  // Disk reads ahead of need: the keys that only the disk tier holds are read by background
  // threads into the host tier (a later fetch finds them there, counted as disk hits). Returns
  // their count and countdown (null: nothing to read).
  std::shared_ptr<TierReads> prefetch(const std::vector<uint64_t>& keys);
  void wait_for_reads(int milliseconds);  // until a prefetch's reads have all landed, or the time passes
  void flush();  // the disk tier's queued writes, done
  KvTierStats stats() const;
  int world() const { return world_; }
  ~KvTiers();

 private:
  TierEntryPtr fetch(uint64_t key);
  void reader();
  int world_;
  int64_t block_bytes_, state_bytes_;
  uint64_t seed_;
  // mu_ guards the host tier, the stats and the prefetch queue: the reader thread adds to them.
  mutable std::mutex mu_;
  std::condition_variable read_cv_, landed_cv_;
  std::unique_ptr<HostTier> host_;
  std::unique_ptr<DiskTier> disk_;
  KvTierStats stats_;
  std::deque<std::pair<uint64_t, std::shared_ptr<TierReads>>> to_read_;
  std::unordered_set<uint64_t> reading_;     // queued or being read
  std::unordered_set<uint64_t> prefetched_;  // in the host tier by a prefetch, not yet fetched
  bool stop_ = false;
  std::vector<std::thread> readers_;  // a few: a file's read and checksum take a core
};

}  // namespace revolta
