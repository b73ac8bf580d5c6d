// Tensor parallelism's GPU path on the GPUs this machine has (run by tests/gpu/test_gpu_tensor_parallel.py):
// NCCL communicators' collectives on device tensors, and sharded models (dense and hybrid MoE, made-up
// weights) driven through a NCCL communicator: their logits over a prefill and decode steps, eager
// and with the collectives recorded into decode graphs, equal the unsharded model's. With one GPU
// the group has one rank, which still takes every sharded code path (the vocabulary-parallel
// embedding and LM head, the all-reduces before each residual add). Prints "N passed, M failed".
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <memory>
#include <string>
#include <vector>

#include "cache/cache_coordinator.h"
#include "core/device_runtime.h"
#include "dist/communicator.h"
#include "dist/custom_all_reduce.h"
#include "cuda_ops.h"
#include "model/model.h"
#include "runtime/model_runner.h"
#include "runner_rig.h"

using namespace revolta;

namespace {

int g_passed = 0, g_failed = 0;

void expect(bool ok, const std::string& what) {
  (ok ? g_passed : g_failed)++;
  if (!ok) std::printf("FAILED %s\n", what.c_str());
}

float max_diff(const Tensor& a, const Tensor& b) {
  if (a.numel() != b.numel()) return INFINITY;
  float d = 0.0f;
  for (int64_t i = 0; i < a.numel(); ++i) d = std::fmax(d, std::fabs(a.ptr<float>()[i] - b.ptr<float>()[i]));
  return d;
}

void test_collectives(Communicator& c) {
  const int64_t n = 1000;
  Tensor host = Tensor::empty({n}, DType::kF32);
  for (int64_t i = 0; i < n; ++i) host.ptr<float>()[i] = float(i % 97) * 0.5f - 3.0f;
  Tensor x = host.to(Device::kCUDA);
  c.all_reduce_sum(x);
  Tensor gathered = Tensor::uninitialized({c.world_size() * n}, DType::kF32, Device::kCUDA);
  c.all_gather(x, gathered);
  c.broadcast(x, 0);
  const Tensor sum = x.to(Device::kCPU), all = gathered.to(Device::kCPU);
  bool ok = true;
  for (int64_t i = 0; i < n; ++i) ok = ok && sum.ptr<float>()[i] == host.ptr<float>()[i] * float(c.world_size());
  for (int64_t i = 0; i < c.world_size() * n; ++i) ok = ok && all.ptr<float>()[i] == sum.ptr<float>()[i % n];
  expect(ok, "NCCL all-reduce / all-gather / broadcast on device tensors");
}

// The logits of two prompts prefilled in one step and `steps` decode steps (every rank feeds the
// same tokens); graphs: decode steps replay recorded graphs.
std::vector<Tensor> run(const std::string& dir, const ModelConfig& c, Communicator* tp, bool graphs, int64_t* replays) {
  auto model = load_model(dir, c, DType::kF16, Device::kCUDA, /*dummy=*/true, /*gguf=*/false, tp);
  CacheSpecs specs = model->cache_specs();
  for (CacheGroupSpec& g : specs)
    if (g.kind == CacheGroupSpec::Kind::kPagedKv) g.kv.dtype = DType::kF16;
  const CacheLimits limits{16, 4, 128, false};
  CacheCoordinator caches(plan_caches(specs, limits, 32 << 20, "budget"), limits, Device::kCUDA);
  Scheduler scheduler(SchedulerConfig{4, 512, 128}, caches.manager());
  RunnerOptions o;
  o.max_model_len = 128;
  if (graphs) o.graph_batch_sizes = {1, 2, 4};
  ModelRunner runner(*model, caches.kv(), caches.states(), o);
  if (graphs) runner.capture_graphs();
  add_prompts(scheduler, {{5, 9, 2, 41, 7, 33, 18, 3, 11}, {8, 1, 60, 22, 4}});
  std::vector<Tensor> logits;
  for (int s = 0; s <= 4; ++s) {
    SchedulerOutput plan = scheduler.schedule();
    StepLogits out = runner.execute(plan, caches.prepare(plan.scheduled));
    logits.push_back(out.logits.to(Device::kCPU));
    for (const auto& sr : plan.scheduled) {
      sr.request->num_computed_tokens += sr.num_new_tokens;
      caches.commit(*sr.request);
      sr.request->tokens.push_back(int32_t(7 * s + 3 * sr.request->id) % 64);
    }
  }
  *replays = runner.graph_replays();
  return logits;
}

void test_model(const std::string& name, const std::string& json, Communicator& comm) {
  const auto dir = std::filesystem::temp_directory_path() / ("revolta-gpu-tp-" + name);
  std::filesystem::create_directories(dir);
  std::ofstream(dir / "config.json") << json;
  ModelConfig c = ModelConfig::from_file((dir / "config.json").string());
  c.max_positions = c.max_position_embeddings;
  int64_t replays = 0;
  const std::vector<Tensor> want = run(dir.string(), c, nullptr, false, &replays);
  for (bool graphs : {false, true}) {
    const std::vector<Tensor> got = run(dir.string(), c, &comm, graphs, &replays);
    float worst = 0.0f;
    for (size_t s = 0; s < want.size(); ++s) worst = std::fmax(worst, max_diff(want[s], got[s]));
    std::printf("%s through %d NCCL rank(s)%s: max |logit diff| %g, %lld graph replays\n", name.c_str(),
                comm.world_size(), graphs ? " with decode graphs" : "", worst, (long long)replays);
    expect(got.size() == want.size() && worst < 2e-3f, name + (graphs ? " (graphs)" : " (eager)") + " logits");
    expect(!graphs || replays >= 4, name + ": the decode steps replayed graphs");
  }
}

// The one-shot custom all-reduce's kernel with `world` ranks on this one GPU: their buffers are all
// local, each rank's kernel runs on a stream of its own (the ranks' blocks meet at flags, so they
// must run at once: world x kCustomBlocks blocks fit the GPU). Four calls a size, one shot and two
// shots in turn (the meeting counts advance), every rank's result against the rank-order sum on the
// host, bit for bit.
void test_custom_all_reduce(int world) {
  auto custom = cuda::CustomAllReduce::create(std::vector<int>(size_t(world), 0), size_t(1) << 20);
  expect(custom != nullptr, "custom all-reduce buffers on one GPU");
  if (!custom) return;
  std::vector<cudaStream_t> streams(static_cast<size_t>(world));
  for (auto& s : streams) cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking);
  for (int64_t n : {1, 1000, 4096, 131072, 262144}) {
    bool exact = true;
    for (int call = 0; call < 4; ++call) {  // one shot and two shots in turn (their meetings interleave)
      const bool two_shot = call % 2 == 1;
      std::vector<Tensor> host, dev;
      for (int r = 0; r < world; ++r) {
        Tensor h = Tensor::empty({n}, DType::kF32);
        for (int64_t i = 0; i < n; ++i) h.ptr<float>()[i] = float((i * 7 + r * 13 + call * 5) % 101) * 0.37f - 11.0f;
        host.push_back(h);
        dev.push_back(h.to(Device::kCUDA));
      }
      cuda::synchronize();
      for (int r = 0; r < world; ++r)
        cuda::launch_custom_all_reduce(custom->peers(), r, dev[size_t(r)].ptr<float>(), n, streams[size_t(r)], two_shot);
      for (auto& s : streams) cudaStreamSynchronize(s);
      for (int r = 0; r < world; ++r) {
        const Tensor got = dev[size_t(r)].to(Device::kCPU);
        for (int64_t i = 0; i < n; ++i) {
          float sum = 0.0f;
          for (int q = 0; q < world; ++q) sum += host[size_t(q)].ptr<float>()[i];
          exact = exact && got.ptr<float>()[i] == sum;
        }
      }
    }
    expect(exact, "custom all-reduce (one and two shots) over " + std::to_string(world) + " ranks of " +
                      std::to_string(n) + " floats");
  }
  for (auto& s : streams) cudaStreamDestroy(s);
  std::printf("custom all-reduce, %d ranks on one GPU: checked\n", world);
}

}  // namespace

