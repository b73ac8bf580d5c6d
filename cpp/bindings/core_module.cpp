// revolta._core: the C++ engine for Python. The GIL is released while the engine loads a model
// and while a caller waits for outputs, so other Python threads (the HTTP server) keep running.
#include <nanobind/nanobind.h>
#include <nanobind/ndarray.h>
#include <nanobind/stl/chrono.h>
#include <nanobind/stl/function.h>
#include <nanobind/stl/optional.h>
#include <nanobind/stl/pair.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/vector.h>

#include <execinfo.h>
#include <signal.h>
#include <unistd.h>

#include <cstdlib>

#include "revolta/engine.h"

namespace nb = nanobind;
using namespace nb::literals;
using namespace revolta;

void bind_ops(nb::module_& m);
void bind_gguf(nb::module_& m);

namespace {
// REVOLTA_BACKTRACE=1: a crash prints the native stack to stderr (machines without a debugger).
void print_backtrace(int sig) {
  void* frames[64];
  const int n = backtrace(frames, 64);
  const char msg[] = "revolta: fatal signal, native stack:\n";
  (void)!write(2, msg, sizeof(msg) - 1);
  backtrace_symbols_fd(frames, n, 2);
  signal(sig, SIG_DFL);
  raise(sig);
}
}  // namespace

