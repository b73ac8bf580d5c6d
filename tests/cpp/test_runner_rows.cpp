// The runner's hooks for speculative decoding: a request can sample several rows of one step
// (its last sample_rows positions), and the forward can return the final hidden states of the
// sampled rows. Each row must equal what a token-by-token run computes at that position.
#include <cmath>
#include <filesystem>
#include <fstream>
#include <memory>
#include <string>

#include "cache/cache_coordinator.h"
#include "config_dir.h"
#include "expect.h"
#include "model/model.h"
#include "runtime/model_runner.h"
#include "runner_rig.h"

using namespace revolta;

namespace {

using Rig = RunnerRig;

Rig make_rig(const std::string& dir, const ModelConfig& c) { return make_runner_rig(dir, c, HiddenRows::kSampled); }

// Runs one request's prompt in one step; returns that step's output.
StepLogits run_prompt(Rig& g, uint64_t id, const std::vector<int32_t>& prompt, int32_t sample_rows) {
  auto r = std::make_unique<Request>();
  r->id = id;
  r->tokens = prompt;
  r->num_prompt_tokens = int32_t(prompt.size());
  r->sample_rows = sample_rows;
  g.scheduler->add(std::move(r));
  SchedulerOutput plan = g.scheduler->schedule();
  StepLogits out = g.runner->execute(plan, g.caches->prepare(plan.scheduled));
  g.scheduler->remove(id);
  return out;
}

float max_diff(const Tensor& a, int64_t row_a, const Tensor& b, int64_t row_b) {
  const int64_t n = a.size(1);
  float d = 0.0f;
  for (int64_t i = 0; i < n; ++i) d = std::max(d, std::fabs(a.ptr<float>()[row_a * n + i] - b.ptr<float>()[row_b * n + i]));
  return d;
}

void check_architecture(const std::string& name, const std::string& json) {
  const auto [dir, c] = config_dir("rows-" + name, json);
  Rig g = make_rig(dir, c);
  const std::vector<int32_t> prompt = {5, 9, 2, 41, 7, 33, 18, 3};
  StepLogits three = run_prompt(g, 1, prompt, 3);
  EXPECT(three.samplers.size() == 1 && three.rows_per_sampler == std::vector<int32_t>{3});
  EXPECT(three.logits.size(0) == 3 && three.hidden.size(0) == 3 && three.hidden.size(1) == c.hidden_size);
  for (int32_t k = 0; k < 3; ++k) {  // row k is position 5 + k: the prompt cut after it, alone
    const std::vector<int32_t> cut(prompt.begin(), prompt.begin() + 6 + k);
    StepLogits one = run_prompt(g, 10 + uint64_t(k), cut, 1);
    EXPECT(one.logits.size(0) == 1);
    EXPECT(max_diff(three.logits, k, one.logits, 0) < 1e-4f);
    EXPECT(max_diff(three.hidden, k, one.hidden, 0) < 1e-4f);
  }
  EXPECT(g.caches->manager().pool().num_free() == g.caches->num_blocks());
}

}  // namespace

void run_runner_rows_tests() {
  const std::string common = R"("vocab_size": 64, "hidden_size": 32, "num_attention_heads": 4, "num_key_value_heads": 2,
      "max_position_embeddings": 64, "rms_norm_eps": 1e-6, "intermediate_size": 48, "torch_dtype": "float32")";
  check_architecture("llama", R"({"architectures": ["LlamaForCausalLM"], "num_hidden_layers": 2, )" + common + "}");
  check_architecture("qwen3next", R"({"architectures": ["Qwen3NextForCausalLM"], "head_dim": 8, "num_hidden_layers": 2,
      "num_experts": 4, "num_experts_per_tok": 2, "moe_intermediate_size": 16, "shared_expert_intermediate_size": 16,
      "linear_num_key_heads": 2, "linear_num_value_heads": 2, "linear_key_head_dim": 8, "linear_value_head_dim": 8,
      "linear_conv_kernel_dim": 4, "full_attention_interval": 2, "partial_rotary_factor": 0.5, )" + common + "}");
}
