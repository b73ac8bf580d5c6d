// Benchmark of the engine through its public API, with random weights of a real model shape
// (load_format=dummy): decode tok/s at several concurrencies, prefill tok/s at long prompts, the
// bytes one decode step must read and the fraction of the measured read bandwidth achieved, and of
// the SM70 roofline (the larger of bytes over that bandwidth and FLOPs over the measured
// mma.sync.m8n8k4 peak, core/peaks.cu), with what a V100 would take at the fraction this run reached
// of the roofline of the wmma shape the GEMMs use (a later GPU runs it faster than m8n8k4).
//
//   revolta_bench --shape llama-8b|llama-1b|qwen3-next-80b|flash-next [--layers N] [--device cuda|cpu]
//                 [--concurrency 1,2,4,8,16,32] [--prefill 2048,8192] [--prompt 128] [--decode 128]
//                 [--eager] [--no-dependent-launch] [--async-scheduling auto|on|off] [--json FILE]
//                 [--probe FILE] [--max-model-len N] [--quantization awq] [--tensor-parallel-size N]
//                 [--kv-cache-dtype auto|fp8|int8] [--speculative-method mtp|ngram --num-speculative-tokens K]
//
// qwen3-next-80b is Qwen3-Next-80B-A3B's shape (hidden 2048, 512 experts top-10, its attention and
// Gated DeltaNet dimensions); its 48 layers in fp16 do not fit one 141 GB GPU, so it runs 32 unless
// --layers says otherwise (printed), or all 48 with 4-bit experts. Bytes per decode step count what a token touches: the
// non-expert weights, the router, the top-k and shared experts, the head, the recurrent state
// (read and written) and the KV of its context.
// flash-next is Flash-Next (Qwen4ExpForCausalLM) on the same dimensions, with what its config is
// assumed to hold (transformers' defaults where they exist): 4 hyper-connection streams of rank 320,
// QSA on the full-attention layers (8 indexer heads of 128, ratio 4, budget 2048), PLE on layer 1
// (3-grams, 8 heads per n-gram, conv 4, 2048 wide) over a table of 1M rows per head (the released
// 20M would need 82 GB of host memory for made-up rows). Vocabulary 248,320.
// --probe FILE (a build with -DREVOLTA_PROBE=ON): after the decode runs, a few more decode steps of
// one sequence with the decode kernels' phase timestamps logged, written to FILE as CSV
// (kind,point,block,time_ns; benchmarks/probe_summary.py reads it).
// --max-model-len N: the engine's context limit (default: the longest prefill, or prompt + decode,
// plus 16). Decode graphs are recorded for it, so decode runs with and without long prefills
// compare at the same limit only when it is given.
// --quantization awq: the linear layers in 4-bit groups of 128 (made-up values), the byte counts
// with them (the hybrid decoder's input projections stay 16-bit).
// --kv-cache-dtype fp8|int8: the KV cache in E4M3 / int8 (made-up scales of 1), the KV bytes with it.
// --speculative-method mtp: the hybrid shape with one made-up MTP layer drafting K tokens a step
// (made-up weights accept nothing: REVOLTA_FAULT_INJECT=accept-drafts:R forces R accepted a step);
// each decode figure then carries the drafts accepted per verify step.
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "revolta/engine.h"
#if REVOLTA_WITH_CUDA
#include "cuda_ops.h"
#endif

using namespace revolta;
using Clock = std::chrono::steady_clock;

