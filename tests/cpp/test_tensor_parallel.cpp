// Tensor parallelism on the CPU: every architecture sharded over 2 and 4 ranks (threads of a
// LocalGroup, each rank with its own slices of the weights, caches, scheduler and runner) gives the
// logits of the unsharded model over a prefill of two requests in one step and the decode steps
// after it, and the same draft logits from its multi-token-prediction layer: dense models with
// q / k / v / o biases, KV heads replicated (2 KV heads on 4 ranks), the vocabulary split across
// ranks or (when it does not divide) whole on each; MoE and hybrid models with their DeltaNet heads,
// experts, shared experts (routed with the experts or gated on their own) and dense MLP layers
// split, and with expert parallelism (whole experts per rank). A model that does not split evenly is refused naming tensor_parallel_size and the count.
#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <functional>
#include <memory>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "cache/cache_coordinator.h"
#include "core/error.h"
#include "dist/communicator.h"
#include "engine/tensor_parallel.h"
#include "config_dir.h"
#include "expect.h"
#include "model/model.h"
#include "model/weights.h"
#include "runtime/model_runner.h"
#include "runner_rig.h"

using namespace revolta;

namespace {

// The logits of every step, [rows, vocab] each: two prompts prefilled in one step, then `steps`
// decode steps feeding each request a fixed token sequence (the same on every rank).
// With MTP layers, a last entry: the draft logits of each request's next token after its last step.
std::vector<Tensor> run(const std::string& dir, const ModelConfig& c, Communicator* tp, int steps, bool ep = false) {
  RunnerRig g = make_runner_rig(dir, c, HiddenRows::kSampled, tp, ep);
  add_prompts(*g.scheduler, {{5, 9, 2, 41, 7, 33, 18, 3, 11}, {8, 1, 60, 22, 4}});
  std::vector<Tensor> logits;
  std::vector<DraftSpan> spans;
  Tensor hidden;
  for (int s = 0; s <= steps; ++s) {
    SchedulerOutput plan = g.scheduler->schedule();
    StepLogits out = g.runner->execute(plan, g.caches->prepare(plan.scheduled));
    logits.push_back(out.logits);
    hidden = out.hidden, spans.clear();
    for (const auto& sr : plan.scheduled) {
      sr.request->num_computed_tokens += sr.num_new_tokens;
      g.caches->commit(*sr.request);
      sr.request->tokens.push_back(int32_t(7 * s + 3 * sr.request->id) % 64);
      spans.push_back({sr.request, sr.request->num_computed_tokens - 1, {sr.request->tokens.back()}, true});
    }
  }
  if (g.model->num_mtp_layers() > 0) logits.push_back(g.runner->draft_forward(spans, hidden, 0).logits);
  return logits;
}

float max_diff(const Tensor& a, const Tensor& b) {
  if (a.numel() != b.numel()) return INFINITY;
  float d = 0.0f;
  for (int64_t i = 0; i < a.numel(); ++i) d = std::max(d, std::fabs(a.ptr<float>()[i] - b.ptr<float>()[i]));
  return d;
}

// Rank 0's logits of a run over `world` ranks, each on a thread of its own.
std::vector<Tensor> run_sharded(const std::string& dir, const ModelConfig& c, int world, int steps, bool ep = false) {
  LocalGroup group(world);
  std::vector<std::vector<Tensor>> out(static_cast<size_t>(world));
  std::vector<std::string> errors(static_cast<size_t>(world));
  std::vector<std::thread> threads;
  for (int r = 0; r < world; ++r)
    threads.emplace_back([&, r] {
      auto comm = group.communicator(r);
      try {
        out[size_t(r)] = run(dir, c, comm.get(), steps, ep);
      } catch (const std::exception& e) {
        errors[size_t(r)] = e.what();
        group.abort(e.what());
      }
    });
  for (auto& t : threads) t.join();
  for (const auto& e : errors)
    if (!e.empty()) throw std::runtime_error(e);
  for (int r = 1; r < world; ++r)  // every rank computes the same logits (replicated head)
    for (size_t s = 0; s < out[0].size(); ++s) EXPECT(max_diff(out[0][s], out[size_t(r)][s]) == 0.0f);
  return out[0];
}

// ep: with expert parallelism (whole experts per rank) as well.
void check(const std::string& name, const std::string& json, const std::vector<int>& worlds, bool ep = false) {
  const auto [dir, c] = config_dir("tp-" + name, json);
  const int steps = 4;
  const std::vector<Tensor> want = run(dir, c, nullptr, steps);
  EXPECT(want.size() == size_t(steps + 1 + (c.num_mtp_layers > 0)) && want[0].size(0) == 2 && want.back().size(0) == 2);
  for (int world : worlds)
    for (bool expert_parallel : ep ? std::vector<bool>{false, true} : std::vector<bool>{false}) {
      const std::vector<Tensor> got = run_sharded(dir, c, world, steps, expert_parallel);
      float worst = 0.0f;
      for (size_t s = 0; s < want.size(); ++s) worst = std::max(worst, max_diff(want[s], got[s]));
      EXPECT(got.size() == want.size() && worst < 1e-4f);  // sums in another order: float32 rounding only
      if (!(worst < 1e-4f))
        std::printf("tensor parallel %s over %d ranks%s: max |logit diff| %g\n", name.c_str(), world,
                    expert_parallel ? " (expert parallel)" : "", worst);
    }
}

// A rank's made-up slice holds the values of that slice of the whole: stacked row slices and a
// column slice.
void check_dummy_slices(const std::string& dir) {
  WeightLoader w(dir, Device::kCPU, /*dummy=*/true);
  const Tensor whole = w.get_stacked({"a", "b"}, {{6, 8}, {4, 8}}, DType::kF32);
  const Tensor rows = w.get_sliced({"a", "b"}, {{6, 8}, {4, 8}}, {Slice::rows(2, 5), Slice::rows(1, 3)}, DType::kF32, false);
  const Tensor a = w.get("a", {6, 8}, DType::kF32);
  const Tensor cols = w.get_sliced({"a"}, {{6, 8}}, {Slice::cols(3, 7)}, DType::kF32, false);
  bool same = rows.size(0) == 5 && rows.size(1) == 8 && cols.size(0) == 6 && cols.size(1) == 4;
  const int64_t from[5] = {2, 3, 4, 7, 8};  // rows of the stacked whole
  for (int64_t r = 0; same && r < 5; ++r)
    for (int64_t c = 0; c < 8; ++c) same = same && rows.ptr<float>()[r * 8 + c] == whole.ptr<float>()[from[r] * 8 + c];
  for (int64_t r = 0; same && r < 6; ++r)
    for (int64_t c = 0; c < 4; ++c) same = same && cols.ptr<float>()[r * 4 + c] == a.ptr<float>()[r * 8 + 3 + c];
  EXPECT(same);
}

// The engine's ranks (TensorParallelRanks) when one fails: a shard that cannot load fails the
// startup with that rank's own error; a step whose rank 0 fails while rank 1 waits in a collective
// ends on both (a DeviceError, nothing left waiting), and the group refuses later steps.
void check_failing_ranks(const std::string& dir, const ModelConfig& c) {
  auto load = [&](Communicator* comm) {
    RV_CHECK_ARG(comm->rank() != 1, "rank 1's shard is missing");
    return load_model(dir, c, DType::kF32, Device::kCPU, true, false, comm);
  };
  EXPECT(throws_naming([&] { TensorParallelRanks(2, Device::kCPU, load, 1); }, "rank 1's shard is missing"));
  TensorParallelRanks ranks(2, Device::kCPU, [&](Communicator* comm) {
    return load_model(dir, c, DType::kF32, Device::kCPU, true, false, comm);
  }, 1);
  auto model = load_model(dir, c, DType::kF32, Device::kCPU, true, false, ranks.rank0());
  const CacheLimits limits{4, 4, 64, false};
  const CachePlan plan = plan_caches(model->cache_specs(), limits, 4 << 20, "budget");
  ranks.make_runners(plan, limits, RunnerOptions{64}, model->kv_scales());
  CacheCoordinator caches(plan, limits, Device::kCPU);
  Scheduler scheduler(SchedulerConfig{4, 256, 64}, caches.manager());
  add_prompts(scheduler, {{5, 9, 2, 41}});
  const SchedulerOutput step = scheduler.schedule();
  const std::vector<StateAction> actions = caches.prepare(step.scheduled);
  bool device_error = false;
  try {
    ranks.execute(step, actions, []() -> StepLogits { throw std::runtime_error("rank 0 broke"); });
  } catch (const DeviceError& e) {
    device_error = std::string(e.what()).find("rank 0 broke") != std::string::npos;
  }
  EXPECT(device_error);
  EXPECT(throws_naming([&] { ranks.execute(step, actions, [] { return StepLogits{}; }); }, "failed earlier"));
}

}  // namespace

