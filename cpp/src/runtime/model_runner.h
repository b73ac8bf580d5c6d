// Turns a scheduler step into batch metadata (token ids, positions, cache slots, block tables),
// runs the model forward and returns the logits rows of the requests that sample this step.
//
// On a device backend the metadata goes up in one copy per step, and pure decode steps (one new
// token per sequence) of up to the largest captured batch size replay a recorded graph: the step
// is padded to the next captured size with rows that write no cache slot and whose logits are
// ignored.
#pragma once

#include <map>
#include <memory>
#include <vector>

#include "cache/kv_cache.h"
#include "core/device_runtime.h"
#include "model/model.h"
#include "sched/scheduler.h"

namespace revolta {

struct StepLogits {
  Tensor logits;                   // [sum of rows_per_sampler, vocab] f32, on the model's device
  std::vector<Request*> samplers;  // requests that reach their last token this step
  // Logits rows of each sampler, in order: its last Request::sample_rows positions (1, or 1 +
  // its draft tokens when a verifier checks them).
  std::vector<int32_t> rows_per_sampler;
  Tensor hidden;  // [logits rows, hidden_size] f32 final hidden states, with RunnerOptions::return_hidden
};

struct RunnerOptions {
  int32_t max_model_len = 0;
  std::vector<int32_t> graph_batch_sizes;  // decode batch sizes to capture (device models only)
  bool return_hidden = false;  // the final hidden states of the sampled rows too (drafters read them; no graphs)
};

class ModelRunner {
 public:
  ModelRunner(CausalLM& model, KvCache& cache, StateCache* states, RunnerOptions options = {});
  ~ModelRunner();
  // fed_ids (async scheduling): [scheduled.size()] int32 on the model's device, the input token of
  // each scheduled request (one new token each), produced by the previous step and not yet read by
  // the host; those requests' last token is a placeholder (Request::last_token_on_device).
  // state_actions (the cache coordinator's, for this step) run first.
  StepLogits execute(const SchedulerOutput& step, const std::vector<StateAction>& state_actions,
                     const Tensor* fed_ids = nullptr);
  int64_t graph_replays() const { return graph_replays_; }

 private:
  struct DecodeGraph;
  // Host-side metadata of one step, laid out as the device copy is.
  struct Metadata {
    std::vector<int32_t> ids, positions, slots, rows, query_start, seq_lens, tables, token_seq, state_slots;
    int32_t max_blocks = 1, max_seq_len = 0;
    bool hidden = false;  // the hidden states of `rows` are wanted too
  };
  Metadata build(const SchedulerOutput& step, StepLogits& out, int32_t pad_to, int32_t max_blocks, bool fed);
  StepLogits run_graph(DecodeGraph& g, const SchedulerOutput& step, const Tensor* fed_ids);
  // Overwrites the token ids of the packed metadata on the device with fed_ids.
  void feed(Tensor& meta, size_t ids_at, const Tensor& fed_ids);
  DecodeGraph* graph_for(const SchedulerOutput& step);

  CausalLM& model_;
  KvCache& cache_;
  StateCache* states_;
  RunnerOptions opts_;
  std::map<int32_t, std::unique_ptr<DecodeGraph>> graphs_;  // by padded batch size
  int64_t graph_replays_ = 0;
};

}  // namespace revolta
