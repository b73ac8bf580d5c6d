#include <map>

#include "core/error.h"
#include "model/architectures.h"
#include "quant/formats.h"

namespace revolta {
namespace {

using Factory = std::unique_ptr<CausalLM> (*)(const WeightLoader&, const ModelConfig&, DType);

const std::map<std::string, Factory>& registry() {
  static const std::map<std::string, Factory> r = {
      {"LlamaForCausalLM", &make_llama},
      {"Qwen3ForCausalLM", &make_qwen3},
      {"Qwen3VLForConditionalGeneration", &make_qwen3},
      {"Qwen3MoeForCausalLM", &make_qwen3_moe},
      {"Qwen3VLMoeForConditionalGeneration", &make_qwen3_moe},
      {"Qwen3NextForCausalLM", &make_qwen3_next},
      {"Qwen3_5ForCausalLM", &make_qwen3_5},
      {"Qwen3_5ForConditionalGeneration", &make_qwen3_5},
      {"Qwen3_5MoeForCausalLM", &make_qwen3_5},
      {"Qwen3_5MoeForConditionalGeneration", &make_qwen3_5},
      {"Qwen4ExpForCausalLM", &make_flash_next},
      {"Qwen4ExpForConditionalGeneration", &make_flash_next},
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

CacheSpecs cache_specs_for(const ModelConfig& c, const SpeculativeCacheNeeds& spec) {
  CacheSpecs groups;
  if (c.num_attention_layers() > 0)  // the MTP layers keep K/V like attention layers, after the model's own
    groups.push_back(CacheGroupSpec::paged_kv({c.num_attention_layers() + spec.mtp_layers, c.num_kv_heads, c.head_dim, DType::kF32}));
  if (c.flash.indexer_ratio > 0 && c.num_attention_layers() > 0)  // QSA's raw indexer keys, one row per token
    groups.push_back(CacheGroupSpec::token_rows({c.num_attention_layers(), c.flash.indexer_head_dim}));
  if (c.num_linear_layers() > 0 || !c.flash.ple_layers.empty()) {
    StateSpec s;
    s.num_layers = c.num_linear_layers();
    s.conv_dim = 2 * c.linear_num_key_heads * c.linear_key_head_dim + c.linear_num_value_heads * c.linear_value_head_dim;
    s.conv_history = c.linear_conv_kernel_dim - 1;
    s.num_heads = c.linear_num_value_heads;
    s.k_dim = c.linear_key_head_dim;
    s.v_dim = c.linear_value_head_dim;
    for (size_t i = 0; i < c.flash.ple_layers.size(); ++i) {  // PLE: the n-gram window, the dilated conv's history
      const FlashNextConfig& f = c.flash;
      s.buffers.push_back({f.ngram_size - 1});
      s.buffers.push_back({int64_t(f.hc_count) * c.hidden_size, int64_t(f.ple_conv_kernel - 1) * f.ngram_size});
    }
    groups.push_back(CacheGroupSpec::recurrent_state(s));
    if (spec.rollback_states) groups.back().slots_per_request = 2;  // its state before a verify step
  }
  return groups;
}

void check_device_limits(const ModelConfig& c, Device device) {
  if (device == Device::kCPU) return;
  RV_CHECK_ARG(c.flash.ple_layers.empty() || c.flash.ngram_size <= 8, "device 'cuda': ngram_size ", c.flash.ngram_size,
               " (the PLE hashing kernel takes up to 8)");
  // PLE's dilated conv runs as an undilated one of (kernel - 1) * ngram_size + 1 taps.
  const int32_t ple_taps = (c.flash.ple_conv_kernel - 1) * c.flash.ngram_size + 1;
  RV_CHECK_ARG(c.flash.ple_layers.empty() || ple_taps <= ops::kCudaConvMaxWidth, "device 'cuda': ple_conv_kernel_size ",
               c.flash.ple_conv_kernel, " with ngram_size ", c.flash.ngram_size, " makes a ", ple_taps,
               "-tap conv; the conv kernel takes up to ", ops::kCudaConvMaxWidth, " (use device 'cpu')");
  RV_CHECK_ARG(c.flash.indexer_ratio == 0 || c.flash.indexer_head_dim <= 1024, "device 'cuda': indexer_head_dim ",
               c.flash.indexer_head_dim, " (the QSA kernels take up to 1024)");
  // The CUDA kernels' shape limits, checked before any weight is read.
  RV_CHECK_ARG(c.head_dim <= 256, "device 'cuda': head_dim ", c.head_dim, " > 256 (the attention kernels' limit)");
  if (c.num_linear_layers() > 0) {
    const int64_t dk = c.linear_key_head_dim;
    RV_CHECK_ARG(dk == 16 || dk == 32 || dk == 64 || dk == 128 || dk == 256, "device 'cuda': linear_key_head_dim ",
                 dk, " (the delta-rule kernel takes 16, 32, 64, 128 or 256)");
    RV_CHECK_ARG(c.linear_conv_kernel_dim >= 1 && c.linear_conv_kernel_dim <= 8, "device 'cuda': linear_conv_kernel_dim ",
                 c.linear_conv_kernel_dim, " (the conv kernel takes 1..8)");
    RV_CHECK_ARG(c.linear_value_head_dim >= 1 && c.linear_value_head_dim <= 256, "device 'cuda': linear_value_head_dim ",
                 c.linear_value_head_dim, " (the decode kernel takes up to 256)");
  }
}

std::unique_ptr<CausalLM> load_model(const std::string& dir, const ModelConfig& config, DType weight_dtype,
                                     Device device, bool dummy, bool gguf, Communicator* tp, bool expert_parallel) {
  check_architecture(config, dir);
  // Weights load onto the device; those a model rearranges first come through the host and are
  // placed by place().
  WeightLoader weights(dir, device, dummy, gguf);
  if (tp) weights.set_tensor_parallel(tp, expert_parallel);
  if (dummy && !config.quantization.method.empty())
    weights.set_dummy_blocks(weight_format(config.quantization.method, "quantization").blocks(config.quantization.group_size));
  auto model = registry().at(config.architecture)(weights, config, weight_dtype);
  model->place(device);
  return model;
}

}  // namespace revolta
