// Public C++ API of the ReVolta engine.
//
// A service embeds the engine by creating an Engine from a validated EngineConfig, handing it
// prompt token ids with SamplingParams, and collecting new token ids from await_outputs() or a
// per-request callback. Everything here is a value type; the engine's internals stay behind the
// pimpl so that this header never changes when they do.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

namespace revolta {

// Per-request sampling options. Names and meaning follow vLLM's SamplingParams.
struct SamplingParams {
  float temperature = 1.0f;         // 0 means greedy
  float top_p = 1.0f;               // (0, 1]
  int32_t top_k = 0;                // 0 or -1: off
  float min_p = 0.0f;               // [0, 1]
  float repetition_penalty = 1.0f;  // > 0; applied over prompt + output (HF/vLLM semantics)
  float presence_penalty = 0.0f;    // [-2, 2]; over output tokens
  float frequency_penalty = 0.0f;   // [-2, 2]; over output tokens
  std::optional<uint64_t> seed;     // per-request generator; unset: drawn from the engine
  int32_t max_tokens = 16;          // >= 1
  int32_t min_tokens = 0;           // EOS / stop tokens are masked until this many were made
  bool ignore_eos = false;
  std::vector<int32_t> stop_token_ids;
  // Added to these tokens' logits before penalties and sampling (OpenAI's logit_bias): [-100, 100].
  std::vector<std::pair<int32_t, float>> logit_bias;
  int32_t logprobs = -1;               // -1: none; N >= 0: sampled token + N top alternatives
  // -1: none; N >= 0: the log-probability of each prompt token given the ones before it, + N top
  // alternatives (vLLM's prompt_logprobs; such a request reads nothing from the prefix cache).
  int32_t prompt_logprobs = -1;
  // "last" | "mean": a pooling request (an embedding): the prompt's final hidden states (after the
  // final norm) pooled into RequestOutput::embedding; nothing is generated. "": generate.
  std::string pooling;
  bool return_generation_logits = false;  // raw logits row of every sampled position
  // Constrained decoding (vLLM's guided_decoding): kind json (data: a JSON schema) | json_object |
  // regex | lark (a Lark grammar); empty: none. Needs EngineConfig::guided_decoding_library.
  std::string guided_kind;
  std::string guided_data;
  // A thinking model's reasoning is not held to the grammar: with reasoning_end_token >= 0 (</think>)
  // the grammar starts after it. The prompt may leave the block open (in_reasoning), or the
  // answer's first token may open it (reasoning_start_token, <think>); reasoning_answer_token
  // (<tool_call>) also ends it, as the answer's first token.
  int32_t reasoning_start_token = -1;
  int32_t reasoning_end_token = -1;
  int32_t reasoning_answer_token = -1;
  bool in_reasoning = false;

  // Throws std::invalid_argument naming the offending field.
  void validate() const;
};

// An image, or one frame group of a video, in a multimodal prompt: prompt positions [offset, offset +
// grid_t * grid_h * grid_w / spatial_merge_size^2) hold its placeholder token (the model's image or
// video token), and pixels its patch rows as the model's processor makes them ([grid_t * grid_h *
// grid_w, channels * temporal_patch_size * patch_size^2]). hash names the content and its processing:
// equal hashes are encoded once (the encoder cache) and share prefix-cache blocks, others never do.
struct MediaInput {
  std::string kind = "image";  // image | video
  std::string hash;
  int32_t offset = 0;
  int32_t grid_t = 1, grid_h = 0, grid_w = 0;
  std::vector<float> pixels;
};

// Whose request it is, for the scheduling policy (EngineConfig::scheduling_policy).
struct SchedulingTag {
  int32_t priority = 0;  // vLLM's: lower is served first (policy "priority")
  uint64_t group = 0;    // requests of one parent (an API call's n x prompts); 0: a group of its own
  uint64_t client = 0;   // who sent it (an API key, hashed); 0: the anonymous client
};

// One row of the option table (engine_options.def), for the layers that present options.
struct EngineOptionInfo {
  const char* name;
  const char* type;     // bool | int | float | str
  const char* group;    // the --help section
  const char* choices;  // allowed values separated by spaces; "": any
  double min, max;      // bounds of a number; NaN: none
  const char* help;
};
const std::vector<EngineOptionInfo>& engine_options();

// Engine options. Validated before any weight is read.
struct EngineConfig {
#define REVOLTA_OPTION(type, name, fallback, group, choices, min, max, help) type name = fallback;
#include "revolta/engine_options.def"
#undef REVOLTA_OPTION

