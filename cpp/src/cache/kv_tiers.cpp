#include "cache/kv_tiers.h"

#include <algorithm>
#include <cstring>
#include <random>

#include "core/device_runtime.h"
#include "core/error.h"

namespace revolta {
namespace {

// The pieces of one block (or state slot) of a rank, in entry order: device address and bytes.
template <typename F>
void for_each_piece(KvCache& kv, int32_t block, F&& f) {
  for (size_t l = 0; l < kv.k.size(); ++l) {
    for (Tensor* t : {&kv.k[l], &kv.v[l]}) {
      const size_t n = t->nbytes() / size_t(kv.num_blocks);
      f(static_cast<uint8_t*>(t->data()) + n * size_t(block), n);
    }
    if (l < kv.quant.size() && kv.quant[l].k_rows.defined())
      for (Tensor* t : {&kv.quant[l].k_rows, &kv.quant[l].v_rows}) {
        const size_t n = t->nbytes() / size_t(kv.num_blocks);
        f(static_cast<uint8_t*>(t->data()) + n * size_t(block), n);
      }
  }
  for (Tensor& t : kv.rows) {
    const size_t n = t.nbytes() / size_t(kv.num_blocks);
    f(static_cast<uint8_t*>(t.data()) + n * size_t(block), n);
  }
}

template <typename F>
void for_each_piece(StateCache& s, int32_t slot, F&& f) {
  for (size_t l = 0; l < s.conv.size(); ++l) {
    Tensor c = s.conv_slot(l, slot), m = s.ssm_slot(l, slot);
    f(static_cast<uint8_t*>(c.data()), c.nbytes());
    f(static_cast<uint8_t*>(m.data()), m.nbytes());
  }
  for (size_t b = 0; b < s.buffers.size(); ++b) {
    Tensor t = s.buffer_slot(b, slot);
    f(static_cast<uint8_t*>(t.data()), t.nbytes());
  }
}

}  // namespace

int64_t kv_block_bytes(const KvCache& kv) {
  int64_t n = 0;
  for_each_piece(const_cast<KvCache&>(kv), 0, [&](uint8_t*, size_t b) { n += int64_t(b); });
  return n;
}

int64_t state_slot_bytes(const StateCache* states) {
  if (!states) return 0;
  int64_t n = 0;
  for_each_piece(const_cast<StateCache&>(*states), 0, [&](uint8_t*, size_t b) { n += int64_t(b); });
  return n;
}

std::unique_ptr<PendingCopy> run_transfers(const std::vector<BlockTransfer>& transfers, KvCache& kv,
                                           StateCache* states, int rank) {
  const Device dev = !kv.k.empty() ? kv.k[0].device() : !kv.rows.empty() ? kv.rows[0].device()
                                                      : states ? states->device : Device::kCPU;
  const int64_t block_share = kv_block_bytes(kv), state_share = state_slot_bytes(states);
  std::vector<CopyPiece> saves, loads;
  for (const BlockTransfer& t : transfers) {
    const bool block = t.kind == BlockTransfer::Kind::kSaveBlock || t.kind == BlockTransfer::Kind::kLoadBlock;
    const bool save = is_save(t);
    uint8_t* at = t.entry->bytes.data() + size_t(rank) * size_t(block ? block_share : state_share);
    auto piece = [&](uint8_t* device, size_t n) {
      (save ? saves : loads).push_back({at, device, n});
      at += n;
    };
    if (block) for_each_piece(kv, t.index, piece);
    else {
      RV_CHECK(states, "a state transfer for a model without recurrent state");
      for_each_piece(*states, t.index, piece);
    }
  }
  // Saves first: a block saved and then handed to a load in the same list is read before it is written.
  if (dev == Device::kCPU) {
    for (const CopyPiece& p : saves) std::memcpy(p.host, p.device, p.bytes);
    for (const CopyPiece& p : loads) std::memcpy(p.device, p.host, p.bytes);
    return nullptr;
  }
  DeviceRuntime& rt = device_runtime(dev);
  std::unique_ptr<PendingCopy> pending = saves.empty() ? nullptr : rt.download_pieces(saves);
  if (!loads.empty()) rt.upload_pieces(loads);
  return pending;
}

KvTiers::KvTiers(const KvTierConfig& cfg, uint64_t fingerprint, int world, int64_t block_bytes, int64_t state_bytes)
    : world_(world), block_bytes_(block_bytes), state_bytes_(state_bytes) {
  host_ = std::make_unique<HostTier>(cfg.host_bytes, cfg.eviction);
  if (!cfg.disk.root_dir.empty()) disk_ = std::make_unique<DiskTier>(cfg.disk, fingerprint);
  std::random_device rd;
  seed_ = disk_ ? disk_->seed() : (uint64_t(rd()) << 32) ^ rd();
  const unsigned readers = disk_ ? std::clamp(std::thread::hardware_concurrency() / 2, 1u, 4u) : 0u;
  for (unsigned i = 0; i < readers; ++i) readers_.emplace_back([this] { reader(); });
}

KvTiers::~KvTiers() {
  {
    std::lock_guard<std::mutex> lk(mu_);
    stop_ = true;
  }
  read_cv_.notify_all();
  for (std::thread& t : readers_) t.join();
}

bool KvTiers::has(uint64_t key) const {
  {
    std::lock_guard<std::mutex> lk(mu_);
    if (host_->contains(key) || reading_.count(key)) return true;
  }
  return disk_ && disk_->contains(key);
}

std::shared_ptr<TierReads> KvTiers::prefetch(const std::vector<uint64_t>& keys) {
  if (!disk_) return nullptr;
  auto reads = std::make_shared<TierReads>();
  {
    std::lock_guard<std::mutex> lk(mu_);
    for (uint64_t k : keys) {
      if (host_->contains(k) || reading_.count(k) || !disk_->contains(k)) continue;
      reading_.insert(k);
      to_read_.emplace_back(k, reads);
      ++reads->queued;
    }
    reads->left = reads->queued;
  }
  if (reads->queued == 0) return nullptr;
  read_cv_.notify_all();
  return reads;
}

void KvTiers::wait_for_reads(int milliseconds) {
  std::unique_lock<std::mutex> lk(mu_);
  if (!reading_.empty()) landed_cv_.wait_for(lk, std::chrono::milliseconds(milliseconds));
}

void KvTiers::reader() {
  std::unique_lock<std::mutex> lk(mu_);
  for (;;) {
    read_cv_.wait(lk, [&] { return stop_ || !to_read_.empty(); });
    if (stop_) return;
    const auto [key, reads] = to_read_.front();
    to_read_.pop_front();
    lk.unlock();
    TierEntryPtr e = disk_->read(key);  // checked; null: a miss (the file is gone or damaged)
    lk.lock();
    if (e) {
      host_->put(e);
      prefetched_.insert(key);
    }
    reading_.erase(key);
    // The engine waits for whole prefixes: woken once a request's reads are all in.
    if (reads->left.fetch_sub(1) == 1) landed_cv_.notify_all();
  }
}

TierEntryPtr KvTiers::fetch(uint64_t key) {
  std::unique_lock<std::mutex> lk(mu_);
  landed_cv_.wait(lk, [&] { return !reading_.count(key); });  // a read in flight: its result (woken per prefix)
  if (TierEntryPtr e = host_->get(key)) {
    ++(prefetched_.erase(key) ? stats_.disk_hits : stats_.host_hits);
    return e;
  }
  if (!disk_) return nullptr;
  lk.unlock();
  TierEntryPtr e = disk_->read(key);
  lk.lock();
  if (!e) return nullptr;
  ++stats_.disk_hits;
  host_->put(e);
  return e;
}

TierEntryPtr KvTiers::fetch_block(uint64_t key, uint64_t parent, const int32_t* tokens, int32_t n) {
  if (!has(key)) return nullptr;
  TierEntryPtr e = fetch(key);
  // Exact: the same chain and tokens (a hash alone could collide), and an entry of this layout.
  if (!e || e->parent != parent || e->tokens.size() != size_t(n) || !std::equal(tokens, tokens + n, e->tokens.begin()) ||
      int64_t(e->bytes.size()) != block_bytes_)
    return nullptr;
  return e;
}

TierEntryPtr KvTiers::fetch_state(uint64_t key) {
  if (!has(key)) return nullptr;
  TierEntryPtr e = fetch(key);
  return e && int64_t(e->bytes.size()) == state_bytes_ ? e : nullptr;
}

TierEntryPtr KvTiers::new_block(uint64_t key, uint64_t parent, const int32_t* tokens, int32_t n) const {
  auto e = std::make_shared<TierEntry>();
  e->key = key, e->parent = parent;
  e->tokens.assign(tokens, tokens + n);
  e->bytes.resize(size_t(block_bytes_));
  return e;
}

TierEntryPtr KvTiers::new_state(uint64_t key) const {
  auto e = std::make_shared<TierEntry>();
  e->key = key;
  e->bytes.resize(size_t(state_bytes_));
  return e;
}

void KvTiers::finish(const std::vector<BlockTransfer>& transfers) {
  std::lock_guard<std::mutex> lk(mu_);
  for (const BlockTransfer& t : transfers) {
    const bool save = is_save(t);
    (save ? stats_.bytes_offloaded : stats_.bytes_restored) += int64_t(t.entry->bytes.size());
    if (!save) continue;
    host_->put(t.entry);
    if (disk_) disk_->write_later(t.entry);
  }
}

void KvTiers::flush() {
  if (disk_) disk_->flush();
}

KvTierStats KvTiers::stats() const {
  std::lock_guard<std::mutex> lk(mu_);
  KvTierStats s = stats_;
  s.host_entries = int64_t(host_->size());
  s.host_bytes = host_->used_bytes();
  if (disk_) s.disk = disk_->stats();
  return s;
}

}  // namespace revolta
