// The engine's state behind the public Engine (pimpl). Its files call downwards only:
// engine.cpp (the public calls, the thread's loop, inbox and outbox) -> engine_build.cpp
// (construction, sleep) and engine_step.cpp (one scheduler step) -> engine_spec.cpp (a step with
// speculation, over spec/) -> engine_forward.cpp (the forward and its KV copies) and
// engine_requests.cpp (commits, tokens taken, finishes, staged outputs); engine_stats.cpp
// publishes the stats.
#pragma once

#include <atomic>
#include <condition_variable>
#include <deque>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <unordered_map>
#include <utility>
#include <vector>

#include "cache/cache_coordinator.h"
#include "cache/kv_tiers.h"
#include "core/device_runtime.h"
#include "core/thread_pool.h"
#include "engine/fault_injection.h"
#include "engine/serving.h"
#include "engine/tensor_parallel.h"
#include "model/model.h"
#include "model/vision_encoder.h"
#include "runtime/encoder_cache.h"
#include "revolta/engine.h"
#include "runtime/model_runner.h"
#include "sample/rng.h"
#include "sched/scheduler.h"
#include "spec/drafter.h"
#include "spec/verifier.h"

namespace revolta {

struct Engine::Impl {
  EngineConfig cfg;
  ModelInfo info;
  ModelConfig model_cfg;
  std::unique_ptr<CausalLM> model;
  std::unique_ptr<GrammarTokenizer> grammar_tokenizer;  // guided decoding (null: not configured)
  std::unique_ptr<Serving> serving;  // caches, tiers, scheduler, runner (null: asleep)
  std::unique_ptr<ThreadPool> pool;
  std::unique_ptr<TensorParallelRanks> tp;  // ranks 1.. of tensor_parallel_size > 1 (rank 0 is this thread)
  // Multimodal models: the vision tower (rank 0's device, not sharded) and its outputs by media hash.
  std::unique_ptr<VisionEncoder> vision;
  std::unique_ptr<EncoderCache> encoder_cache;
  // Encodes the media spans the plan's chunks reach that their requests do not hold yet (from the
  // cache, else in one encoder pass), and lets go of those their prompts have read.
  void encode_media(const SchedulerOutput& plan);
  // A new request's media (none: a text prompt); throws std::invalid_argument naming the item at fault.
  void attach_media(Request& r, std::vector<MediaInput> media) const;
  Rng seed_source;

  mutable std::mutex in_mu;
  std::condition_variable in_cv;
  std::deque<std::unique_ptr<Request>> inbox;
  std::vector<uint64_t> abort_box;
  bool stopping = false;
  bool paused = false;                    // (in_mu) set_paused: no steps
  std::atomic<bool> reset_prefix{false};  // reset_prefix_cache asked
  // Engine::activity(): a phase name (static text) and the step it belongs to, set as the engine
  // thread goes, read by other threads.
  std::atomic<const char*> phase{"starting"};
  std::atomic<int64_t> phase_step{0};
  std::atomic<int32_t> phase_requests{0};
  void enter(const char* what, int32_t requests = 0) {
    phase_requests.store(requests, std::memory_order_relaxed);
    phase.store(what, std::memory_order_release);
  }

  std::mutex out_mu;
  std::condition_variable out_cv;
  std::vector<RequestOutput> outbox;
  std::string fatal_error;
  // Throws for a request to a stopped engine, naming the error that stopped it when one did.
  [[noreturn]] void refuse_stopped();

  mutable std::mutex stats_mu;
  EngineStats stats;  // the engine thread's copy is `live`; this one is published per step
  EngineStats live;

  // Outputs of the current iteration; delivered after the stats are published, so a caller that
  // sees a request finish also sees the blocks it released.
  std::vector<std::pair<RequestOutput, OutputCallback>> staged;

  std::atomic<uint64_t> next_id{1};
  std::thread thread;

  explicit Impl(const EngineConfig& c);
  void loop();

