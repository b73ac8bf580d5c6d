#include <map>

#include "core/error.h"
#include "model/architectures.h"

namespace revolta {
namespace {

using Factory = std::unique_ptr<CausalLM> (*)(const WeightLoader&, const ModelConfig&, DType);

const std::map<std::string, Factory>& registry() {
  static const std::map<std::string, Factory> r = {
      {"LlamaForCausalLM", &make_llama},
      {"Qwen3ForCausalLM", &make_qwen3},
  };
  return r;
}

}  // namespace

std::vector<std::string> supported_architectures() {
  std::vector<std::string> out;
  for (const auto& [name, f] : registry()) out.push_back(name);
  return out;
}

void check_architecture(const ModelConfig& config, const std::string& dir) {
  if (registry().count(config.architecture) == 0) {
    std::string names;
    for (const auto& n : supported_architectures()) names += (names.empty() ? "" : ", ") + n;
    throw std::invalid_argument(str_cat("unsupported architecture '", config.architecture,
                                        "' in ", dir, "/config.json (supported: ", names, ")"));
  }
}

KvCacheSpec kv_cache_spec_for(const ModelConfig& c) {
  return {c.num_layers, c.num_kv_heads, c.head_dim, DType::kF32};
}

std::unique_ptr<CausalLM> load_model(const std::string& dir, const ModelConfig& config,
                                     DType weight_dtype) {
  check_architecture(config, dir);
  WeightLoader weights(dir);
  return registry().at(config.architecture)(weights, config, weight_dtype);
}

}  // namespace revolta