namespace {

struct Shape {
  int hidden, intermediate, layers, heads, kv_heads, vocab;
  bool tied;
  // Qwen3-Next: head_dim, experts, GDN dims (0 for the Llama shapes)
  int head_dim = 0, experts = 0, top_k = 0, moe_inter = 0, shared_inter = 0;
  int lin_k_heads = 0, lin_v_heads = 0, lin_k_dim = 0, lin_v_dim = 0, attn_every = 0;
  bool flash = false;  // Flash-Next: the hybrid plus kFlash's parts
  bool hybrid() const { return experts > 0; }
};

// Flash-Next's assumed parts (see the header): streams, their rank, indexer heads and width, PLE
// heads and width.
struct FlashParts {
  int hc = 4, hc_rank = 320, indexer_heads = 8, indexer_dim = 128, ple_heads = 16, ple_dim = 2048;
};
constexpr FlashParts kFlash;

const std::map<std::string, Shape> kShapes = {
    {"llama-1b", {2048, 8192, 16, 32, 8, 128256, true}},    // Llama-3.2-1B
    {"llama-8b", {4096, 14336, 32, 32, 8, 128256, false}},  // Llama-3.1-8B
    {"qwen3-next-80b", {2048, 5120, 48, 16, 2, 151936, false, 256, 512, 10, 512, 512, 16, 32, 128, 128, 4}},
    {"flash-next", {2048, 5120, 48, 16, 2, 248320, false, 256, 512, 10, 512, 512, 16, 32, 128, 128, 4, true}},
};

std::vector<int> parse_list(const std::string& s) {
  std::vector<int> out;
  std::stringstream ss(s);
  for (std::string item; std::getline(ss, item, ',');)
    if (!item.empty()) out.push_back(std::stoi(item));
  return out;
}

// mtp_layers: the checkpoint's multi-token-prediction layers (hybrid shapes; made up like the rest).
std::string write_config(const std::string& name, const Shape& s, int mtp_layers) {
  const auto dir = std::filesystem::temp_directory_path() /
                   ("revolta-bench-" + name + "-" + std::to_string(s.layers) + (mtp_layers ? "-mtp" : ""));
  std::filesystem::create_directories(dir);
  std::ofstream f(dir / "config.json");
  f << "{\"hidden_size\": " << s.hidden << ", \"intermediate_size\": " << s.intermediate
    << ", \"num_hidden_layers\": " << s.layers << ", \"num_attention_heads\": " << s.heads
    << ", \"num_key_value_heads\": " << s.kv_heads << ", \"vocab_size\": " << s.vocab
    << ", \"tie_word_embeddings\": " << (s.tied ? "true" : "false") << ", \"torch_dtype\": \"bfloat16\", ";
  if (s.flash) {
    f << "\"architectures\": [\"Qwen4ExpForCausalLM\"], \"model_type\": \"qwen4_exp_text\", \"hc_count\": " << kFlash.hc
      << ", \"hc_lowrank\": " << kFlash.hc_rank << ", \"indexer_n_heads\": " << kFlash.indexer_heads
      << ", \"indexer_head_dim\": " << kFlash.indexer_dim << ", \"indexer_kv_heads\": 1, \"indexer_budget\": 2048,"
      << " \"indexer_compress_ratio\": 4, \"ple_layer_ids\": [1], \"ngram_size\": 3, \"heads_per_ngram\": 8,"
      << " \"ple_conv_kernel_size\": 4, \"ple_embed_dim\": " << kFlash.ple_dim << ", \"ngram_vocab_size_base\": 1000000,"
      << " \"make_ngram_vocab_size_divisible_by\": 128, \"output_gate_type\": \"sigmoid\", ";
  }
  if (s.hybrid()) {
    if (!s.flash) f << "\"architectures\": [\"Qwen3NextForCausalLM\"], \"model_type\": \"qwen3_next\", ";
    f << "\"head_dim\": " << s.head_dim
      << ", \"max_position_embeddings\": 262144, \"rms_norm_eps\": 1e-6, \"rope_theta\": 10000000.0,"
      << " \"partial_rotary_factor\": 0.25, \"num_experts\": " << s.experts << ", \"num_experts_per_tok\": " << s.top_k
      << ", \"moe_intermediate_size\": " << s.moe_inter << ", \"shared_expert_intermediate_size\": " << s.shared_inter
      << ", \"norm_topk_prob\": true, \"decoder_sparse_step\": 1, \"mlp_only_layers\": [],"
      << " \"linear_num_key_heads\": " << s.lin_k_heads << ", \"linear_num_value_heads\": " << s.lin_v_heads
      << ", \"linear_key_head_dim\": " << s.lin_k_dim << ", \"linear_value_head_dim\": " << s.lin_v_dim
      << ", \"linear_conv_kernel_dim\": 4, \"full_attention_interval\": " << s.attn_every
      << ", \"mtp_num_hidden_layers\": " << mtp_layers << ", \"bos_token_id\": 151643, \"eos_token_id\": 151645}\n";
  } else {
    f << "\"architectures\": [\"LlamaForCausalLM\"], \"model_type\": \"llama\", \"max_position_embeddings\": 131072,"
      << " \"rms_norm_eps\": 1e-5, \"rope_theta\": 500000.0, \"rope_scaling\": {\"rope_type\": \"llama3\", \"factor\": 32.0,"
      << " \"low_freq_factor\": 1.0, \"high_freq_factor\": 4.0, \"original_max_position_embeddings\": 8192},"
      << " \"bos_token_id\": 128000, \"eos_token_id\": 128001}\n";
  }
  return dir.string();
}

// Bytes one decoded token reads (weights it touches in fp16, or the linear layers' at `linear`
// bytes a value when they are 4-bit, the router in f32, recurrent state read + written in f32) and
// KV bytes per context token (kv: bytes per cached value, 2 for fp16).
struct TokenBytes {
  double weights = 0;      // read once per step whatever the batch
  double per_expert = 0;   // one routed expert, summed over the layers
  double state = 0, kv_per_ctx = 0;
};

// Flash-Next's weights beyond the hybrid's, all linear layers: two stream mixes a layer and the last
// one (down + inject, up), the indexers' projections, the PLE layer's key and value projections.
double flash_weights(const Shape& s) {
  const double hcE = double(kFlash.hc) * s.hidden, r = kFlash.hc_rank;
  const double mixes = (2.0 * s.layers + 1) * (2 * r + kFlash.hc) * hcE;
  const double indexer = double(s.layers / s.attn_every) * (kFlash.indexer_heads + 1.0) * kFlash.indexer_dim * s.hidden;
  return mixes + indexer + (hcE + s.hidden) * kFlash.ple_dim;
}

TokenBytes token_bytes(const Shape& s, double linear, double kv) {
  TokenBytes b;
  const double H = s.hidden;
  if (!s.hybrid()) {
    const double D = H / s.heads;
    b.weights = s.layers * (H * D * (2.0 * s.heads + 2.0 * s.kv_heads) + 3.0 * H * s.intermediate) * linear +
                double(s.vocab) * H * 2;
    b.kv_per_ctx = 2.0 * s.layers * s.kv_heads * D * kv;
    return b;
  }
  const int attn_layers = s.layers / s.attn_every, lin_layers = s.layers - attn_layers;
  const double key_dim = double(s.lin_k_heads) * s.lin_k_dim, value_dim = double(s.lin_v_heads) * s.lin_v_dim;
  // 16-bit: DeltaNet's projections and attention's input projection; at `linear`: attention's
  // output projection and the experts (the hybrid decoder's quantized layers)
  const double gdn = (2 * key_dim + 2 * value_dim + 2.0 * s.lin_v_heads) * H + H * value_dim;
  const double attn = (2.0 * s.heads * s.head_dim + 2.0 * s.kv_heads * s.head_dim) * H * 2 + H * s.heads * s.head_dim * linear;
  const double shared = 3.0 * s.shared_inter * H * linear + H * 4;
  b.weights = lin_layers * gdn * 2 + attn_layers * attn + s.layers * shared + s.layers * double(s.experts) * H * 4 +
              double(s.vocab) * H * 2;
  if (s.flash) b.weights += flash_weights(s) * linear;
  b.per_expert = s.layers * 3.0 * s.moe_inter * H * linear;
  b.state = 2.0 * lin_layers * s.lin_v_heads * s.lin_k_dim * s.lin_v_dim * 4;
  b.kv_per_ctx = 2.0 * attn_layers * s.kv_heads * s.head_dim * kv;
  return b;
}

// FLOPs of one decoded token over a context of ctx tokens: 2 per weight it multiplies (the
// experts it picks, the head), attention's two products over the context, the delta rule's state
// update and read-out.
double token_flops(const Shape& s, double ctx) {
  const double H = s.hidden;
  if (!s.hybrid()) {
    const double D = H / s.heads;
    return 2.0 * (s.layers * (H * D * (2.0 * s.heads + 2.0 * s.kv_heads) + 3.0 * H * s.intermediate) + double(s.vocab) * H) +
           4.0 * s.layers * s.heads * D * ctx;
  }
  const int attn_layers = s.layers / s.attn_every, lin_layers = s.layers - attn_layers;
  const double key_dim = double(s.lin_k_heads) * s.lin_k_dim, value_dim = double(s.lin_v_heads) * s.lin_v_dim;
  const double gdn = (2 * key_dim + 2 * value_dim + 2.0 * s.lin_v_heads) * H + H * value_dim;
  const double attn = (3.0 * s.heads * s.head_dim + 2.0 * s.kv_heads * s.head_dim) * H;  // q + gate, k, v, o
  const double ffn = 3.0 * s.shared_inter * H + (s.experts + 1.0) * H + s.top_k * 3.0 * s.moe_inter * H;
  return 2.0 * (lin_layers * gdn + attn_layers * attn + s.layers * ffn + double(s.vocab) * H + (s.flash ? flash_weights(s) : 0.0)) +
         4.0 * attn_layers * s.heads * s.head_dim * ctx + 4.0 * lin_layers * s.lin_v_heads * s.lin_k_dim * s.lin_v_dim;
}

// seconds(): the SM70 roofline (m8n8k4 peak). native_seconds(): the same with the peak of the wmma
// shape the GEMMs are written in, which a later GPU runs on its own tensor cores. A V100 estimate
// is a range: at the fraction reached of the native roofline (low: a V100's tensor cores are not
// the bottleneck that the later GPU's are), and at the fraction reached of the SM70 roofline, at
// most all of it (high).
struct Roofline {
  double read_bw = 0, mma_flops = 0, wmma_flops = 0;
  double seconds(double bytes, double flops) const {
    return read_bw > 0 && mma_flops > 0 ? std::max(bytes / read_bw, flops / mma_flops) : 0.0;
  }
  double native_seconds(double bytes, double flops) const {
    return read_bw > 0 && wmma_flops > 0 ? std::max(bytes / read_bw, flops / wmma_flops) : 0.0;
  }
  // {slowest, fastest} seconds of the run's work on a V100 (900 GB/s, 125 TFLOP/s); {0, 0} unmeasured.
  std::pair<double, double> v100_seconds(double bytes, double flops, double run_s) const {
    const double native = native_seconds(bytes, flops), sm70 = seconds(bytes, flops);
    if (native <= 0 || sm70 <= 0) return {0.0, 0.0};
    const double v100 = std::max(bytes / 900e9, flops / 125e12);
    return {v100 / std::min(1.0, native / run_s), v100 / std::min(1.0, sm70 / run_s)};
  }
};

std::vector<int32_t> random_prompt(int n, int vocab, std::mt19937& rng) {
  std::uniform_int_distribution<int> d(1000, vocab - 1000);
  std::vector<int32_t> p(static_cast<size_t>(n));
  for (auto& t : p) t = d(rng);
  return p;
}

// Runs `prompts` to completion; returns (seconds after every request had its first token,
// tokens generated in that time). digest: an FNV-1a hash of every request's tokens in order (runs
// of one shape compare their greedy output by it, e.g. across tensor_parallel_size).
std::pair<double, int64_t> run_decode(Engine& e, const std::vector<std::vector<int32_t>>& prompts, int max_tokens,
                                      uint64_t* digest = nullptr) {
  SamplingParams sp;
  sp.temperature = 0.0f;
  sp.max_tokens = max_tokens;
  sp.ignore_eos = true;
  auto ids = e.add_requests(prompts, std::vector<SamplingParams>(prompts.size(), sp));
  std::map<uint64_t, int> got;
  std::map<uint64_t, std::vector<int32_t>> tokens;
  size_t finished = 0;
  bool timing = false;
  Clock::time_point t0;
  int64_t at_t0 = 0, total = 0;
  while (finished < ids.size()) {
    for (const auto& o : e.await_outputs(std::chrono::milliseconds(100))) {
      got[o.request_id] += int(o.tokens.size());
      total += int64_t(o.tokens.size());
      for (const auto& t : o.tokens) tokens[o.request_id].push_back(t.token);
      finished += o.finished;
      if (!o.error.empty()) throw std::runtime_error("request " + std::to_string(o.request_id) + " failed: " + o.error);
    }
    if (!timing && got.size() == ids.size()) timing = true, t0 = Clock::now(), at_t0 = total;
  }
  if (digest) {
    uint64_t h = 1469598103934665603ull;
    for (const auto& [id, ts] : tokens)
      for (int32_t t : ts) h = (h ^ uint64_t(uint32_t(t))) * 1099511628211ull;
    *digest = h;
  }
  return {std::chrono::duration<double>(Clock::now() - t0).count(), total - at_t0};
}

}  // namespace

