// Model hyper-parameters parsed from an HF config.json (transformers 4 and 5 spellings).
#pragma once

#include <optional>
#include <string>
#include <vector>

#include "core/json.h"
#include "ops/ops.h"

namespace revolta {

struct RopeConfig {
  std::string type = "default";  // default | linear | llama3 | yarn
  double theta = 10000.0;
  double partial_rotary_factor = 1.0;
  double factor = 1.0;
  double low_freq_factor = 1.0, high_freq_factor = 4.0;  // llama3
  double beta_fast = 32.0, beta_slow = 1.0;              // yarn
  std::optional<double> attention_factor, mscale, mscale_all_dim;
  bool truncate = true;
  int64_t original_max_position_embeddings = 0;
  // Multimodal RoPE (Qwen3-VL, Qwen3.5): the rotary frequencies split over time / height / width
  // positions, interleaved (t h w t h w ..., the rest t) or as consecutive sections. Empty: 1-D.
  std::vector<int32_t> mrope_section;
  bool mrope_interleaved = true;
};

// The vision tower of a multimodal checkpoint (HF vision_config): patch embedding over (temporal,
// height, width) patches, ViT blocks with 2-D rotary positions, a merger of spatial_merge_size^2
// patches into one token of out_hidden_size; deepstack layers also feed their merged states into
// the first decoder layers (Qwen3-VL). depth 0: no vision tower.
struct VisionConfig {
  int32_t depth = 0, hidden_size = 0, intermediate_size = 0, num_heads = 0, in_channels = 3;
  int32_t patch_size = 16, temporal_patch_size = 2, spatial_merge_size = 2, out_hidden_size = 0;
  int32_t num_position_embeddings = 0;
  double rope_theta = 10000.0;
  std::string hidden_act = "gelu_pytorch_tanh";
  std::vector<int32_t> deepstack_layers;
  int32_t image_token_id = -1, video_token_id = -1, vision_start_token_id = -1, vision_end_token_id = -1;
  int32_t patch_dim() const { return in_channels * temporal_patch_size * patch_size * patch_size; }
  int32_t merge_unit() const { return spatial_merge_size * spatial_merge_size; }
};

// The checkpoint's quantization_config (HF): which weights are stored quantized, and how.
struct WeightQuantization {
  // "" (none) | "awq" (4-bit, zero point, AutoAWQ GEMM layout) | "fp8" (E4M3 + scales) | "nvfp4" (ModelOpt)
  std::string method;
  int32_t group_size = 0;  // awq: 32 or 128; fp8: 128 (the engine's block); nvfp4: 16
};

// Flash-Next (qwen4_exp) additions to the hybrid: hyper-connections (hc_count residual streams;
// 0: none), QSA, the learned indexer that picks which cached cells a full-attention query reads
// (compress ratio 0: dense attention), and n-gram PLE, hashed n-gram embeddings added at the start
// of its layers.
struct FlashNextConfig {
  int32_t hc_count = 0, hc_lowrank = 0;
  int32_t indexer_heads = 0, indexer_head_dim = 0, indexer_budget = 0, indexer_ratio = 0;
  std::vector<int32_t> ple_layers;  // 0-based (HF's ple_layer_ids count from 1)
  int32_t ngram_size = 0, heads_per_ngram = 0, ple_conv_kernel = 0, ple_embed_dim = 0;
  int64_t ngram_vocab_base = 0, ngram_vocab_divisor = 1;
  uint64_t seed = 0;
  bool sigmoid_output_gate = false;  // the DeltaNet's gated norm: sigmoid (Flash-Next) or silu
  bool ple_on_disk = false;  // the engine's ple_offload: the table left in its file mapping
  int32_t ple_heads() const { return (ngram_size - 1) * heads_per_ngram; }
  int32_t top_blocks() const { return indexer_ratio > 0 ? indexer_budget / indexer_ratio : 0; }
  bool is_ple_layer(int32_t layer) const;
};

struct ModelConfig {
  std::string architecture;
  WeightQuantization quantization;
  int32_t vocab_size = 0;
  int32_t hidden_size = 0;
  int32_t intermediate_size = 0;
  int32_t num_layers = 0;
  int32_t num_heads = 0;
  int32_t num_kv_heads = 0;
  int32_t head_dim = 0;
  float rms_norm_eps = 1e-6f;
  int32_t max_position_embeddings = 0;
  bool tie_word_embeddings = false;
  bool attention_bias = false;
  bool mlp_bias = false;
  std::string hidden_act = "silu";
  std::string torch_dtype = "float32";
  std::vector<int32_t> eos_token_ids;
  int32_t bos_token_id = -1;
  RopeConfig rope;
  // Hybrid / MoE families (Qwen3-MoE, Qwen3-Next, Qwen3.5-MoE). Dense models leave these empty.
  std::vector<bool> linear_layers;  // per layer: Gated DeltaNet (true) or full attention
  int32_t linear_num_key_heads = 0, linear_num_value_heads = 0;
  int32_t linear_key_head_dim = 0, linear_value_head_dim = 0, linear_conv_kernel_dim = 0;
  int32_t num_experts = 0, num_experts_per_tok = 0, moe_intermediate_size = 0;
  int32_t shared_expert_intermediate_size = 0, decoder_sparse_step = 1;
  int32_t num_mtp_layers = 0;  // multi-token-prediction layers (mtp.*), kept for speculative decoding
  std::vector<int32_t> mlp_only_layers;
  bool norm_topk_prob = true;
  FlashNextConfig flash;
  VisionConfig vision;
  bool is_moe_layer(int32_t layer) const;
  int32_t num_attention_layers() const;
  int32_t num_linear_layers() const;
  int32_t max_positions = 0;  // RoPE table length; the engine raises it to max_model_len

  // Throws std::runtime_error naming the field for a missing or inconsistent value.
  static ModelConfig from_json(const Json& j, const std::string& source);
  static ModelConfig from_file(const std::string& config_json_path);
  static ModelConfig from_json_fields(const Json& j, const std::string& source, const std::string& arch);
};

// cos/sin tables for positions [0, max_positions), matching HF's rope_init functions.
ops::RopeTables build_rope_tables(const RopeConfig& rope, int32_t head_dim, int32_t max_positions);
// Multimodal RoPE: the axis (0 time, 1 height, 2 width) of each of the rotary_dim / 2 frequencies,
// as rope.mrope_section says; empty when it has none.
std::vector<int32_t> mrope_axes(const RopeConfig& rope, int32_t rotary_dim);

}  // namespace revolta