NB_MODULE(_core, m) {
  m.doc() = "ReVolta C++ engine";
  if (const char* v = std::getenv("REVOLTA_BACKTRACE"); v && *v == '1') {
    signal(SIGSEGV, print_backtrace);
    signal(SIGABRT, print_backtrace);
  }
  bind_ops(m);
  bind_gguf(m);

  nb::class_<SamplingParams>(m, "SamplingParams")
      .def(nb::init<>())
      .def_rw("temperature", &SamplingParams::temperature)
      .def_rw("top_p", &SamplingParams::top_p)
      .def_rw("top_k", &SamplingParams::top_k)
      .def_rw("min_p", &SamplingParams::min_p)
      .def_rw("repetition_penalty", &SamplingParams::repetition_penalty)
      .def_rw("presence_penalty", &SamplingParams::presence_penalty)
      .def_rw("frequency_penalty", &SamplingParams::frequency_penalty)
      .def_rw("seed", &SamplingParams::seed)
      .def_rw("max_tokens", &SamplingParams::max_tokens)
      .def_rw("min_tokens", &SamplingParams::min_tokens)
      .def_rw("ignore_eos", &SamplingParams::ignore_eos)
      .def_rw("stop_token_ids", &SamplingParams::stop_token_ids)
      .def_rw("logit_bias", &SamplingParams::logit_bias)
      .def_rw("pooling", &SamplingParams::pooling)
      .def_rw("logprobs", &SamplingParams::logprobs)
      .def_rw("prompt_logprobs", &SamplingParams::prompt_logprobs)
      .def_rw("return_generation_logits", &SamplingParams::return_generation_logits)
      .def_rw("guided_kind", &SamplingParams::guided_kind)
      .def_rw("guided_data", &SamplingParams::guided_data)
      .def_rw("reasoning_start_token", &SamplingParams::reasoning_start_token)
      .def_rw("reasoning_end_token", &SamplingParams::reasoning_end_token)
      .def_rw("reasoning_answer_token", &SamplingParams::reasoning_answer_token)
      .def_rw("in_reasoning", &SamplingParams::in_reasoning)
      .def("validate", &SamplingParams::validate);

  nb::class_<SchedulingTag>(m, "SchedulingTag")
      .def(nb::init<>())
      .def("__init__",
           [](SchedulingTag* t, int32_t priority, uint64_t group, uint64_t client) {
             new (t) SchedulingTag{priority, group, client};
           },
           "priority"_a = 0, "group"_a = 0, "client"_a = 0)
      .def_rw("priority", &SchedulingTag::priority)
      .def_rw("group", &SchedulingTag::group)
      .def_rw("client", &SchedulingTag::client);

  nb::class_<EngineConfig> config(m, "EngineConfig");
  config.def(nb::init<>())
      .def_rw("model", &EngineConfig::model)
      .def_rw("calibration_prompts", &EngineConfig::calibration_prompts)
      .def_rw("guided_decoding_library", &EngineConfig::guided_decoding_library)
      .def_rw("tokenizer_json", &EngineConfig::tokenizer_json)
      .def_rw("cuda_graph_batch_sizes", &EngineConfig::cuda_graph_batch_sizes)
      .def_rw("kv_offloading_disk_dir", &EngineConfig::kv_offloading_disk_dir)
      .def_rw("kv_offloading_disk_max_bytes", &EngineConfig::kv_offloading_disk_max_bytes)
      .def_rw("kv_offloading_disk_min_free_bytes", &EngineConfig::kv_offloading_disk_min_free_bytes)
      .def_rw("speculative_method", &EngineConfig::speculative_method)
      .def_rw("num_speculative_tokens", &EngineConfig::num_speculative_tokens)
      .def_rw("prompt_lookup_min", &EngineConfig::prompt_lookup_min)
      .def_rw("prompt_lookup_max", &EngineConfig::prompt_lookup_max)
      .def_rw("draft_sample_method", &EngineConfig::draft_sample_method)
      .def("validate_options", &EngineConfig::validate_options)
      .def("validate", &EngineConfig::validate);
#define REVOLTA_OPTION(type, name, fallback, group, choices, min, max, help) config.def_rw(#name, &EngineConfig::name, help);
#include "revolta/engine_options.def"
#undef REVOLTA_OPTION
  // The option table's rows (the Python layer makes its schema, flags and reference from them).
  m.def("engine_options", [] {
    nb::list rows;
    for (const EngineOptionInfo& o : engine_options()) {
      nb::dict row;
      row["name"] = o.name, row["type"] = o.type, row["group"] = o.group, row["choices"] = o.choices;
      row["min"] = o.min, row["max"] = o.max, row["help"] = o.help;
      rows.append(row);
    }
    return rows;
  });

  nb::class_<TokenLogprob>(m, "TokenLogprob")
      .def_ro("token", &TokenLogprob::token)
      .def_ro("logprob", &TokenLogprob::logprob);

  nb::class_<TokenOutput>(m, "TokenOutput")
      .def_ro("token", &TokenOutput::token)
      .def_ro("logprob", &TokenOutput::logprob)
      .def_ro("top_logprobs", &TokenOutput::top_logprobs)
      .def_ro("logits", &TokenOutput::logits);

  nb::class_<RequestOutput>(m, "RequestOutput")
      .def_ro("request_id", &RequestOutput::request_id)
      .def_ro("tokens", &RequestOutput::tokens)
      .def_ro("finished", &RequestOutput::finished)
      .def_prop_ro("finish_reason", [](const RequestOutput& o) { return std::string(to_string(o.finish_reason)); })
      .def_ro("stop_token_id", &RequestOutput::stop_token_id)
      .def_ro("num_prompt_tokens", &RequestOutput::num_prompt_tokens)
      .def_ro("num_cached_tokens", &RequestOutput::num_cached_tokens)
      .def_ro("prompt_logprobs", &RequestOutput::prompt_logprobs)
      .def_ro("embedding", &RequestOutput::embedding)
      .def_ro("error", &RequestOutput::error);

  nb::class_<EngineStats>(m, "EngineStats")
      .def_ro("num_running", &EngineStats::num_running)
      .def_ro("num_waiting", &EngineStats::num_waiting)
      .def_ro("num_blocks_total", &EngineStats::num_blocks_total)
      .def_ro("num_blocks_used", &EngineStats::num_blocks_used)
      .def_ro("num_blocks_free", &EngineStats::num_blocks_free)
      .def_ro("prefix_cache_queries", &EngineStats::prefix_cache_queries)
      .def_ro("prefix_cache_hits", &EngineStats::prefix_cache_hits)
      .def_ro("mm_items_encoded", &EngineStats::mm_items_encoded)
      .def_ro("mm_encoder_cache_hits", &EngineStats::mm_encoder_cache_hits)
      .def_ro("mm_encoder_cache_bytes", &EngineStats::mm_encoder_cache_bytes)
      .def_ro("num_preemptions", &EngineStats::num_preemptions)
      .def_ro("kv_offload_hit_tokens", &EngineStats::kv_offload_hit_tokens)
      .def_ro("kv_offload_host_hits", &EngineStats::kv_offload_host_hits)
      .def_ro("kv_offload_disk_hits", &EngineStats::kv_offload_disk_hits)
      .def_ro("kv_offload_bytes_offloaded", &EngineStats::kv_offload_bytes_offloaded)
      .def_ro("kv_offload_bytes_restored", &EngineStats::kv_offload_bytes_restored)
      .def_ro("kv_offload_disk_bytes_written", &EngineStats::kv_offload_disk_bytes_written)
      .def_ro("kv_offload_disk_bytes_read", &EngineStats::kv_offload_disk_bytes_read)
      .def_ro("kv_offload_host_bytes", &EngineStats::kv_offload_host_bytes)
      .def_ro("kv_offload_disk_bytes", &EngineStats::kv_offload_disk_bytes)
      .def_ro("kv_offload_disk_rejected", &EngineStats::kv_offload_disk_rejected)
      .def_ro("kv_offload_disk_write_skips", &EngineStats::kv_offload_disk_write_skips)
      .def_ro("num_steps", &EngineStats::num_steps)
      .def_ro("prompt_tokens_computed", &EngineStats::prompt_tokens_computed)
      .def_ro("generation_tokens", &EngineStats::generation_tokens)
      .def_ro("requests_finished", &EngineStats::requests_finished)
      .def_ro("graph_replays", &EngineStats::graph_replays)
      .def_ro("steps_run_ahead", &EngineStats::steps_run_ahead)
      .def_ro("spec_num_drafts", &EngineStats::spec_num_drafts)
      .def_ro("spec_num_draft_tokens", &EngineStats::spec_num_draft_tokens)
      .def_ro("spec_num_accepted_tokens", &EngineStats::spec_num_accepted_tokens)
      .def_ro("spec_accepted_per_position", &EngineStats::spec_accepted_per_position)
      .def_ro("waiting_by_priority", &EngineStats::waiting_by_priority)
      .def_ro("spec_draft_time_us", &EngineStats::spec_draft_time_us)
      .def_ro("spec_verify_time_us", &EngineStats::spec_verify_time_us);

  nb::class_<ModelInfo>(m, "ModelInfo")
      .def_ro("architecture", &ModelInfo::architecture)
      .def_ro("vocab_size", &ModelInfo::vocab_size)
      .def_ro("max_model_len", &ModelInfo::max_model_len)
      .def_ro("num_layers", &ModelInfo::num_layers)
      .def_ro("hidden_size", &ModelInfo::hidden_size)
      .def_ro("eos_token_ids", &ModelInfo::eos_token_ids)
      .def_ro("weight_dtype", &ModelInfo::weight_dtype)
      .def_ro("quantization", &ModelInfo::quantization)
      .def_ro("weight_bytes", &ModelInfo::weight_bytes)
      .def_ro("kv_cache_bytes", &ModelInfo::kv_cache_bytes)
      .def_ro("device", &ModelInfo::device)
      .def_ro("kv_cache_dtype", &ModelInfo::kv_cache_dtype)
      .def_ro("kv_cache_tokens", &ModelInfo::kv_cache_tokens)
      .def_ro("warnings", &ModelInfo::warnings)
      .def_ro("cuda_graph_batch_sizes", &ModelInfo::cuda_graph_batch_sizes)
      .def_ro("cuda_graph_bytes", &ModelInfo::cuda_graph_bytes)
      .def_ro("takes_media", &ModelInfo::takes_media)
      .def_ro("tensor_parallel_size", &ModelInfo::tensor_parallel_size);

  nb::class_<MediaInput>(m, "MediaInput")
      .def(
          "__init__",
          [](MediaInput* self, const std::string& kind, const std::string& hash, int32_t offset, int32_t grid_t,
             int32_t grid_h, int32_t grid_w, nb::ndarray<const float, nb::ndim<2>, nb::c_contig, nb::device::cpu> pixels) {
            new (self) MediaInput();
            self->kind = kind, self->hash = hash, self->offset = offset;
            self->grid_t = grid_t, self->grid_h = grid_h, self->grid_w = grid_w;
            self->pixels.assign(pixels.data(), pixels.data() + pixels.size());
          },
          "kind"_a, "hash"_a, "offset"_a, "grid_t"_a, "grid_h"_a, "grid_w"_a, "pixels"_a,
          "An image or video frame group of a prompt: its placeholder tokens start at offset; pixels float32 "
          "[patches, patch_dim]")
      .def_ro("kind", &MediaInput::kind)
      .def_ro("hash", &MediaInput::hash)
      .def_ro("offset", &MediaInput::offset);

  nb::class_<Engine>(m, "Engine")
      .def(nb::init<const EngineConfig&>(), "config"_a, nb::call_guard<nb::gil_scoped_release>())
      .def(
          "add_request",
          [](Engine& e, std::vector<int32_t> prompt, const SamplingParams& p, const SchedulingTag& tag,
             std::vector<MediaInput> media) { return e.add_request(std::move(prompt), p, nullptr, tag, std::move(media)); },
          "prompt_token_ids"_a, "params"_a, "tag"_a = SchedulingTag{}, "media"_a = std::vector<MediaInput>{})
      .def("add_requests", &Engine::add_requests, "prompts"_a, "params"_a, "tags"_a = std::vector<SchedulingTag>{},
           "media"_a = std::vector<std::vector<MediaInput>>{})
      .def("abort", &Engine::abort, "request_id"_a)
      .def(
          "await_outputs",
          [](Engine& e, double timeout_s) {
            return e.await_outputs(std::chrono::milliseconds(int64_t(timeout_s * 1000.0)));
          },
          "timeout_s"_a = 0.1, nb::call_guard<nb::gil_scoped_release>())
      .def("stats", &Engine::stats)
      .def("activity", &Engine::activity)
      .def("reset_prefix_cache", &Engine::reset_prefix_cache)
      .def("set_paused", &Engine::set_paused, "paused"_a)
      .def_prop_ro("paused", &Engine::paused)
      .def("sleep", &Engine::sleep, "level"_a = 1, nb::call_guard<nb::gil_scoped_release>())
      .def("wake_up", &Engine::wake_up, nb::call_guard<nb::gil_scoped_release>())
      .def_prop_ro("sleep_level", &Engine::sleep_level)
      .def_prop_ro("model_info", &Engine::model_info, nb::rv_policy::reference_internal)
      .def("shutdown", &Engine::shutdown, nb::call_guard<nb::gil_scoped_release>());
}