int run(int argc, char** argv) {
  std::string shape_name = "llama-8b", json_path, probe_path, device = "cuda", async_scheduling = "auto", quantization = "auto",
              kv_cache_dtype = "auto";
  int layers = 0;
  std::vector<int> conc = {1, 2, 4, 8, 16, 32}, prefill = {2048, 8192};
  std::string speculative_method;
  int prompt = 128, decode = 128, max_model_len = 0, tensor_parallel = 1, speculative_tokens = 0;
  bool eager = false, dependent_launch = true;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    auto next = [&] { return i + 1 < argc ? std::string(argv[++i]) : std::string(); };
    if (a == "--shape") shape_name = next();
    else if (a == "--concurrency") conc = parse_list(next());
    else if (a == "--prefill") prefill = parse_list(next());
    else if (a == "--prompt") prompt = std::stoi(next());
    else if (a == "--decode") decode = std::stoi(next());
    else if (a == "--eager") eager = true;
    else if (a == "--layers") layers = std::stoi(next());
    else if (a == "--device") device = next();
    else if (a == "--json") json_path = next();
    else if (a == "--no-dependent-launch") dependent_launch = false;
    else if (a == "--async-scheduling") async_scheduling = next();
    else if (a == "--probe") probe_path = next();
    else if (a == "--max-model-len") max_model_len = std::stoi(next());
    else if (a == "--quantization") quantization = next();
    else if (a == "--tensor-parallel-size") tensor_parallel = std::stoi(next());
    else if (a == "--kv-cache-dtype") kv_cache_dtype = next();
    else if (a == "--speculative-method") speculative_method = next();
    else if (a == "--num-speculative-tokens") speculative_tokens = std::stoi(next());
    else {
      std::fprintf(stderr, "unknown argument %s\n", a.c_str());
      return 2;
    }
  }
  if (!kShapes.count(shape_name)) {
    std::fprintf(stderr, "--shape must be llama-1b, llama-8b, qwen3-next-80b or flash-next\n");
    return 2;
  }
  Shape s = kShapes.at(shape_name);
  if (layers > 0) s.layers = layers;
  else if (s.hybrid()) s.layers = quantization == "awq" ? 48 : 32;  // 48 layers of fp16 experts exceed one 141 GB GPU
  double read_bw = 0;
  std::string gpu;  // the device's name (the performance gate keeps a baseline per GPU)
  Roofline roof;