void run_tensor_parallel_tests() {
  const std::string common = R"("vocab_size": 64, "hidden_size": 32, "num_attention_heads": 4, "num_key_value_heads": 2,
      "max_position_embeddings": 64, "rms_norm_eps": 1e-6, "intermediate_size": 48, "torch_dtype": "float32",
      "num_hidden_layers": 2)";
  check("llama", R"({"architectures": ["LlamaForCausalLM"], "attention_bias": true, )" + common + "}", {1, 2, 4});
  check("qwen3", R"({"architectures": ["Qwen3ForCausalLM"], "head_dim": 16, )" + common + "}", {1, 2, 4});
  // A vocabulary of 66 splits over 2 ranks but not 4 (each of those holds all of it) or 3 heads-wise.
  std::string v66 = common;
  v66.replace(v66.find("\"vocab_size\": 64"), 16, "\"vocab_size\": 66");
  check("llama-v66", R"({"architectures": ["LlamaForCausalLM"], "tie_word_embeddings": true, )" + v66 + "}", {1, 2, 4});
  // MoE and hybrid: Qwen3-MoE (a dense MLP layer among the expert ones); Qwen3-Next (DeltaNet,
  // gated attention, a shared expert routed with the experts, an MTP layer); Qwen3.5 (separate
  // DeltaNet projections, a shared expert of its own size behind its gate).
  const std::string moe = R"("vocab_size": 64, "hidden_size": 32, "num_attention_heads": 4, "num_key_value_heads": 2,
      "head_dim": 8, "max_position_embeddings": 64, "rms_norm_eps": 1e-6, "intermediate_size": 48, "torch_dtype": "float32",
      "num_experts": 4, "num_experts_per_tok": 2, "moe_intermediate_size": 16)";
  const std::string hybrid = moe + R"(, "num_hidden_layers": 4, "linear_num_key_heads": 4, "linear_num_value_heads": 8,
      "linear_key_head_dim": 8, "linear_value_head_dim": 8, "linear_conv_kernel_dim": 4, "full_attention_interval": 2,
      "partial_rotary_factor": 0.5, "mtp_num_hidden_layers": 1)";
  check("qwen3-moe", R"({"architectures": ["Qwen3MoeForCausalLM"], "num_hidden_layers": 2, "mlp_only_layers": [1], )" + moe + "}",
        {1, 2, 4}, true);
  check("qwen3-next", R"({"architectures": ["Qwen3NextForCausalLM"], "shared_expert_intermediate_size": 16, )" + hybrid + "}",
        {1, 2, 4}, true);
  check("qwen3.5", R"({"architectures": ["Qwen3_5MoeForCausalLM"], "shared_expert_intermediate_size": 32, )" + hybrid + "}",
        {1, 2, 4}, true);

  const auto dir = std::filesystem::temp_directory_path() / "revolta-test-tp-llama";
  check_dummy_slices(dir.string());
  ModelConfig c = ModelConfig::from_file((dir / "config.json").string());
  c.max_positions = c.max_position_embeddings;
  check_failing_ranks(dir.string(), c);
  EXPECT(throws_naming([&] { run_sharded(dir.string(), c, 3, 1); }, "tensor_parallel_size 3"));
  const auto next = std::filesystem::temp_directory_path() / "revolta-tp-qwen3-next";
  c = ModelConfig::from_file((next / "config.json").string());
  c.max_positions = c.max_position_embeddings;
  c.linear_num_key_heads = 2, c.linear_num_value_heads = 4;
  EXPECT(throws_naming([&] { run_sharded(next.string(), c, 4, 1); }, "2 DeltaNet key heads do not split over 4"));
  c.linear_num_key_heads = 4, c.linear_num_value_heads = 8;
  c.moe_intermediate_size = 18;
  EXPECT(throws_naming([&] { run_sharded(next.string(), c, 4, 1); }, "18 expert intermediates"));
}
