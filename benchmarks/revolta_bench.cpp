// GPU benchmark of the engine through its public API, with random weights of a real model shape
// (load_format=dummy): decode tok/s at several concurrencies, prefill tok/s at long prompts, the
// bytes one decode step must read and the fraction of the measured read bandwidth achieved.
//
//   revolta_bench --shape llama-8b|llama-1b [--concurrency 1,2,4,8,16,32] [--prefill 2048,8192]
//                 [--prompt 128] [--decode 128] [--eager] [--json FILE]
#include <chrono>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "cuda_ops.h"
#include "revolta/engine.h"

using namespace revolta;
using Clock = std::chrono::steady_clock;

namespace {

struct Shape {
  int hidden, intermediate, layers, heads, kv_heads, vocab;
  bool tied;
};

const std::map<std::string, Shape> kShapes = {
    {"llama-1b", {2048, 8192, 16, 32, 8, 128256, true}},    // Llama-3.2-1B
    {"llama-8b", {4096, 14336, 32, 32, 8, 128256, false}},  // Llama-3.1-8B
};

std::vector<int> parse_list(const std::string& s) {
  std::vector<int> out;
  std::stringstream ss(s);
  for (std::string item; std::getline(ss, item, ',');)
    if (!item.empty()) out.push_back(std::stoi(item));
  return out;
}

std::string write_config(const std::string& name, const Shape& s) {
  const auto dir = std::filesystem::temp_directory_path() / ("revolta-bench-" + name);
  std::filesystem::create_directories(dir);
  std::ofstream f(dir / "config.json");
  f << "{\"architectures\": [\"LlamaForCausalLM\"], \"model_type\": \"llama\", \"hidden_size\": " << s.hidden
    << ", \"intermediate_size\": " << s.intermediate << ", \"num_hidden_layers\": " << s.layers
    << ", \"num_attention_heads\": " << s.heads << ", \"num_key_value_heads\": " << s.kv_heads
    << ", \"vocab_size\": " << s.vocab << ", \"tie_word_embeddings\": " << (s.tied ? "true" : "false")
    << ", \"max_position_embeddings\": 131072, \"rms_norm_eps\": 1e-5, \"rope_theta\": 500000.0,"
    << " \"rope_scaling\": {\"rope_type\": \"llama3\", \"factor\": 32.0, \"low_freq_factor\": 1.0,"
    << " \"high_freq_factor\": 4.0, \"original_max_position_embeddings\": 8192},"
    << " \"torch_dtype\": \"bfloat16\", \"bos_token_id\": 128000, \"eos_token_id\": 128001}\n";
  return dir.string();
}

std::vector<int32_t> random_prompt(int n, int vocab, std::mt19937& rng) {
  std::uniform_int_distribution<int> d(1000, vocab - 1000);
  std::vector<int32_t> p(static_cast<size_t>(n));
  for (auto& t : p) t = d(rng);
  return p;
}

// Runs `prompts` to completion; returns (seconds after every request had its first token,
// tokens generated in that time).
std::pair<double, int64_t> run_decode(Engine& e, const std::vector<std::vector<int32_t>>& prompts, int max_tokens) {
  SamplingParams sp;
  sp.temperature = 0.0f;
  sp.max_tokens = max_tokens;
  sp.ignore_eos = true;
  auto ids = e.add_requests(prompts, std::vector<SamplingParams>(prompts.size(), sp));
  std::map<uint64_t, int> got;
  size_t finished = 0;
  bool timing = false;
  Clock::time_point t0;
  int64_t at_t0 = 0, total = 0;
  while (finished < ids.size()) {
    for (const auto& o : e.await_outputs(std::chrono::milliseconds(100))) {
      got[o.request_id] += int(o.tokens.size());
      total += int64_t(o.tokens.size());
      finished += o.finished;
    }
    if (!timing && got.size() == ids.size()) timing = true, t0 = Clock::now(), at_t0 = total;
  }
  return {std::chrono::duration<double>(Clock::now() - t0).count(), total - at_t0};
}

}  // namespace