#if REVOLTA_WITH_CUDA
  if (device == "cuda") {
    cuda::set_dependent_launch(dependent_launch);
    if (!probe_path.empty()) cuda::probe_enable();  // before the first kernel
    read_bw = cuda::measure_read_bandwidth(size_t(4) << 30);
    roof.read_bw = read_bw;
    gpu = cuda::device_name();
    roof.mma_flops = cuda::measure_mma884_flops(true);
    roof.wmma_flops = cuda::measure_wmma_flops();
    std::printf("device: %s\nmeasured streaming-read bandwidth: %.0f GB/s\ndependent kernel launch: %s\n",
                cuda::device_name().c_str(), read_bw / 1e9, cuda::dependent_launch_enabled() ? "on" : "off");
    std::printf("SM70 tensor-core peak (mma.sync.m8n8k4 f16): %.1f TFLOP/s with f32 accumulators, %.1f with f16; "
                "SM70 roofline = max(bytes / read bandwidth, FLOPs / the f32 figure)\n",
                roof.mma_flops / 1e12, cuda::measure_mma884_flops(false) / 1e12);
    std::printf("wmma m16n16k16 f16 (the GEMMs' shape; this GPU's own tensor cores): %.1f TFLOP/s; the V100 "
                "estimate (900 GB/s, 125 TFLOP/s) keeps the fraction of that roofline\n", roof.wmma_flops / 1e12);
  }