int main() {
  try {
    expect(has_gpu_communicators(), "this build found NCCL");
    if (!has_gpu_communicators()) throw std::runtime_error("no NCCL in this build");
    // One GPU here: one rank (ncclCommInitAll refuses a device twice).
    GpuCommunicators comms = make_gpu_communicators(1);
    test_collectives(*comms[0]);
    for (int world : {2, 4}) test_custom_all_reduce(world);
    const std::string common = R"("vocab_size": 64, "hidden_size": 64, "num_attention_heads": 4, "num_key_value_heads": 2,
        "head_dim": 16, "max_position_embeddings": 128, "rms_norm_eps": 1e-6, "intermediate_size": 128,
        "torch_dtype": "float16")";
    test_model("llama", R"({"architectures": ["LlamaForCausalLM"], "num_hidden_layers": 2, )" + common + "}", *comms[0]);
    test_model("qwen3-next", R"({"architectures": ["Qwen3NextForCausalLM"], "num_hidden_layers": 4, "num_experts": 4,
        "num_experts_per_tok": 2, "moe_intermediate_size": 64, "shared_expert_intermediate_size": 64,
        "linear_num_key_heads": 2, "linear_num_value_heads": 4, "linear_key_head_dim": 32, "linear_value_head_dim": 32,
        "linear_conv_kernel_dim": 4, "full_attention_interval": 2, "partial_rotary_factor": 0.25, )" + common + "}",
               *comms[0]);
  } catch (const std::exception& e) {
    std::printf("FAILED with an exception: %s\n", e.what());
    ++g_failed;
  }
  std::printf("%d passed, %d failed\n", g_passed, g_failed);
  return g_failed == 0 ? 0 : 1;
}