  // Set by the layer in front (the Python layer: from the model path, speculative_config,
  // kv_offloading_disk and cuda_graph_sizes, which it spells its own way).
  std::string model;  // HF-style directory: config.json + *.safetensors
  // fp8 with calculate_kv_scales: the calibration pass's prompts (token ids).
  std::vector<std::vector<int32_t>> calibration_prompts;
  // The llguidance library (the `llguidance` wheel's _lib.abi3.so, which the Python layer finds)
  // and the tokenizer.json its token masks are built from; empty: requests with guided_kind are
  // refused.
  std::string guided_decoding_library;
  std::string tokenizer_json;
  // Decode batch sizes recorded as graphs at startup; empty: 1, 2, 4, then every multiple of 8
  // up to 256 and of 16 up to 512, and max_num_seqs itself (as vLLM). Capped by max_num_seqs.
  std::vector<int32_t> cuda_graph_batch_sizes;
  // A disk tier below the host tier (LMCache's local disk: root_dir, max_size_bytes,
  // min_free_bytes): blocks are written there too, kept across restarts. Empty: none.
  std::string kv_offloading_disk_dir;
  int64_t kv_offloading_disk_max_bytes = int64_t(64) << 30;
  int64_t kv_offloading_disk_min_free_bytes = int64_t(1) << 30;
  // Speculative decoding (vLLM's speculative_config): "" (off) | "ngram" (prompt lookup: drafts
  // copied from where the request's last n tokens, prompt_lookup_max >= n >= prompt_lookup_min,
  // occurred before) | "mtp" (the checkpoint's multi-token-prediction layers, run
  // autoregressively). Requests verify up to num_speculative_tokens drafts a step.
  std::string speculative_method;
  int32_t num_speculative_tokens = 0;
  int32_t prompt_lookup_min = 1, prompt_lookup_max = 4;
  // "greedy": drafts are the drafter's argmax (sampled requests verify them as point masses);
  // "probabilistic" (mtp): sampled requests draw their drafts from the MTP layer's distribution
  // under their sampling parameters and verify them against it.
  std::string draft_sample_method = "greedy";

  // The options alone: the table's choices and bounds, and what options require of one another;
  // throws std::invalid_argument naming the option.
  void validate_options() const;
  // validate_options, and what the layer in front sets (the model, calibration prompts).
  void validate() const;
};

enum class FinishReason { kNone, kStop, kLength, kAbort, kError };
const char* to_string(FinishReason reason);

struct TokenLogprob {
  int32_t token;
  float logprob;
};

// One sampled position of one request.
struct TokenOutput {
  int32_t token = -1;
  float logprob = 0.0f;                   // valid when logprobs >= 0
  std::vector<TokenLogprob> top_logprobs;  // N alternatives, best first
  std::vector<float> logits;              // raw logits row when return_generation_logits
};

struct RequestOutput {
  uint64_t request_id = 0;
  std::vector<TokenOutput> tokens;        // new since the previous output of this request
  bool finished = false;
  FinishReason finish_reason = FinishReason::kNone;
  int32_t stop_token_id = -1;             // the stop/EOS token that ended it, if any
  int32_t num_prompt_tokens = 0;
  int32_t num_cached_tokens = 0;          // prompt tokens served from the prefix cache
  std::string error;                      // set when finish_reason == kError
  // With prompt_logprobs, in the request's first output: prompt tokens 1 .. n-1 (token 0 has none).
  std::vector<TokenOutput> prompt_logprobs;
  std::vector<float> embedding;  // a pooling request's pooled hidden state (not normalised)
};

struct EngineStats {
  int64_t num_running = 0;
  int64_t num_waiting = 0;
  int64_t num_blocks_total = 0;
  int64_t num_blocks_used = 0;
  int64_t num_blocks_free = 0;
  int64_t prefix_cache_queries = 0;       // prompt tokens looked up
  int64_t prefix_cache_hits = 0;          // prompt tokens found
  int64_t num_preemptions = 0;
  // Multimodal: media items the vision tower encoded, items found in the encoder cache, its bytes.
  int64_t mm_items_encoded = 0;
  int64_t mm_encoder_cache_hits = 0;
  int64_t mm_encoder_cache_bytes = 0;
  std::vector<std::pair<int32_t, int64_t>> waiting_by_priority;  // (priority, requests waiting), ascending
  // KV offload tiers: prompt tokens whose blocks came back from a tier, entries found per tier,
  // bytes moved (device -> host, host -> device, to and from disk), what each tier holds, and disk
  // files rejected (checksum, header) or writes skipped (min_free_bytes, a failed write).
  int64_t kv_offload_hit_tokens = 0;
  int64_t kv_offload_host_hits = 0;
  int64_t kv_offload_disk_hits = 0;
  int64_t kv_offload_bytes_offloaded = 0;
  int64_t kv_offload_bytes_restored = 0;
  int64_t kv_offload_disk_bytes_written = 0;
  int64_t kv_offload_disk_bytes_read = 0;
  int64_t kv_offload_host_bytes = 0;
  int64_t kv_offload_disk_bytes = 0;
  int64_t kv_offload_disk_rejected = 0;
  int64_t kv_offload_disk_write_skips = 0;
  int64_t num_steps = 0;
  int64_t prompt_tokens_computed = 0;
  int64_t generation_tokens = 0;
  int64_t requests_finished = 0;
  int64_t graph_replays = 0;              // decode steps served by a captured graph
  int64_t steps_run_ahead = 0;            // steps queued before the previous step's tokens were read
  // Speculative decoding (vLLM's spec_decode counters): steps that verified drafts, drafts
  // proposed, drafts accepted, and accepted drafts by their position in the draft.
  int64_t spec_num_drafts = 0;
  int64_t spec_num_draft_tokens = 0;
  int64_t spec_num_accepted_tokens = 0;
  std::vector<int64_t> spec_accepted_per_position;
  int64_t spec_draft_time_us = 0;   // proposing drafts
  int64_t spec_verify_time_us = 0;  // steps that verified drafts: forward, verification, bookkeeping
};

struct ModelInfo {
  std::string architecture;
  int32_t vocab_size = 0;
  int32_t max_model_len = 0;
  int32_t num_layers = 0;
  int32_t hidden_size = 0;
  std::vector<int32_t> eos_token_ids;
  std::string weight_dtype;
  std::string quantization;  // "" or the quantized linear layers' format ("awq int4 g128")
  int64_t weight_bytes = 0;    // of every tensor-parallel rank together
  int64_t kv_cache_bytes = 0;  // of every rank together
  int32_t tensor_parallel_size = 1;
  std::string device;                // "cpu" or the GPU's name
  std::string kv_cache_dtype;
  int64_t kv_cache_tokens = 0;  // the pool: tokens a rank's KV cache holds
  std::vector<std::string> warnings;  // what the configuration left short of what was asked
  std::vector<int32_t> cuda_graph_batch_sizes;  // decode graphs recorded at startup
  int64_t cuda_graph_bytes = 0;                 // the device memory they share
  bool takes_media = false;  // a vision tower is loaded: requests may carry images and video
};

using OutputCallback = std::function<void(const RequestOutput&)>;

class Engine {
 public:
  // Validates the config, loads the model, sizes the caches and starts the engine thread.
  // Throws std::invalid_argument (bad options) or std::runtime_error (unreadable model).
  explicit Engine(const EngineConfig& config);
  ~Engine();
  Engine(const Engine&) = delete;
  Engine& operator=(const Engine&) = delete;

