#include "cache/disk_tier.h"

#include <algorithm>
#include <cstddef>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <random>
#include <sstream>
#include <vector>

#include "core/error.h"

namespace revolta {
namespace fs = std::filesystem;

namespace {

constexpr char kMagic[8] = {'R', 'V', 'K', 'V', 'B', 'L', 'K', '1'};
constexpr uint32_t kVersion = 1;

struct FileHeader {
  char magic[8];
  uint32_t version, n_tokens;
  uint64_t fingerprint, key, parent, n_bytes;
  uint64_t body_checksum;    // tokens, then bytes
  uint64_t header_checksum;  // the fields above
};

uint64_t body_checksum(const TierEntry& e) {
  return checksum64(e.bytes.data(), e.bytes.size(), checksum64(e.tokens.data(), e.tokens.size() * 4));
}

std::string hex16(uint64_t v) {
  char buf[17];
  std::snprintf(buf, sizeof buf, "%016llx", static_cast<unsigned long long>(v));
  return buf;
}

// The seed file: "<seed> <its checksum>" in hex; any other content is replaced by a new seed.
uint64_t read_or_make_seed(const std::string& path) {
  std::ifstream in(path);
  std::string s, c;
  if (in >> s >> c && s.size() == 16 && c.size() == 16) {
    try {
      const uint64_t seed = std::stoull(s, nullptr, 16);
      if (std::stoull(c, nullptr, 16) == checksum64(&seed, 8)) return seed;
    } catch (const std::exception&) {
    }
  }
  std::random_device rd;
  const uint64_t seed = (uint64_t(rd()) << 32) ^ rd();
  const std::string tmp = path + ".tmp";
  std::ofstream(tmp) << hex16(seed) << " " << hex16(checksum64(&seed, 8)) << "\n";
  fs::rename(tmp, path);
  return seed;
}

}  // namespace

uint64_t checksum64(const void* data, size_t n, uint64_t seed) {
  const auto* p = static_cast<const uint8_t*>(data);
  uint64_t h = seed ^ (0x9e3779b97f4a7c15ull * (n + 1));
  auto mix = [&](uint64_t w) {
    h ^= w;
    h *= 0xbf58476d1ce4e5b9ull;
    h ^= h >> 31;
  };
  size_t i = 0;
  for (; i + 8 <= n; i += 8) {
    uint64_t w;
    std::memcpy(&w, p + i, 8);
    mix(w);
  }
  uint64_t tail = 0;
  for (size_t k = 0; i + k < n; ++k) tail |= uint64_t(p[i + k]) << (8 * k);
  mix(tail);
  h ^= h >> 29;
  return h * 0x94d049bb133111ebull;
}

DiskTier::DiskTier(const DiskTierConfig& cfg, uint64_t fingerprint) : cfg_(cfg), fingerprint_(fingerprint) {
  RV_CHECK_ARG(!cfg.root_dir.empty(), "kv_offloading_disk: root_dir is empty");
  dir_ = (fs::path(cfg.root_dir) / hex16(fingerprint)).string();
  std::error_code ec;
  fs::create_directories(dir_, ec);
  RV_CHECK_ARG(!ec && fs::is_directory(dir_), "kv_offloading_disk: cannot create root_dir ", cfg.root_dir, " (",
               ec.message(), ")");
  seed_ = read_or_make_seed((fs::path(dir_) / "hash_seed").string());
  // The files already there, oldest first.
  std::vector<std::tuple<fs::file_time_type, uint64_t, int64_t>> found;
  for (const auto& f : fs::directory_iterator(dir_, ec)) {
    const std::string name = f.path().filename().string();
    if (name.size() == 20 && name.compare(16, 4, ".kvb") == 0) {
      try {
        found.emplace_back(f.last_write_time(), std::stoull(name.substr(0, 16), nullptr, 16), int64_t(f.file_size()));
      } catch (const std::exception&) {
      }
    } else if (name.size() > 4 && name.compare(name.size() - 4, 4, ".tmp") == 0) {
      fs::remove(f.path(), ec);  // a write cut short
    }
  }
  std::sort(found.begin(), found.end());
  for (const auto& [t, key, size] : found) {
    order_.emplace_back(key, size);
    index_[key] = std::prev(order_.end());
    stats_.files += 1, stats_.bytes += size;
  }
  thread_ = std::thread([this] { writer(); });
}

DiskTier::~DiskTier() {
  flush();
  {
    std::lock_guard<std::mutex> lk(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  thread_.join();
}

std::string DiskTier::path_of(uint64_t key) const { return (fs::path(dir_) / (hex16(key) + ".kvb")).string(); }

bool DiskTier::contains(uint64_t key) const {
  std::lock_guard<std::mutex> lk(mu_);
  return index_.count(key) > 0;
}

DiskTierStats DiskTier::stats() const {
  std::lock_guard<std::mutex> lk(mu_);
  return stats_;
}

void DiskTier::forget(uint64_t key) {
  auto it = index_.find(key);
  if (it == index_.end()) return;
  stats_.files -= 1, stats_.bytes -= it->second->second;
  order_.erase(it->second);
  index_.erase(it);
  std::error_code ec;
  fs::remove(path_of(key), ec);
}

TierEntryPtr DiskTier::read(uint64_t key) {
  int64_t size = 0;
  {
    std::lock_guard<std::mutex> lk(mu_);
    auto it = index_.find(key);
    if (it == index_.end()) return nullptr;
    size = it->second->second;
  }
  // The file is read without the lock (the writer thread and prefetching readers go on); a file
  // replaced meanwhile is renamed whole, and one evicted meanwhile is a miss.
  auto e = std::make_shared<TierEntry>();
  bool ok = false;
  if (FILE* f = std::fopen(path_of(key).c_str(), "rb")) {
    FileHeader h{};
    ok = std::fread(&h, sizeof h, 1, f) == 1 && std::memcmp(h.magic, kMagic, 8) == 0 && h.version == kVersion &&
         h.header_checksum == checksum64(&h, offsetof(FileHeader, header_checksum)) && h.fingerprint == fingerprint_ &&
         h.key == key && h.n_tokens <= (1u << 20) && int64_t(sizeof h + h.n_tokens * 4ull + h.n_bytes) == size;
    if (ok) {
      e->key = key, e->parent = h.parent;
      e->tokens.resize(h.n_tokens);
      e->bytes.resize(h.n_bytes);
      ok = std::fread(e->tokens.data(), 4, h.n_tokens, f) == h.n_tokens &&
           std::fread(e->bytes.data(), 1, h.n_bytes, f) == h.n_bytes && std::fgetc(f) == EOF &&
           body_checksum(*e) == h.body_checksum;
    }
    std::fclose(f);
  }
  std::lock_guard<std::mutex> lk(mu_);
  auto it = index_.find(key);
  if (!ok) {  // corrupt, truncated, another engine's, or gone: a miss, and the file goes
    ++stats_.rejected;
    if (it != index_.end() && it->second->second == size) forget(key);
    return nullptr;
  }
  stats_.bytes_read += size;
  if (it != index_.end()) order_.splice(order_.end(), order_, it->second);  // most recently used
  return e;
}

void DiskTier::write_later(TierEntryPtr e) {
  {
    std::lock_guard<std::mutex> lk(mu_);
    const int64_t size = int64_t(e->bytes.size());
    if (queued_bytes_ + size > std::max<int64_t>(cfg_.max_size_bytes, size)) {
      ++stats_.write_skips;  // the disk is behind: this block stays in the host tier only
      return;
    }
    queued_bytes_ += size;
    queue_.push_back(std::move(e));
  }
  cv_.notify_one();
}

void DiskTier::flush() {
  std::unique_lock<std::mutex> lk(mu_);
  idle_cv_.wait(lk, [&] { return queue_.empty() && !busy_; });
}

int64_t DiskTier::free_bytes() const {
  std::error_code ec;
  const fs::space_info s = fs::space(dir_, ec);
  return ec ? 0 : int64_t(s.available);
}

void DiskTier::evict_to(int64_t bytes) {
  while (stats_.bytes > bytes && !order_.empty()) forget(order_.front().first);
}

bool DiskTier::write_now(const TierEntry& e) {
  const int64_t size = int64_t(sizeof(FileHeader) + e.tokens.size() * 4 + e.bytes.size());
  {
    std::lock_guard<std::mutex> lk(mu_);
    if (index_.count(e.key)) return true;
    if (size > cfg_.max_size_bytes) return false;
    evict_to(cfg_.max_size_bytes - size);
    // Keep min_free_bytes free: older files of this tier go first, then the write is skipped.
    while (free_bytes() - size < cfg_.min_free_bytes && !order_.empty()) forget(order_.front().first);
    if (free_bytes() - size < cfg_.min_free_bytes) return false;
  }
  FileHeader h{};
  std::memcpy(h.magic, kMagic, 8);
  h.version = kVersion, h.n_tokens = uint32_t(e.tokens.size());
  h.fingerprint = fingerprint_, h.key = e.key, h.parent = e.parent, h.n_bytes = e.bytes.size();
  h.body_checksum = body_checksum(e);
  h.header_checksum = checksum64(&h, offsetof(FileHeader, header_checksum));
  const std::string path = path_of(e.key), tmp = path + ".tmp";
  FILE* f = std::fopen(tmp.c_str(), "wb");
  bool ok = f && std::fwrite(&h, sizeof h, 1, f) == 1 &&
            std::fwrite(e.tokens.data(), 4, e.tokens.size(), f) == e.tokens.size() &&
            std::fwrite(e.bytes.data(), 1, e.bytes.size(), f) == e.bytes.size();
  if (f) ok = std::fclose(f) == 0 && ok;
  std::error_code ec;
  if (ok) fs::rename(tmp, path, ec);
  if (!ok || ec) {  // a full disk, a lost directory: the block is simply not on disk
    fs::remove(tmp, ec);
    return false;
  }
  std::lock_guard<std::mutex> lk(mu_);
  forget(e.key);  // (a stale index entry of the same key)
  order_.emplace_back(e.key, size);
  index_[e.key] = std::prev(order_.end());
  stats_.files += 1, stats_.bytes += size, stats_.bytes_written += size;
  return true;
}

void DiskTier::writer() {
  for (;;) {
    TierEntryPtr e;
    {
      std::unique_lock<std::mutex> lk(mu_);
      cv_.wait(lk, [&] { return stop_ || !queue_.empty(); });
      if (queue_.empty()) return;  // stop_, with nothing left
      e = std::move(queue_.front());
      queue_.pop_front();
      busy_ = true;
    }
    const bool ok = write_now(*e);
    {
      std::lock_guard<std::mutex> lk(mu_);
      queued_bytes_ -= int64_t(e->bytes.size());
      if (!ok) ++stats_.write_skips;
      busy_ = false;
    }
    idle_cv_.notify_all();
  }
}

}  // namespace revolta