#endif
  if (s.hybrid()) std::printf("%s with %d of its layers\n", shape_name.c_str(), s.layers);

  EngineConfig cfg;
  if (speculative_method == "mtp" && !s.hybrid()) {
    std::fprintf(stderr, "--speculative-method mtp needs a hybrid shape (qwen3-next-80b)\n");
    return 2;
  }
  cfg.model = write_config(shape_name, s, speculative_method == "mtp" ? 1 : 0);
  cfg.speculative_method = speculative_method;
  cfg.num_speculative_tokens = speculative_tokens;
  cfg.device = device;
  cfg.load_format = "dummy";
  cfg.quantization = quantization;
  cfg.kv_cache_dtype = kv_cache_dtype;
  int max_prefill = 0;
  for (int p : prefill) max_prefill = std::max(max_prefill, p);
  int max_conc = 1;
  for (int c : conc) max_conc = std::max(max_conc, c);
  cfg.max_model_len = std::max(max_prefill + 16, prompt + decode + 16);
  if (max_model_len > 0) {
    if (max_model_len < cfg.max_model_len) {
      std::fprintf(stderr, "--max-model-len %d is below the %d the prefills and decodes need\n", max_model_len,
                   cfg.max_model_len);
      return 2;
    }
    cfg.max_model_len = max_model_len;
  }
  cfg.max_num_seqs = max_conc;
  cfg.max_num_batched_tokens = std::max(2048, std::min(max_prefill, 8192));
  cfg.gpu_memory_utilization = 0.85f;
  cfg.enforce_eager = eager;
  cfg.async_scheduling = async_scheduling;
  cfg.enable_prefix_caching = false;  // every prefill is measured in full
  cfg.tensor_parallel_size = tensor_parallel;
  Engine engine(cfg);
  const ModelInfo& info = engine.model_info();
  // int4 g128: 68-byte blocks; int8 KV rows carry a 4-byte scale
  const double kv_bytes = kv_cache_dtype == "fp8" ? 1.0 : kv_cache_dtype == "int8" ? 1.0 + 4.0 / (s.hybrid() ? s.head_dim : s.hidden / s.heads) : 2.0;
  const TokenBytes tb = token_bytes(s, quantization == "awq" ? 68.0 / 128.0 : 2.0, kv_bytes);
  if (!info.quantization.empty()) std::printf("weights: %s\n", info.quantization.c_str());
  std::printf("shape %s: %.2f GB of weights; a decoded token reads %.3f GB of them + %.1f MB of state + KV; "
              "KV pool %.1f GB (%s, %lld tokens); %s; async scheduling %s; max_model_len %d\n",
              shape_name.c_str(), info.weight_bytes / 1e9, (tb.weights + s.top_k * tb.per_expert) / 1e9, tb.state / 1e6,
              info.kv_cache_bytes / 1e9, info.kv_cache_dtype.c_str(), (long long)info.kv_cache_tokens, eager || device != "cuda" ? "eager" : "decode graphs allowed",
              async_scheduling.c_str(), cfg.max_model_len);
  if (!info.cuda_graph_batch_sizes.empty()) {
    std::printf("decode graphs recorded for batch sizes");
    for (int32_t b : info.cuda_graph_batch_sizes) std::printf(" %d", b);
    std::printf(" in %.0f MiB\n", info.cuda_graph_bytes / 1048576.0);
  }
  std::mt19937 rng(1);
  std::ostringstream js;
  js << "{\"shape\": \"" << shape_name << "\", \"device\": \"" << info.device << "\", \"gpu\": \"" << gpu << "\", \"read_bw_gbs\": " << read_bw / 1e9
     << ", \"weight_bytes\": " << info.weight_bytes << ", \"max_model_len\": " << cfg.max_model_len << ", \"decode\": [";
  run_decode(engine, {random_prompt(prompt, s.vocab, rng)}, 8);  // warm-up: graphs, allocator
  std::printf("%-12s %12s %12s %16s %10s %10s %17s %8s %8s %18s\n", "concurrency", "tok/s", "ms/step", "GB read/step",
              "of read bw", "of SM70", "V100 est tok/s", "graphs", "ahead", "greedy tokens");
  for (size_t i = 0; i < conc.size(); ++i) {
    const int c = conc[i];
    std::vector<std::vector<int32_t>> ps;
    for (int j = 0; j < c; ++j) ps.push_back(random_prompt(prompt, s.vocab, rng));
    const EngineStats before = engine.stats();
    uint64_t digest = 0;
    auto [secs, toks] = run_decode(engine, ps, decode, &digest);
    // Decode steps that replayed a captured graph (the timed steps exclude the prefill), and those
    // queued before the host had read the previous step's tokens.
    const EngineStats after = engine.stats();
    const double graphs = double(after.graph_replays - before.graph_replays) / std::max(1, decode - 1);
    const double ahead = double(after.steps_run_ahead - before.steps_run_ahead) / std::max(1, decode - 1);
    const int64_t drafts = after.spec_num_drafts - before.spec_num_drafts;
    const double accepted = drafts ? double(after.spec_num_accepted_tokens - before.spec_num_accepted_tokens) / double(drafts) : 0.0;
    const double tps = toks / secs, step_s = c / tps;
    // A step reads the shared weights once, the experts its tokens picked (for random routing
    // E (1 - (1 - K/E)^c) distinct ones per layer), each sequence's state and KV.
    const double experts = s.hybrid() ? s.experts * (1.0 - std::pow(1.0 - double(s.top_k) / s.experts, c)) : 0.0;
    const double bytes = tb.weights + experts * tb.per_expert + c * tb.state + double(c) * (prompt + decode / 2.0) * tb.kv_per_ctx;
    const double frac = read_bw > 0 ? bytes / step_s / read_bw : 0.0;
    const double flops = c * token_flops(s, prompt + decode / 2.0), roof_s = roof.seconds(bytes, flops);
    const auto [v100_slow, v100_fast] = roof.v100_seconds(bytes, flops, step_s);
    const double v100_lo = v100_slow > 0 ? c / v100_slow : 0.0, v100_hi = v100_fast > 0 ? c / v100_fast : 0.0;
    std::printf("%-12d %12.1f %12.2f %16.3f %9.1f%% %9.1f%% %8.0f-%-8.0f %7.0f%% %7.0f%% %018llx\n", c, tps,
                step_s * 1e3, bytes / 1e9, 100 * frac, 100 * roof_s / step_s, v100_lo, v100_hi, 100 * std::min(1.0, graphs),
                100 * std::min(1.0, ahead), (unsigned long long)digest);
    js << (i ? ", " : "") << "{\"concurrency\": " << c << ", \"tok_s\": " << tps << ", \"step_ms\": " << step_s * 1e3
       << ", \"bytes_per_step\": " << bytes << ", \"flops_per_step\": " << flops << ", \"bw_fraction\": " << frac
       << ", \"sm70_roofline_fraction\": " << roof_s / step_s << ", \"v100_est_tok_s\": [" << v100_lo << ", " << v100_hi << "], \"graph_steps\": " << graphs
       << ", \"steps_run_ahead\": " << ahead << ", \"accepted_per_verify\": " << accepted << ", \"greedy_digest\": \"" << std::hex << digest << std::dec << "\"}";
  }
