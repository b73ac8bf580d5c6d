// The KV offload tiers: the host tier's LRU and ARC eviction, the disk tier's files (round trip,
// checks that turn corrupt, truncated or foreign files into misses, size limits, the seed kept
// across reopening), and the cache manager's write-through and bring-back decisions.
#include <filesystem>
#include <fstream>
#include <random>

#include "cache/cache_manager.h"
#include "cache/disk_tier.h"
#include "cache/host_tier.h"
#include "cache/kv_tiers.h"
#include "expect.h"

using namespace revolta;
namespace fs = std::filesystem;

namespace {

TierEntryPtr entry(uint64_t key, size_t bytes = 100) {
  auto e = std::make_shared<TierEntry>();
  e->key = key, e->parent = key * 7;
  e->tokens = {int32_t(key), 2, 3};
  e->bytes.resize(bytes);
  for (size_t i = 0; i < bytes; ++i) e->bytes[i] = uint8_t(key * 31 + i);
  return e;
}

void test_lru_evicts_least_recently_used() {
  HostTier t(3 * 112, TierEviction::kLru);  // three entries of 100 bytes + 3 tokens
  for (uint64_t k : {1, 2, 3}) t.put(entry(k));
  EXPECT(t.get(1) != nullptr);
  t.put(entry(4));
  EXPECT(t.contains(1) && !t.contains(2) && t.contains(3) && t.contains(4) && t.used_bytes() == 3 * 112);
  t.put(entry(5, 1000));  // larger than the whole tier: not kept, nothing evicted
  EXPECT(!t.contains(5) && t.size() == 3);
}

// Two keys used twice, then a scan of ten keys used once: ARC keeps the two, LRU loses them.
void test_arc_resists_a_scan() {
  for (TierEviction policy : {TierEviction::kLru, TierEviction::kArc}) {
    HostTier t(4 * 112, policy);
    for (uint64_t k : {1, 2}) t.put(entry(k));
    for (uint64_t k : {1, 2}) t.get(k);
    for (uint64_t k = 10; k < 20; ++k) t.put(entry(k));
    const bool kept = t.contains(1) && t.contains(2);
    EXPECT(kept == (policy == TierEviction::kArc));
    EXPECT(t.used_bytes() <= 4 * 112 && t.contains(19));
  }
}

std::string fresh_dir(const std::string& name) {
  const fs::path p = fs::temp_directory_path() / ("revolta_tier_test_" + name + "_" + std::to_string(std::random_device{}()));
  fs::remove_all(p);
  return p.string();
}

void test_disk_round_trip_seed_and_limits() {
  const std::string root = fresh_dir("round");
  uint64_t seed = 0;
  {
    DiskTier d({root, 1 << 20, 0}, 42);
    seed = d.seed();
    d.write_later(entry(5));
    d.flush();
    EXPECT(d.contains(5) && d.stats().files == 1 && d.stats().bytes_written > 100);
    TierEntryPtr back = d.read(5);
    EXPECT(back && back->bytes == entry(5)->bytes && back->tokens == entry(5)->tokens && back->parent == 35);
  }
  {
    DiskTier again({root, 1 << 20, 0}, 42);  // reopened: the same seed, the file indexed
    EXPECT(again.seed() == seed && again.contains(5) && again.read(5) != nullptr);
    DiskTier other({root, 1 << 20, 0}, 43);  // another engine's fingerprint: its own directory
    EXPECT(!other.contains(5) && other.dir() != again.dir());
  }
  {
    DiskTier small({root, 3 * 300, 0}, 44);  // room for five files of 176 bytes: the oldest goes
    for (uint64_t k = 1; k <= 6; ++k) small.write_later(entry(k));
    small.flush();
    EXPECT(small.stats().files == 5 && !small.contains(1) && small.contains(6) && small.stats().bytes <= 3 * 300);
    DiskTier full({root, 1 << 20, int64_t(1) << 60}, 45);  // min_free_bytes beyond any disk: no writes
    full.write_later(entry(1));
    full.flush();
    EXPECT(!full.contains(1) && full.stats().write_skips == 1);
  }
  fs::remove_all(root);
}

void test_disk_rejects_damaged_files() {
  const std::string root = fresh_dir("damage");
  DiskTier d({root, 1 << 20, 0}, 7);
  for (uint64_t k : {1, 2, 3, 4}) d.write_later(entry(k));
  d.flush();
  {  // 1: a flipped byte in the values
    std::fstream f(d.path_of(1), std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(-10, std::ios::end);
    f.put('\x5a');
  }
  fs::resize_file(d.path_of(2), fs::file_size(d.path_of(2)) - 7);  // 2: truncated
  {  // 3: another engine's file under this key's name
    DiskTier foreign({root, 1 << 20, 0}, 8);
    foreign.write_later(entry(3));
    foreign.flush();
    fs::copy_file(foreign.path_of(3), d.path_of(3), fs::copy_options::overwrite_existing);
  }
  EXPECT(d.read(1) == nullptr && d.read(2) == nullptr && d.read(3) == nullptr);
  EXPECT(d.stats().rejected == 3 && !fs::exists(d.path_of(1)) && !d.contains(2));
  EXPECT(d.read(4) != nullptr && d.read(4)->bytes == entry(4)->bytes);  // the sound one still reads
  fs::remove_all(root);
}

std::unique_ptr<Request> request(uint64_t id, int32_t n, int32_t first_token) {
  auto r = std::make_unique<Request>();
  r->id = id;
  for (int32_t i = 0; i < n; ++i) r->tokens.push_back(first_token + i);
  r->num_prompt_tokens = n;
  return r;
}

// A request of 13 tokens (tokens 100..) computed: its 3 full blocks are saved to the tiers.
std::unique_ptr<Request> write_through_13_tokens(KvCacheManager& m, KvTiers& tiers, KvCache& kv) {
  auto a = request(1, 13, 100);
  EXPECT(m.allocate_slots(*a, 13));
  a->num_computed_tokens = 13;
  m.cache_full_blocks(*a);
  const auto saves = m.take_transfers();
  EXPECT(saves.size() == 3 && saves[0].kind == BlockTransfer::Kind::kSaveBlock);
  EXPECT(run_transfers(saves, kv, nullptr, 0) == nullptr);  // the CPU copies at once
  tiers.finish(saves);
  return a;
}

// Full blocks are written through; a match past the evicted device blocks comes back from the tier.
void test_manager_writes_through_and_brings_back() {
  KvCache kv({1, 1, 2, DType::kF32}, 4, 4);  // 4 blocks of 4 tokens, 32 bytes a block
  KvTiers tiers({1 << 20, TierEviction::kLru, {}}, 1, 1, kv_block_bytes(kv), 0);
  KvCacheManager m(4, 4, true);
  m.set_tiers(&tiers);
  auto a = write_through_13_tokens(m, tiers, kv);
  m.free(*a);
  auto b = request(2, 16, 500);  // takes every block: a's are evicted from the device pool
  EXPECT(m.allocate_slots(*b, 16));
  m.free(*b);
  auto again = request(3, 13, 100);
  EXPECT(m.match_prefix(*again) == 12 && m.tier_hits() == 12);
  const auto loads = m.take_transfers();
  EXPECT(loads.size() == 3 && loads[2].kind == BlockTransfer::Kind::kLoadBlock);
  EXPECT(tiers.stats().host_hits == 3);
}

// A restarted engine's request: its prefix's blocks, on disk only, are read by the reader thread
// while the scheduler would pass the request over; the match then finds them in host memory and
// counts them as disk hits.
void test_disk_reads_ahead_of_the_match() {
  const std::string root = fresh_dir("prefetch");
  KvCache kv({1, 1, 2, DType::kF32}, 4, 4);
  const KvTierConfig cfg{1 << 20, TierEviction::kLru, {root, 1 << 20, 0}};
  {
    KvTiers tiers(cfg, 9, 1, kv_block_bytes(kv), 0);
    KvCacheManager m(4, 4, true);
    m.set_tiers(&tiers);
    write_through_13_tokens(m, tiers, kv);
    tiers.flush();
  }
  KvTiers tiers(cfg, 9, 1, kv_block_bytes(kv), 0);  // restarted: the same seed, the files indexed
  KvCacheManager m(4, 4, true);
  m.set_tiers(&tiers);
  auto again = request(3, 13, 100);
  m.prefetch(*again);
  EXPECT(again->tier_reads && again->tier_reads->queued == 3);
  for (int i = 0; i < 2000 && m.kv_loading(*again); ++i) tiers.wait_for_reads(5);
  EXPECT(!m.kv_loading(*again) && !again->tier_reads && tiers.stats().host_entries == 3);
  EXPECT(tiers.stats().disk.bytes_read > 0 && tiers.stats().disk_hits == 0);  // read, not yet used
  EXPECT(m.match_prefix(*again) == 12 && m.tier_hits() == 12);
  EXPECT(tiers.stats().disk_hits == 3 && tiers.stats().host_hits == 0);
  auto other = request(4, 13, 300);  // nothing of it on disk: nothing to read
  m.prefetch(*other);
  EXPECT(!other->tier_reads && !m.kv_loading(*other));
}

}  // namespace

void run_kv_tier_tests() {
  test_lru_evicts_least_recently_used();
  test_arc_resists_a_scan();
  test_disk_round_trip_seed_and_limits();
  test_disk_rejects_damaged_files();
  test_manager_writes_through_and_brings_back();
  test_disk_reads_ahead_of_the_match();
}
