// Validation of the public value types: every message names the option it is about.
#include <cmath>

#include "core/device_runtime.h"
#include "core/error.h"
#include "revolta/engine.h"

namespace revolta {

const char* to_string(FinishReason r) {
  switch (r) {
    case FinishReason::kNone: return "none";
    case FinishReason::kStop: return "stop";
    case FinishReason::kLength: return "length";
    case FinishReason::kAbort: return "abort";
    case FinishReason::kError: return "error";
  }
  return "?";
}

void SamplingParams::validate() const {
  RV_CHECK_ARG(guided_kind.empty() || guided_kind == "json" || guided_kind == "json_object" || guided_kind == "regex" ||
                   guided_kind == "lark",
               "guided_decoding: kind must be json, json_object, regex or lark, got '", guided_kind, "'");
  RV_CHECK_ARG(std::isfinite(temperature) && temperature >= 0.0f,
               "temperature must be a finite number >= 0, got ", temperature);
  RV_CHECK_ARG(top_p > 0.0f && top_p <= 1.0f, "top_p must be in (0, 1], got ", top_p);
  RV_CHECK_ARG(top_k >= -1, "top_k must be -1 (off), 0 (off) or positive, got ", top_k);
  RV_CHECK_ARG(min_p >= 0.0f && min_p <= 1.0f, "min_p must be in [0, 1], got ", min_p);
  RV_CHECK_ARG(std::isfinite(repetition_penalty) && repetition_penalty > 0.0f,
               "repetition_penalty must be > 0, got ", repetition_penalty);
  RV_CHECK_ARG(presence_penalty >= -2.0f && presence_penalty <= 2.0f,
               "presence_penalty must be in [-2, 2], got ", presence_penalty);
  RV_CHECK_ARG(frequency_penalty >= -2.0f && frequency_penalty <= 2.0f,
               "frequency_penalty must be in [-2, 2], got ", frequency_penalty);
  RV_CHECK_ARG(max_tokens >= 1, "max_tokens must be >= 1, got ", max_tokens);
  RV_CHECK_ARG(min_tokens >= 0 && min_tokens <= max_tokens,
               "min_tokens must be in [0, max_tokens], got ", min_tokens);
  RV_CHECK_ARG(logprobs >= -1 && logprobs <= 20, "logprobs must be in [0, 20] (or -1 for none), got ",
               logprobs);
  RV_CHECK_ARG(prompt_logprobs >= -1 && prompt_logprobs <= 20,
               "prompt_logprobs must be in [0, 20] (or -1 for none), got ", prompt_logprobs);
  for (int32_t t : stop_token_ids)
    RV_CHECK_ARG(t >= 0, "stop_token_ids must be non-negative token ids, got ", t);
}

void EngineConfig::validate() const {
  RV_CHECK_ARG(!model.empty(), "model: a model directory is required");
  RV_CHECK_ARG(dtype == "auto" || dtype == "float32" || dtype == "float16" || dtype == "bfloat16",
               "dtype must be one of auto, float32, float16, bfloat16; got '", dtype, "'");
  RV_CHECK_ARG(device == "cpu" || device == "cuda", "device must be cpu or cuda; got '", device, "'");
  RV_CHECK_ARG(device == "cpu" || has_device(Device::kCUDA),
               "device 'cuda': this build has no CUDA backend (build with REVOLTA_CUDA=ON)");
  RV_CHECK_ARG(kv_cache_dtype == "auto" || kv_cache_dtype == "float32" || kv_cache_dtype == "float16" ||
                   kv_cache_dtype == "fp16" || kv_cache_dtype == "fp8" || kv_cache_dtype == "fp8_e4m3" ||
                   kv_cache_dtype == "int8",
               "kv_cache_dtype must be one of auto, float32, float16 (fp16), fp8 (fp8_e4m3), int8; got '",
               kv_cache_dtype, "'");
  RV_CHECK_ARG(!calculate_kv_scales || kv_cache_dtype == "fp8" || kv_cache_dtype == "fp8_e4m3",
               "calculate_kv_scales measures the scales of an fp8 KV cache; kv_cache_dtype is '", kv_cache_dtype, "'");
  RV_CHECK_ARG(!calculate_kv_scales || !calibration_prompts.empty(),
               "calculate_kv_scales needs calibration_prompts (token ids of a few prompts)");
  RV_CHECK_ARG(kv_offloading_size >= 0.0, "kv_offloading_size must be >= 0 GiB; got ", kv_offloading_size);
  RV_CHECK_ARG(kv_offloading_eviction == "lru" || kv_offloading_eviction == "arc",
               "kv_offloading_eviction must be lru or arc; got '", kv_offloading_eviction, "'");
  RV_CHECK_ARG((kv_offloading_size == 0.0 && kv_offloading_disk_dir.empty()) || enable_prefix_caching,
               "kv_offloading_size / kv_offloading_disk keep prefix blocks, so they need enable_prefix_caching");
  RV_CHECK_ARG(kv_offloading_disk_dir.empty() || kv_offloading_disk_max_bytes > 0,
               "kv_offloading_disk: max_size_bytes must be > 0; got ", kv_offloading_disk_max_bytes);
  RV_CHECK_ARG(kv_offloading_disk_min_free_bytes >= 0, "kv_offloading_disk: min_free_bytes must be >= 0; got ",
               kv_offloading_disk_min_free_bytes);
  RV_CHECK_ARG(device == "cpu" || dtype != "bfloat16",
               "dtype bfloat16 is not supported with device cuda (SM70 has no bf16 arithmetic): use auto or float16, "
               "bf16 checkpoints are converted to float16 with a range check");
  RV_CHECK_ARG(load_format == "auto" || load_format == "dummy" || load_format == "gguf",
               "load_format must be auto, dummy or gguf; got '", load_format, "'");
  RV_CHECK_ARG(load_format != "gguf" || device == "cpu", "load_format 'gguf' keeps weights in quantized blocks, ",
               "which only the CPU runs so far; use load_format 'auto' (float16 weights) with device '", device, "'");
  RV_CHECK_ARG(quantization == "auto" || quantization == "awq" || quantization == "fp8" || quantization == "nvfp4",
               "quantization must be auto, awq, fp8 or nvfp4; got '", quantization, "'");
  RV_CHECK_ARG(quantization == "auto" || load_format != "gguf", "quantization '", quantization, "' and load_format 'gguf' exclude each other ",
               "(a GGUF file carries its own block formats)");
  RV_CHECK_ARG(async_scheduling == "auto" || async_scheduling == "on" || async_scheduling == "off",
               "async_scheduling must be auto, on or off; got '", async_scheduling, "'");
  RV_CHECK_ARG(gpu_memory_utilization >= 0.0f && gpu_memory_utilization <= 0.99f,
               "gpu_memory_utilization must be in [0, 0.99] (0: size the KV pool by kv_cache_memory_bytes), got ",
               gpu_memory_utilization);
  for (int32_t b : cuda_graph_batch_sizes)
    RV_CHECK_ARG(b >= 1 && b <= 1024, "cuda_graph_batch_sizes must hold sizes in [1, 1024], got ", b);
  RV_CHECK_ARG(max_model_len >= 0, "max_model_len must be >= 0 (0: from the model), got ", max_model_len);
  RV_CHECK_ARG(max_num_seqs >= 1, "max_num_seqs must be >= 1, got ", max_num_seqs);
  RV_CHECK_ARG(max_num_batched_tokens >= 1, "max_num_batched_tokens must be >= 1, got ",
               max_num_batched_tokens);
  RV_CHECK_ARG(block_size >= 1 && block_size <= 1024 && (block_size & (block_size - 1)) == 0,
               "block_size must be a power of two in [1, 1024], got ", block_size);
  RV_CHECK_ARG(kv_cache_memory_bytes > 0, "kv_cache_memory_bytes must be > 0, got ",
               kv_cache_memory_bytes);
  RV_CHECK_ARG(block_activation_bits == 8 || block_activation_bits == 16, "block_activation_bits must be 8 or 16, got ",
               block_activation_bits);
  RV_CHECK_ARG(num_threads >= 0 && num_threads <= 1024, "num_threads must be in [0, 1024], got ",
               num_threads);
  RV_CHECK_ARG(tensor_parallel_size >= 1 && tensor_parallel_size <= 64, "tensor_parallel_size must be in [1, 64], got ",
               tensor_parallel_size);
  RV_CHECK_ARG(scheduling_policy == "fair" || scheduling_policy == "fcfs" || scheduling_policy == "priority",
               "scheduling_policy must be fair, fcfs or priority; got '", scheduling_policy, "'");
  RV_CHECK_ARG(speculative_method.empty() || speculative_method == "ngram" || speculative_method == "mtp",
               "speculative_config: method must be 'ngram' or 'mtp', got '", speculative_method, "'");
  RV_CHECK_ARG(draft_sample_method == "greedy" || draft_sample_method == "probabilistic",
               "speculative_config: draft_sample_method must be 'greedy' or 'probabilistic', got '", draft_sample_method, "'");
  RV_CHECK_ARG(draft_sample_method == "greedy" || speculative_method == "mtp",
               "speculative_config: draft_sample_method 'probabilistic' needs a drafter with a distribution (method ",
               "'mtp'); n-gram drafts are certain");
  if (!speculative_method.empty()) {
    RV_CHECK_ARG(num_speculative_tokens >= 1 && num_speculative_tokens <= 16,
                 "speculative_config: num_speculative_tokens must be in [1, 16], got ", num_speculative_tokens);
    RV_CHECK_ARG(prompt_lookup_min >= 1 && prompt_lookup_min <= prompt_lookup_max && prompt_lookup_max <= 64,
                 "speculative_config: need 1 <= prompt_lookup_min <= prompt_lookup_max <= 64, got ", prompt_lookup_min,
                 " and ", prompt_lookup_max);
  }
}

}  // namespace revolta