  // Thread-safe; returns immediately. Throws std::invalid_argument for a bad prompt or params.
  // With a callback, this request's outputs go to the callback (on the engine thread) instead
  // of the await_outputs() queue.
  // media: a multimodal prompt's images and video frame groups (the model must have a vision tower).
  uint64_t add_request(std::vector<int32_t> prompt_token_ids, const SamplingParams& params,
                       OutputCallback callback = nullptr, const SchedulingTag& tag = {},
                       std::vector<MediaInput> media = {});
  // Several requests at once: the engine sees all of them in the same step (or none, if any is
  // invalid: then std::invalid_argument names the first bad one and nothing is queued). tags:
  // one per prompt, or none (each request a group of its own, priority 0).
  // media: one list per prompt, or none.
  std::vector<uint64_t> add_requests(const std::vector<std::vector<int32_t>>& prompts,
                                     const std::vector<SamplingParams>& params,
                                     const std::vector<SchedulingTag>& tags = {},
                                     const std::vector<std::vector<MediaInput>>& media = {});
  // Thread-safe; unknown or finished ids are ignored. The request ends with kAbort.
  void abort(uint64_t request_id);
  // Waits up to timeout for outputs; returns all that are queued (possibly none).
  // Throws std::runtime_error if the engine thread died of a fatal error.
  std::vector<RequestOutput> await_outputs(std::chrono::milliseconds timeout);
  EngineStats stats() const;
  const ModelInfo& model_info() const;
  const EngineConfig& config() const;
  // What the engine thread is doing now and in which step ("step 812: forward of 3 requests"),
  // readable while a step hangs (a watchdog's report). Thread-safe.
  std::string activity() const;
  // Thread-safe, done before the next step: forgets every cached prefix block no request holds
  // (the offload tiers keep theirs).
  void reset_prefix_cache();
  // Thread-safe. Paused, no step runs: requests are accepted and wait; resumed, they go on.
  void set_paused(bool paused);
  bool paused() const;
  // Sleep mode (vLLM's): frees memory while nothing should run. Level 1 frees the KV cache, the
  // offload tiers' host memory (the disk tier stays) and the CUDA graphs with their buffers; level 2
  // the weights too, which wake_up reads from the model files again. Running requests are
  // preempted and recomputed after wake_up; requests that arrive meanwhile wait. Both return once
  // the engine thread has done it (thread-safe; throws if the engine stops meanwhile).
  void sleep(int level);
  void wake_up();
  int sleep_level() const;  // 0: awake
  // Stops the engine thread; pending requests end with kAbort. Idempotent.
  void shutdown();

 private:
  void change_sleep_level(int level);
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace revolta
