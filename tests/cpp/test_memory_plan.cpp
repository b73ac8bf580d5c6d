// The memory plan's weight estimate (made before any weight is read) against the bytes of the
// same models really built (dummy weights, no files): dense, MoE and hybrid configs.
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <string>

#include "model/memory_estimate.h"
#include "config_dir.h"
#include "expect.h"
#include "model/model.h"

using namespace revolta;

namespace {

double ratio_for(const std::string& name, const std::string& json) {
  const auto [dir, c] = config_dir("plan-" + name, json);
  const auto model = load_model(dir, c, DType::kF16, Device::kCPU, /*dummy=*/true);
  const double est = double(estimate_weight_bytes(c, 2));
  return est / double(model->weight_bytes());
}

}  // namespace

void run_memory_plan_tests() {
  const std::string common = R"("vocab_size": 1000, "hidden_size": 128, "num_attention_heads": 4, "num_key_value_heads": 2,
      "max_position_embeddings": 256, "rms_norm_eps": 1e-6, "torch_dtype": "float16")";
  const double dense = ratio_for("llama", R"({"architectures": ["LlamaForCausalLM"], "intermediate_size": 256,
      "num_hidden_layers": 3, )" + common + "}");
  const double moe = ratio_for("qwen3moe", R"({"architectures": ["Qwen3MoeForCausalLM"], "intermediate_size": 256,
      "head_dim": 32, "num_hidden_layers": 2, "num_experts": 16, "num_experts_per_tok": 4, "moe_intermediate_size": 64,
      "norm_topk_prob": true, )" + common + "}");
  const double next = ratio_for("qwen3next", R"({"architectures": ["Qwen3NextForCausalLM"], "intermediate_size": 256,
      "head_dim": 64, "num_hidden_layers": 4, "num_experts": 32, "num_experts_per_tok": 4, "moe_intermediate_size": 64,
      "shared_expert_intermediate_size": 64, "linear_num_key_heads": 2, "linear_num_value_heads": 4,
      "linear_key_head_dim": 32, "linear_value_head_dim": 32, "linear_conv_kernel_dim": 4, "full_attention_interval": 4,
      "partial_rotary_factor": 0.25, )" + common + "}");
  // Flash-Next: the mixers, indexers and PLE projections count; its PLE table is host memory.
  const double flash = ratio_for("qwen4exp", R"({"architectures": ["Qwen4ExpForCausalLM"], "head_dim": 64,
      "num_hidden_layers": 4, "num_experts": 32, "num_experts_per_tok": 4, "moe_intermediate_size": 64,
      "shared_expert_intermediate_size": 64, "linear_num_key_heads": 2, "linear_num_value_heads": 4,
      "linear_key_head_dim": 32, "linear_value_head_dim": 32, "linear_conv_kernel_dim": 4,
      "layer_types": ["linear_attention", "full_attention", "linear_attention", "full_attention"],
      "hc_count": 4, "hc_lowrank": 32, "indexer_n_heads": 4, "indexer_head_dim": 32, "indexer_budget": 64,
      "indexer_compress_ratio": 4, "ple_layer_ids": [1], "ngram_size": 3, "heads_per_ngram": 4, "ple_conv_kernel_size": 4,
      "ngram_vocab_size_base": 1000, "eos_token_id": 2, "output_gate_type": "sigmoid", )" + common + "}");
  std::printf("weight estimate / built: dense %.3f, moe %.3f, hybrid %.3f, flash-next %.3f\n", dense, moe, next, flash);
  // The estimate may count small f32 tensors the model keeps outside its byte count, never less.
  EXPECT(dense >= 0.99 && dense < 1.1);
  EXPECT(moe >= 0.99 && moe < 1.1);
  EXPECT(next >= 0.99 && next < 1.1);
  EXPECT(flash >= 0.99 && flash < 1.1);
}
