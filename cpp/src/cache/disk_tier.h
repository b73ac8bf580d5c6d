// The disk tier of the KV offload (cache/kv_tiers.h): one file per entry under
// root_dir/<fingerprint>/, written by a background thread (a temporary name, then renamed, so a
// reader never sees half a file), evicted oldest first past max_size_bytes, and not written when
// the file system would keep less than min_free_bytes free. Every file starts with a header (magic,
// format version, the engine's fingerprint: model, cache format, block size, ranks; the key, the
// sizes) and a checksum over header, tokens and bytes; a file that fails any check is a miss, and
// is removed. The hash seed of the prefix chain is kept beside the files (hash_seed), so that
// blocks hashed before a restart are found after it.
#pragma once

#include <condition_variable>
#include <cstdint>
#include <deque>
#include <list>
#include <mutex>
#include <string>
#include <thread>
#include <unordered_map>

#include "cache/host_tier.h"

namespace revolta {

struct DiskTierConfig {
  std::string root_dir;
  int64_t max_size_bytes = 0;
  int64_t min_free_bytes = 0;
};

struct DiskTierStats {
  int64_t files = 0, bytes = 0;  // held now
  int64_t bytes_written = 0, bytes_read = 0;
  int64_t rejected = 0;       // files that failed a check (corrupt, truncated, another engine's)
  int64_t write_skips = 0;    // writes not made: the disk was short of min_free_bytes, or a write failed
};

uint64_t checksum64(const void* data, size_t n, uint64_t seed = 0);

class DiskTier {
 public:
  DiskTier(const DiskTierConfig& cfg, uint64_t fingerprint);
  ~DiskTier();
  DiskTier(const DiskTier&) = delete;
  DiskTier& operator=(const DiskTier&) = delete;

  uint64_t seed() const { return seed_; }
  const std::string& dir() const { return dir_; }
  bool contains(uint64_t key) const;
  // The entry read back and checked; null when it is absent or fails a check (the file goes).
  TierEntryPtr read(uint64_t key);
  // Queued for the writer thread (skipped when its queue already holds max_size_bytes).
  void write_later(TierEntryPtr e);
  // Returns once every queued write is done (tests, shutdown).
  void flush();
  DiskTierStats stats() const;
  std::string path_of(uint64_t key) const;

 private:
  void writer();
  bool write_now(const TierEntry& e);
  void forget(uint64_t key);  // drops the index entry and the file (mu_ held)
  void evict_to(int64_t bytes);  // (mu_ held)
  int64_t free_bytes() const;

  DiskTierConfig cfg_;
  uint64_t fingerprint_, seed_ = 0;
  std::string dir_;
  mutable std::mutex mu_;
  std::condition_variable cv_, idle_cv_;
  std::deque<TierEntryPtr> queue_;
  int64_t queued_bytes_ = 0;
  bool busy_ = false, stop_ = false;
  // Index: key -> size, oldest use first.
  std::list<std::pair<uint64_t, int64_t>> order_;
  std::unordered_map<uint64_t, std::list<std::pair<uint64_t, int64_t>>::iterator> index_;
  DiskTierStats stats_;
  std::thread thread_;
};

}  // namespace revolta