  // What construction decided, kept to rebuild what sleep frees.
  Device dev = Device::kCPU;
  std::string weight_dtype;
  int world = 1, threads = 1;
  bool ep = false;
  std::unique_ptr<CachePlan> cache_plan;
  std::unique_ptr<CacheLimits> cache_limits;
  RunnerOptions ropts;
  std::vector<std::pair<float, float>> kv_scales;
  void load_models();      // model (and the ranks' models)
  int32_t build_serving();  // `serving` (and the ranks' runners); returns the layers without KV scales
  // Sleep mode (Engine::sleep / wake_up): the engine thread moves sleep_level to sleep_wanted.
  int sleep_wanted = 0;  // (in_mu)
  int sleep_level = 0;   // (in_mu; written by the engine thread)
  std::condition_variable sleep_cv;
  std::deque<std::unique_ptr<Request>> parked;  // engine thread: the requests held while asleep
  EngineStats dropped;  // the counters of the caches, tiers, scheduler and runner that sleep freed
  void change_sleep(int level);
  // A step whose device work is queued and whose greedy tokens are on their way to the host; row
  // i of ids belongs to samplers[i], null once that request has finished.
  struct Queued {
    std::vector<ScheduledRequest> scheduled;
    std::vector<Request*> samplers;
    Tensor ids;  // [samplers] int32 on the model's device
    std::vector<int32_t> host;
    std::unique_ptr<PendingCopy> copy;
    const std::vector<int32_t>& tokens();  // waits for the copy
    void drop(Request* r);
  };
  std::vector<StateAction> rank_snapshots;  // made by rank 0's commits, not yet repeated by the other ranks
  std::optional<Queued> ahead;  // async scheduling: queued before the previous step's tokens were read
  bool async_scheduling = false;

  // Requests of the step being run: if it throws (anything but a DeviceError), they fail with the
  // error and the engine goes on with the others.
  std::vector<uint64_t> step_ids;
  FaultInjection fault = FaultInjection::from_env();

  // One scheduler step; with may_run_ahead the step after it may be queued before its tokens are read.
  void step(bool may_run_ahead);
  void run_step(bool may_run_ahead);  // step() with its failure confined to its requests
  void begin_step(const std::vector<ScheduledRequest>& scheduled);
  // The cache actions, then every rank's forward; fed_ids: ModelRunner::execute's (async scheduling).
  StepLogits forward(const SchedulerOutput& plan, const Tensor* fed_ids = nullptr);
  // prompt_logprobs: the log-probability (and top alternatives) of each prompt token whose
  // predecessor's row this step computed, kept on the request until its first output.
  void collect_prompt_logprobs(const StepLogits& result);
  // Pooling requests: their rows' hidden states summed (or the last kept) as prompt chunks run;
  // those whose prompt is done end at the start of the next step, before it is scheduled.
  void collect_pooled(const StepLogits& result);
  void finish_pooled();
  std::vector<uint64_t> pooled_done;
  void fail_step(const std::string& what);
  // A request's grammar matcher (null without guided_kind); the tokenizer is made on first use.
  std::unique_ptr<GrammarMatcher> make_grammar(const SamplingParams& p);
  std::mutex grammar_mu;
  // The copies between the device caches and the offload tiers decided since the last forward,
  // queued on every rank (before a forward, and when the engine goes idle). Loads are in the work
  // order before the forward; saves reach the tiers at the next call (settle: before it returns).
  void move_kv_blocks(bool settle = false);
  void settle_kv_saves();
  struct {
    std::vector<BlockTransfer> transfers;
    std::vector<std::unique_ptr<PendingCopy>> pending;
  } kv_saves;
  void commit(const std::vector<ScheduledRequest>& scheduled);
  Queued queue_greedy(const std::vector<ScheduledRequest>& scheduled, StepLogits& result);
  bool can_run_ahead(const Queued& cur);
  Queued run_ahead(const Queued& cur);
  void sample_now(StepLogits& result);
  // Speculative decoding (engine_spec.cpp): a drafter proposes, the forward computes the drafts
  // with each request's last token, the verifier keeps what the target confirms.
  bool speculative = false;
  bool mtp = false;  // drafts from the checkpoint's MTP layers (else n-gram lookup)
  std::unique_ptr<Drafter> drafter;
  std::unique_ptr<Verifier> verifier;
  std::unordered_map<uint64_t, std::vector<std::vector<float>>> drawn_q;  // this step's drafts drawn from a distribution
  void make_speculation();
  void speculative_step();
  void propose_drafts();
  void finish_speculative_step(const std::vector<ScheduledRequest>& scheduled, StepLogits& result);
  void force_acceptance(const int32_t* draft, Verdict& v);
  void commit_one(Request& r, int32_t num_new_tokens);
  // Appends a sampled token; finishes the request (true) or emits it.
  bool accept(Request& r, TokenOutput tok);
  void emit(Request& r, bool finished);
  void deliver();
  void finish(Request& r, FinishReason reason, int32_t stop_token = -1);
  void publish_stats();
};

}  // namespace revolta
