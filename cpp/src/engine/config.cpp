// Validation of the public value types: every message names the option it is about.
#include <cmath>
#include <sstream>
#include <type_traits>

#include "core/device_runtime.h"
#include "core/error.h"
#include "revolta/engine.h"
#include "quant/formats.h"

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
  RV_CHECK_ARG(pooling.empty() || pooling == "last" || pooling == "mean", "pooling must be last or mean, got '", pooling, "'");
  RV_CHECK_ARG(pooling.empty() || (guided_kind.empty() && prompt_logprobs < 0),
               "pooling: a pooling request takes no guided_decoding or prompt_logprobs");
  RV_CHECK_ARG(reasoning_end_token >= 0 || (!in_reasoning && reasoning_start_token < 0 && reasoning_answer_token < 0),
               "guided_decoding: the reasoning tokens need reasoning_end_token");
  for (const auto& [token, bias] : logit_bias)
    RV_CHECK_ARG(token >= 0 && std::isfinite(bias) && bias >= -100.0f && bias <= 100.0f,
                 "logit_bias: token ", token, " has bias ", bias, " (token ids >= 0, biases in [-100, 100])");
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

namespace {

template <class T>
constexpr const char* option_type() {
  if constexpr (std::is_same_v<T, bool>) return "bool";
  else if constexpr (std::is_integral_v<T>) return "int";
  else if constexpr (std::is_floating_point_v<T>) return "float";
  else return "str";
}

std::string text_of(const std::string& v) { return v; }
template <class T>
std::string text_of(T v) {
  std::ostringstream o;
  o << v;
  return o.str();
}

// "a, b or c" from "a b c".
std::string listed(const std::string& choices) {
  std::vector<std::string> words;
  std::istringstream in(choices);
  for (std::string w; in >> w;) words.push_back(w);
  std::string out;
  for (size_t i = 0; i < words.size(); ++i) out += (i == 0 ? "" : i + 1 == words.size() ? " or " : ", ") + words[i];
  return out;
}

bool among(const std::string& value, const std::string& choices) {
  std::istringstream in(choices);
  for (std::string w; in >> w;)
    if (w == value) return true;
  return false;
}

template <class T>
void check_option(const char* name, const T& value, const char* choices, double lo, double hi) {
  if (*choices) RV_CHECK_ARG(among(text_of(value), choices), name, " must be ", listed(choices), "; got '", text_of(value), "'");
  if constexpr (std::is_arithmetic_v<T> && !std::is_same_v<T, bool>) {
    const double v = double(value);
    RV_CHECK_ARG(std::isnan(lo) || v >= lo, name, std::isnan(hi) ? str_cat(" must be >= ", lo) : str_cat(" must be in [", lo, ", ", hi, "]"),
                 ", got ", text_of(value));
    RV_CHECK_ARG(std::isnan(hi) || v <= hi, name, std::isnan(lo) ? str_cat(" must be <= ", hi) : str_cat(" must be in [", lo, ", ", hi, "]"),
                 ", got ", text_of(value));
  }
}

}  // namespace

const std::vector<EngineOptionInfo>& engine_options() {
  static const std::vector<EngineOptionInfo> rows = {
#define REVOLTA_OPTION(type, name, fallback, group, choices, min, max, help) \
  {#name, option_type<type>(), group, choices, double(min), double(max), help},
#include "revolta/engine_options.def"
#undef REVOLTA_OPTION
  };
  return rows;
}

void EngineConfig::validate_options() const {
#define REVOLTA_OPTION(type, name, fallback, group, choices, min, max, help) \
  check_option(#name, name, choices, double(min), double(max));
#include "revolta/engine_options.def"
#undef REVOLTA_OPTION
  RV_CHECK_ARG(device == "cpu" || has_device(Device::kCUDA),
               "device 'cuda': this build has no CUDA backend (build with REVOLTA_CUDA=ON)");
  RV_CHECK_ARG(!calculate_kv_scales || kv_cache_dtype == "fp8" || kv_cache_dtype == "fp8_e4m3",
               "calculate_kv_scales measures the scales of an fp8 KV cache; kv_cache_dtype is '", kv_cache_dtype, "'");
  RV_CHECK_ARG((kv_offloading_size == 0.0 && kv_offloading_disk_dir.empty()) || enable_prefix_caching,
               "kv_offloading_size / kv_offloading_disk keep prefix blocks, so they need enable_prefix_caching");
  RV_CHECK_ARG(kv_offloading_disk_dir.empty() || kv_offloading_disk_max_bytes > 0,
               "kv_offloading_disk: max_size_bytes must be > 0; got ", kv_offloading_disk_max_bytes);
  RV_CHECK_ARG(kv_offloading_disk_min_free_bytes >= 0, "kv_offloading_disk: min_free_bytes must be >= 0; got ",
               kv_offloading_disk_min_free_bytes);
  RV_CHECK_ARG(device == "cpu" || dtype != "bfloat16",
               "dtype bfloat16 is not supported with device cuda (SM70 has no bf16 arithmetic): use auto or float16, "
               "bf16 checkpoints are converted to float16 with a range check");
  RV_CHECK_ARG(load_format != "gguf" || device == "cpu", "load_format 'gguf' keeps weights in quantized blocks, ",
               "which only the CPU runs so far; use load_format 'auto' (float16 weights) with device '", device, "'");
  if (quantization != "auto") weight_format(quantization, "quantization");  // (auto: the checkpoint's)
  RV_CHECK_ARG(quantization == "auto" || load_format != "gguf", "quantization '", quantization, "' and load_format 'gguf' exclude each other ",
               "(a GGUF file carries its own block formats)");
  for (int32_t b : cuda_graph_batch_sizes)
    RV_CHECK_ARG(b >= 1 && b <= 1024, "cuda_graph_batch_sizes must hold sizes in [1, 1024], got ", b);
  RV_CHECK_ARG((block_size & (block_size - 1)) == 0, "block_size must be a power of two in [1, 1024], got ", block_size);
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

void EngineConfig::validate() const {
  validate_options();
  RV_CHECK_ARG(!model.empty(), "model: a model directory is required");
  RV_CHECK_ARG(!calculate_kv_scales || !calibration_prompts.empty(),
               "calculate_kv_scales needs calibration_prompts (token ids of a few prompts)");
}

}  // namespace revolta
