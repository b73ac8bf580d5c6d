#include "engine/kv_offload.h"

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <sstream>

namespace revolta {
namespace fs = std::filesystem;

namespace {

// A model file's name, size and a checksum of its last 64 KB (weights differ there between two
// fine-tunes of one architecture; reading whole checkpoints at startup would cost minutes).
void describe_file(const fs::path& p, std::ostringstream& out) {
  std::error_code ec;
  const uint64_t size = fs::file_size(p, ec);
  if (ec) return;
  std::ifstream in(p, std::ios::binary);
  const uint64_t tail = std::min<uint64_t>(size, 65536);
  std::string buf(size_t(tail), '\0');
  in.seekg(std::streamoff(size - tail));
  in.read(buf.data(), std::streamsize(tail));
  out << p.filename().string() << ":" << size << ":" << checksum64(buf.data(), buf.size()) << ";";
}

}  // namespace

uint64_t kv_fingerprint(const EngineConfig& cfg, const ModelConfig& m, const std::string& weight_dtype,
                        const std::string& kv_dtype, const std::vector<std::pair<float, float>>& kv_scales) {
  std::ostringstream s;
  s << "revolta-kv-1|" << m.architecture << "|" << m.vocab_size << "|" << m.hidden_size << "|" << m.num_layers << "|"
    << m.num_heads << "|" << m.num_kv_heads << "|" << m.head_dim << "|" << m.quantization.method << "|" << weight_dtype
    << "|" << kv_dtype << "|" << cfg.block_size << "|" << cfg.tensor_parallel_size << "|" << cfg.enable_expert_parallel
    << "|" << cfg.load_format << "|" << cfg.device << "|";
  for (const auto& [k, v] : kv_scales) s << k << "," << v << ";";
  std::error_code ec;
  std::vector<fs::path> files;
  if (fs::is_directory(cfg.model, ec)) {
    for (const auto& f : fs::directory_iterator(cfg.model, ec)) {
      const std::string ext = f.path().extension().string();
      if (f.is_regular_file() && (ext == ".safetensors" || ext == ".gguf" || ext == ".json" || ext == ".bin"))
        files.push_back(f.path());
    }
  } else {
    files.push_back(cfg.model);
  }
  std::sort(files.begin(), files.end());
  for (const fs::path& p : files) describe_file(p, s);
  const std::string text = s.str();
  return checksum64(text.data(), text.size());
}

std::unique_ptr<KvTiers> make_kv_tiers(const EngineConfig& cfg, uint64_t fingerprint, int world, const KvCache& kv,
                                       const StateCache* states) {
  if (cfg.kv_offloading_size <= 0.0 && cfg.kv_offloading_disk_dir.empty()) return nullptr;
  KvTierConfig t;
  t.host_bytes = int64_t(cfg.kv_offloading_size * double(int64_t(1) << 30));
  t.eviction = parse_tier_eviction(cfg.kv_offloading_eviction);
  t.disk = {cfg.kv_offloading_disk_dir, cfg.kv_offloading_disk_max_bytes, cfg.kv_offloading_disk_min_free_bytes};
  return std::make_unique<KvTiers>(t, fingerprint, world, kv_block_bytes(kv) * world, state_slot_bytes(states) * world);
}

}  // namespace revolta