#if REVOLTA_WITH_CUDA
  if (!probe_path.empty() && device == "cuda") {
    cuda::probe_take();  // what the runs above logged
    run_decode(engine, {random_prompt(prompt, s.vocab, rng)}, 9);
    const auto records = cuda::probe_take();
    std::ofstream f(probe_path);
    f << "kind,point,block,time_ns\n";
    for (const auto& r : records) f << r.kind << "," << r.point << "," << r.block << "," << r.time_ns << "\n";
    std::printf("probe: %zu records of 9 decode steps at concurrency 1 in %s%s\n", records.size(), probe_path.c_str(),
                records.empty() ? " (none: a build without -DREVOLTA_PROBE=ON?)" : "");
  }
#endif
  js << "], \"prefill\": [";
  for (size_t i = 0; i < prefill.size(); ++i) {
    const int p = prefill[i];
    run_decode(engine, {random_prompt(p, s.vocab, rng)}, 1);  // warm-up at this length
    const auto t0 = Clock::now();
    run_decode(engine, {random_prompt(p, s.vocab, rng)}, 1);
    const double secs = std::chrono::duration<double>(Clock::now() - t0).count();
    // A prefill reads every weight once (all the experts) and multiplies each token as decode does.
    const double flops = p * token_flops(s, p / 2.0), bytes = double(info.weight_bytes), roof_s = roof.seconds(bytes, flops);
    const auto [v100_slow, v100_fast] = roof.v100_seconds(bytes, flops, secs);
    std::printf("prefill %6d tokens: %8.1f ms  %10.0f tok/s  %.1f TFLOP/s, %.1f%% of the SM70 roofline, %.1f%% of the "
                "wmma one; V100 est %.0f-%.0f tok/s\n", p, secs * 1e3, p / secs, flops / secs / 1e12, 100 * roof_s / secs,
                100 * roof.native_seconds(bytes, flops) / secs, v100_slow > 0 ? p / v100_slow : 0.0,
                v100_fast > 0 ? p / v100_fast : 0.0);
    js << (i ? ", " : "") << "{\"tokens\": " << p << ", \"tok_s\": " << p / secs << ", \"flops\": " << flops
       << ", \"sm70_roofline_fraction\": " << roof_s / secs << "}";
  }
  js << "]}";
  std::printf("JSON %s\n", js.str().c_str());
  if (!json_path.empty()) std::ofstream(json_path) << js.str() << "\n";
  return 0;
}

int main(int argc, char** argv) {
  try {
    return run(argc, argv);
  } catch (const std::exception& e) {  // a refused option or a failed run: one line, not an abort
    std::fprintf(stderr, "revolta_bench: %s\n", e.what());
    return 1;
  }
}