int main(int argc, char** argv) {
  std::string shape_name = "llama-8b", json_path;
  std::vector<int> conc = {1, 2, 4, 8, 16, 32}, prefill = {2048, 8192};
  int prompt = 128, decode = 128;
  bool eager = false;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    auto next = [&] { return i + 1 < argc ? std::string(argv[++i]) : std::string(); };
    if (a == "--shape") shape_name = next();
    else if (a == "--concurrency") conc = parse_list(next());
    else if (a == "--prefill") prefill = parse_list(next());
    else if (a == "--prompt") prompt = std::stoi(next());
    else if (a == "--decode") decode = std::stoi(next());
    else if (a == "--eager") eager = true;
    else if (a == "--json") json_path = next();
    else {
      std::fprintf(stderr, "unknown argument %s\n", a.c_str());
      return 2;
    }
  }
  if (!kShapes.count(shape_name)) {
    std::fprintf(stderr, "--shape must be llama-1b or llama-8b\n");
    return 2;
  }
  const Shape s = kShapes.at(shape_name);
  const double read_bw = cuda::measure_read_bandwidth(size_t(4) << 30);
  std::printf("device: %s\nmeasured streaming-read bandwidth: %.0f GB/s\n", cuda::device_name().c_str(), read_bw / 1e9);

  EngineConfig cfg;
  cfg.model = write_config(shape_name, s);
  cfg.device = "cuda";
  cfg.load_format = "dummy";
  int max_prefill = 0;
  for (int p : prefill) max_prefill = std::max(max_prefill, p);
  int max_conc = 1;
  for (int c : conc) max_conc = std::max(max_conc, c);
  cfg.max_model_len = std::max(max_prefill + 16, prompt + decode + 16);
  cfg.max_num_seqs = max_conc;
  cfg.max_num_batched_tokens = std::max(2048, std::min(max_prefill, 8192));
  cfg.gpu_memory_utilization = 0.85f;
  cfg.enforce_eager = eager;
  cfg.enable_prefix_caching = false;  // every prefill is measured in full
  Engine engine(cfg);
  const ModelInfo& info = engine.model_info();
  const int64_t head_dim = s.hidden / s.heads;
  const int64_t kv_token_bytes = int64_t(2) * s.layers * s.kv_heads * head_dim * 2;  // f16 KV
  // One decode step reads every weight except the embedding table (only its B rows), unless tied.
  const int64_t embed_bytes = int64_t(s.vocab) * s.hidden * 2;
  const int64_t step_weights = info.weight_bytes - (s.tied ? 0 : embed_bytes);
  std::printf("shape %s: %.2f GB of fp16 weights, %.2f GB read per decode step + KV; KV pool %.1f GB; %s\n",
              shape_name.c_str(), info.weight_bytes / 1e9, step_weights / 1e9, info.kv_cache_bytes / 1e9,
              eager ? "eager" : "decode graphs");

  std::mt19937 rng(1);
  std::ostringstream js;
  js << "{\"shape\": \"" << shape_name << "\", \"device\": \"" << info.device << "\", \"read_bw_gbs\": " << read_bw / 1e9
     << ", \"weight_bytes\": " << info.weight_bytes << ", \"decode\": [";
  run_decode(engine, {random_prompt(prompt, s.vocab, rng)}, 8);  // warm-up: graphs, allocator
  std::printf("%-12s %12s %12s %16s %10s\n", "concurrency", "tok/s", "ms/step", "GB read/step", "of read bw");
  for (size_t i = 0; i < conc.size(); ++i) {
    const int c = conc[i];
    std::vector<std::vector<int32_t>> ps;
    for (int j = 0; j < c; ++j) ps.push_back(random_prompt(prompt, s.vocab, rng));
    auto [secs, toks] = run_decode(engine, ps, decode);
    const double tps = toks / secs, step_s = c / tps;
    const double bytes = double(step_weights) + double(c) * (prompt + decode / 2.0) * kv_token_bytes;
    const double frac = bytes / step_s / read_bw;
    std::printf("%-12d %12.1f %12.2f %16.3f %9.1f%%\n", c, tps, step_s * 1e3, bytes / 1e9, 100 * frac);
    js << (i ? ", " : "") << "{\"concurrency\": " << c << ", \"tok_s\": " << tps << ", \"step_ms\": " << step_s * 1e3
       << ", \"bytes_per_step\": " << bytes << ", \"bw_fraction\": " << frac << "}";
  }
  js << "], \"prefill\": [";
  for (size_t i = 0; i < prefill.size(); ++i) {
    const int p = prefill[i];
    run_decode(engine, {random_prompt(p, s.vocab, rng)}, 1);  // warm-up at this length
    const auto t0 = Clock::now();
    run_decode(engine, {random_prompt(p, s.vocab, rng)}, 1);
    const double secs = std::chrono::duration<double>(Clock::now() - t0).count();
    std::printf("prefill %6d tokens: %8.1f ms  %10.0f tok/s\n", p, secs * 1e3, p / secs);
    js << (i ? ", " : "") << "{\"tokens\": " << p << ", \"tok_s\": " << p / secs << "}";
  }
  js << "]}";
  std::printf("JSON %s\n", js.str().c_str());
  if (!json_path.empty()) std::ofstream(json_path) << js.str() << "\n";
  return 0;
}
