// plan_engine: the engine's decisions from options and a model config alone (no weights, no device).
#include <filesystem>
#include <fstream>
#include <string>

#include "engine/plan.h"
#include "config_dir.h"
#include "expect.h"

using namespace revolta;

namespace {

ModelConfig config_of(const std::string& name, const std::string& json) {
  return config_dir("engine-plan-" + name, json).config;
}

const std::string kCommon = R"("vocab_size": 1000, "hidden_size": 128, "num_attention_heads": 4, "num_key_value_heads": 2,
    "max_position_embeddings": 256, "rms_norm_eps": 1e-6, "torch_dtype": "float16", "intermediate_size": 256)";

ModelConfig dense() {
  return config_of("llama", R"({"architectures": ["LlamaForCausalLM"], "num_hidden_layers": 3, )" + kCommon + "}");
}

ModelConfig hybrid(int mtp_layers) {
  return config_of("next" + std::to_string(mtp_layers), R"({"architectures": ["Qwen3NextForCausalLM"], "head_dim": 64,
    "num_hidden_layers": 4, "num_experts": 8, "num_experts_per_tok": 2, "moe_intermediate_size": 64,
    "shared_expert_intermediate_size": 64, "linear_num_key_heads": 2, "linear_num_value_heads": 4,
    "linear_key_head_dim": 32, "linear_value_head_dim": 32, "linear_conv_kernel_dim": 4, "full_attention_interval": 4,
    "partial_rotary_factor": 0.25, "mtp_num_hidden_layers": )" + std::to_string(mtp_layers) + ", " + kCommon + "}");
}

EngineConfig options() {
  EngineConfig c;
  c.model = "m";
  c.kv_cache_memory_bytes = 4 << 20;
  c.max_num_seqs = 4;
  return c;
}

const CacheGroupSpec* group(const EnginePlan& p, CacheGroupSpec::Kind kind) {
  for (const CacheGroupSpec& g : p.groups)
    if (g.kind == kind) return &g;
  return nullptr;
}

void test_dense_on_the_cpu() {
  const EnginePlan p = plan_engine(options(), dense(), {}, 6);
  EXPECT(p.cfg.max_model_len == 256 && p.model.max_positions == 256);  // 0: the model's max_position_embeddings
  EXPECT(p.weight_dtype == "float16" && p.device == Device::kCPU && p.threads == 6 && p.world == 1);
  const CacheGroupSpec* kv = group(p, CacheGroupSpec::Kind::kPagedKv);
  EXPECT(p.groups.size() == 1 && kv && kv->kv.num_layers == 3 && kv->kv.dtype == DType::kF32);
  EXPECT(p.caches.num_blocks > 0 && p.caches.state_bytes + p.caches.num_blocks * p.caches.block_bytes <= (4 << 20));
  EXPECT(!p.async_scheduling && !p.speculative && p.runner.graph_batch_sizes.empty() && p.quantization.empty());
  EngineConfig c = options();
  c.kv_cache_dtype = "int8";
  c.num_threads = 3;
  c.load_format = "gguf";
  const EnginePlan q = plan_engine(c, dense(), {}, 6);
  EXPECT(group(q, CacheGroupSpec::Kind::kPagedKv)->kv.dtype == DType::kI8 && q.threads == 3);
  EXPECT(q.caches.num_blocks > p.caches.num_blocks);  // a quarter of the bytes a token
  EXPECT(q.quantization == "gguf blocks, 16-bit activations");
}

void test_speculation_declares_its_caches() {
  EngineConfig c = options();
  c.speculative_method = "mtp";
  c.num_speculative_tokens = 2;
  const EnginePlan p = plan_engine(c, hybrid(1), {}, 2);
  // one attention layer of four, plus the MTP layer; a second state slot per request for rollback
  EXPECT(group(p, CacheGroupSpec::Kind::kPagedKv)->kv.num_layers == 2);
  EXPECT(group(p, CacheGroupSpec::Kind::kRecurrentState)->slots_per_request == 2);
  EXPECT(p.mtp && p.runner.hidden == HiddenRows::kEvery && p.runner.keep_verify_rows && !p.async_scheduling);
  c.speculative_method = "ngram";
  const EnginePlan n = plan_engine(c, hybrid(1), {}, 2);
  EXPECT(group(n, CacheGroupSpec::Kind::kPagedKv)->kv.num_layers == 1 && !n.mtp && n.runner.hidden == HiddenRows::kNone);
  EXPECT(group(n, CacheGroupSpec::Kind::kRecurrentState)->slots_per_request == 2);
  const EnginePlan plain = plan_engine(options(), hybrid(1), {}, 2);
  EXPECT(group(plain, CacheGroupSpec::Kind::kRecurrentState)->slots_per_request == 1 && !plain.runner.keep_verify_rows);
  c.speculative_method = "mtp";
  EXPECT(throws_naming([&] { plan_engine(c, dense(), {}, 2); }, "mtp_num_hidden_layers"));
}

void test_errors_name_the_option() {
  EngineConfig c = options();
  c.max_model_len = 512;
  EXPECT(throws_naming([&] { plan_engine(c, dense(), {}, 2); }, "max_model_len (512) exceeds"));
  c = options();
  c.quantization = "awq";
  EXPECT(throws_naming([&] { plan_engine(c, dense(), {}, 2); }, "quantization 'awq'"));
  c.load_format = "dummy";  // made-up weights of the asked format
  const EnginePlan p = plan_engine(c, dense(), {}, 2);
  EXPECT(p.model.quantization.method == "awq" && p.model.quantization.group_size == 128 && p.quantization == "awq int4 g128");
  c.quantization = "nvfp4";  // each format's own group and label (quant/formats.h)
  const EnginePlan f = plan_engine(c, dense(), {}, 2);
  EXPECT(f.model.quantization.group_size == 16 && f.quantization == "nvfp4 e2m1, an e4m3 scale per 16");
  c.quantization = "int3";
  EXPECT(throws_naming([&] { plan_engine(c, dense(), {}, 2); }, "quantization 'int3' is not a weight format (awq, fp8, nvfp4)"));
  c = options();
  c.kv_cache_memory_bytes = 1024;  // not one request of max_model_len
  EXPECT(throws_naming([&] { plan_engine(c, dense(), {}, 2); }, "kv_cache_memory_bytes"));
}

void test_graph_sizes() {
  EngineConfig c;
  c.max_num_seqs = 20;
  EXPECT((graph_batch_sizes(c) == std::vector<int32_t>{1, 2, 4, 8, 16, 20}));
  c.max_num_seqs = 600;
  const std::vector<int32_t> all = graph_batch_sizes(c);
  EXPECT(all.size() == 3 + 32 + 16 + 1 && all.back() == 600 && all[all.size() - 2] == 512);
  c.max_num_seqs = 32;
  c.cuda_graph_batch_sizes = {4, 4, 64, 2};
  EXPECT((graph_batch_sizes(c) == std::vector<int32_t>{4, 2}));
}

}  // namespace

void run_engine_plan_tests() {
  test_dense_on_the_cpu();
  test_speculation_declares_its_caches();
  test_errors_name_the_option();
  test_graph_sizes();
}
