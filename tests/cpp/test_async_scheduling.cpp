// Async scheduling on the CPU (the engine keeps the same books as on a device): requests that join
// and leave while a step is queued ahead get exactly the tokens of the plain loop. Requests join
// and leave from the output callbacks, which run on the engine thread between steps, so they land
// while a step is queued.
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>
#include <mutex>
#include <thread>

#include "expect.h"
#include "revolta/engine.h"

using namespace revolta;

namespace {

std::string write_hybrid_config() {
  const auto dir = std::filesystem::temp_directory_path() / "revolta-async-scheduling";
  std::filesystem::create_directories(dir);
  std::ofstream(dir / "config.json") << R"({"architectures": ["Qwen3NextForCausalLM"], "vocab_size": 512,
      "hidden_size": 64, "intermediate_size": 96, "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 16,
      "num_hidden_layers": 4, "num_experts": 8, "num_experts_per_tok": 2, "moe_intermediate_size": 32,
      "shared_expert_intermediate_size": 32, "linear_num_key_heads": 2, "linear_num_value_heads": 4,
      "linear_key_head_dim": 16, "linear_value_head_dim": 16, "linear_conv_kernel_dim": 4, "full_attention_interval": 4,
      "partial_rotary_factor": 0.25, "max_position_embeddings": 256, "rms_norm_eps": 1e-6, "torch_dtype": "float32",
      "eos_token_id": 2})";
  return dir.string();
}

EngineConfig config(const std::string& dir, const char* async) {
  EngineConfig c;
  c.model = dir;
  c.load_format = "dummy";
  c.async_scheduling = async;
  c.max_model_len = 256;
  c.kv_cache_memory_bytes = int64_t(16) << 20;
  c.num_threads = 2;
  return c;
}

SamplingParams greedy(int32_t max_tokens) {
  SamplingParams p;
  p.temperature = 0.0f;
  p.max_tokens = max_tokens;
  p.ignore_eos = true;
  return p;
}

std::vector<int32_t> prompt(int32_t n, int32_t salt) {
  std::vector<int32_t> p;
  for (int32_t i = 0; i < n; ++i) p.push_back(3 + (i * 37 + salt * 101) % 500);
  return p;
}

std::vector<int32_t> alone(Engine& e, const std::vector<int32_t>& p, int32_t max_tokens) {
  e.add_request(p, greedy(max_tokens));
  std::vector<int32_t> out;
  for (bool done = false; !done;)
    for (const auto& o : e.await_outputs(std::chrono::milliseconds(100))) {
      for (const auto& t : o.tokens) out.push_back(t.token);
      done = o.finished;
    }
  return out;
}

struct Log {
  std::mutex mu;
  std::map<uint64_t, std::vector<int32_t>> tokens;
  std::map<uint64_t, FinishReason> finished;
  size_t record(const RequestOutput& o) {
    std::lock_guard<std::mutex> lk(mu);
    auto& t = tokens[o.request_id];
    for (const auto& x : o.tokens) t.push_back(x.token);
    if (o.finished) finished[o.request_id] = o.finish_reason;
    return t.size();
  }
};

}  // namespace

void run_async_scheduling_tests() {
  const std::string dir = write_hybrid_config();
  const auto pa = prompt(21, 1), pb = prompt(9, 2), pc = prompt(40, 3);
  std::vector<int32_t> ref_a, ref_b, ref_c;
  {
    Engine plain(config(dir, "off"));
    ref_a = alone(plain, pa, 40);
    ref_b = alone(plain, pb, 20);
    ref_c = alone(plain, pc, 40);
    EXPECT(plain.stats().steps_run_ahead == 0);
  }
  Engine e(config(dir, "on"));
  EXPECT(alone(e, pa, 40) == ref_a);  // alone: every decode step after the first is queued ahead
  const int64_t ahead_alone = e.stats().steps_run_ahead;
  EXPECT(ahead_alone >= 30);

  Log log;
  uint64_t b = 0, c = 0;
  bool joined = false, aborted = false;
  const OutputCallback on_c = [&](const RequestOutput& o) {
    if (log.record(o) >= 3 && !aborted) aborted = true, e.abort(o.request_id);
  };
  const OutputCallback on_b = [&](const RequestOutput& o) { log.record(o); };
  const OutputCallback on_a = [&](const RequestOutput& o) {
    if (log.record(o) >= 5 && !joined) {
      joined = true;
      b = e.add_request(pb, greedy(20), on_b);
      c = e.add_request(pc, greedy(40), on_c);
    }
  };
  const uint64_t a = e.add_request(pa, greedy(40), on_a);
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(60);
  for (;;) {
    {
      std::lock_guard<std::mutex> lk(log.mu);
      if (log.finished.size() == 3 || std::chrono::steady_clock::now() > deadline) break;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  std::lock_guard<std::mutex> lk(log.mu);
  EXPECT(log.finished.size() == 3);
  EXPECT(log.tokens[a] == ref_a);
  EXPECT(log.tokens[b] == ref_b);
  const auto& tc = log.tokens[c];
  EXPECT(log.finished[c] == FinishReason::kAbort);
  EXPECT(tc.size() >= 3 && tc.size() < ref_c.size() && std::equal(tc.begin(), tc.end(), ref_c.begin()));
  EXPECT(e.stats().steps_run_ahead > ahead_alone);
  EXPECT(e.stats().num_blocks_used == 0);
  std::printf("async scheduling: %lld steps queued ahead, request c aborted after %zu tokens\n",
              (long long)e.stats().steps_run_ahead, tc.size());
}
