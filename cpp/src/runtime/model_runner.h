// Turns a scheduler step into batch metadata (token ids, positions, cache slots, block tables),
// runs the model forward and returns the logits rows of the requests that sample this step.
//
// On a device backend the metadata goes up in one copy per step, and steps whose sequences all
// compute the same few tokens, each sampled (decode: one token; speculative verify: the last token
// and its k drafts), of up to the largest captured batch size replay a recorded graph, one per
// (batch size, tokens per sequence): the step is padded to the next captured size with sequences
// that write no cache slot or state and whose logits are ignored.
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
  // f32 final hidden states, as RunnerOptions::hidden asks: [logits rows, hidden_size] or [every
  // token row of the step, hidden_size] in scheduling order.
  Tensor hidden;
  // Requests with prompt_logprobs: the logits rows of their prompt positions computed this step
  // (a position's row predicts the next prompt token), in prompt_logits after one another.
  struct PromptRows {
    Request* request;
    int32_t first_position, count;
  };
  std::vector<PromptRows> prompt;
  Tensor prompt_logits;
  // Pooling requests: their token rows of this step (first_position: the first row's position;
  // rows from `row` in `hidden`, which then holds every token row of the step).
  struct PooledRows {
    Request* request;
    int32_t row, first_position, count;
  };
  std::vector<PooledRows> pooled;
};

enum class HiddenRows { kNone, kSampled, kEvery };

// A drafter's run over consecutive positions of one request: positions [start, start +
// tokens.size()), each fed the token that follows it (model/model.h: mtp_forward).
struct DraftSpan {
  const Request* request = nullptr;
  int32_t start = 0;
  std::vector<int32_t> tokens;
  bool wanted = false;  // the logits and hidden state of its last position are wanted
};

// A rollback after rejected drafts: the recurrent state of `slot` (set to the state before the
// verify step) is taken through `count` of the step's kept rows from `first` (CausalLM::replay_states).
struct StateReplay {
  int32_t slot = -1, first = 0, count = 0;
};

struct RunnerOptions {
  int32_t max_model_len = 0;
  std::vector<int32_t> graph_batch_sizes;  // decode batch sizes to capture (device models only)
  HiddenRows hidden = HiddenRows::kNone;  // final hidden states returned too (drafters read them; no graphs)
  // Recurrent models with speculation: a step's verify rows (every row of each request with
  // sample_rows > 1, in scheduling order) keep their recurrent inputs for replay_states.
  bool keep_verify_rows = false;
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
  // The MTP layer `layer` over the spans (each request's block table must cover them), with
  // hidden (f32 [total span tokens, hidden_size]) in span order; logits and hidden states of the
  // wanted spans' last rows, in span order.
  ForwardOutput draft_forward(const std::vector<DraftSpan>& spans, const Tensor& hidden, int32_t layer);
  // Rolls recurrent states forward over rows the last step kept (RunnerOptions::keep_verify_rows).
  void replay_states(const std::vector<StateReplay>& replays);
  int64_t graph_replays() const { return graph_replays_; }
  // Records the graphs of every captured batch size for steps of `tokens_per_sequence` tokens per
  // sequence, the largest first (they share one memory); returns how many it recorded.
  int32_t capture_graphs(int32_t tokens_per_sequence = 1);
  int64_t graph_memory_bytes() const;  // device memory the recorded graphs share
  std::vector<int32_t> recorded_batch_sizes() const;  // of the one-token-per-sequence graphs

 private:
  struct DecodeGraph;
  // Host-side metadata of one step, laid out as the device copy is.
  struct Metadata {
    std::vector<int32_t> ids, positions, slots, rows, query_start, seq_lens, tables, token_seq, state_slots;
    std::vector<int32_t> kept;  // rows of requests verifying drafts
    // Multimodal prompts (ForwardBatch::media_rows ...): rows fed media embeddings, the embeddings,
    // and every row's 3 rotary positions when a row of the step sits in a media span.
    std::vector<int32_t> media_rows, mrope;
    std::vector<float> media_embeds;
    int32_t max_blocks = 1, max_seq_len = 0;
    HiddenRows hidden = HiddenRows::kNone;
  };
  Metadata build(const SchedulerOutput& step, StepLogits& out, int32_t pad_to, int32_t max_blocks, bool fed,
                 int32_t pad_tokens = 1);
  // The media embeddings and rows of request r's tokens [start, start + n) (rows from first_row).
  void media_inputs(const Request& r, int32_t start, int32_t n, int32_t first_row, Metadata& m) const;
  StepLogits run_graph(DecodeGraph& g, const SchedulerOutput& step, const Tensor* fed_ids);
  // Overwrites the token ids of the packed metadata on the device with fed_ids.
  void feed(Tensor& meta, size_t ids_at, const Tensor& fed_ids);
  DecodeGraph* graph_for(const SchedulerOutput& step);
  bool graphs_enabled() const;
  bool capturable(int32_t size, int32_t tokens_per_sequence) const;
  DecodeGraph* record(int32_t size, int32_t tokens_per_sequence);
  ForwardOutput run_metadata(const Metadata& m, const Tensor* fed_ids);  // an eager forward
  Tensor device_ints(const std::vector<int32_t>& v) const;  // int32 on the model's device

  CausalLM& model_;
  KvCache& cache_;
  StateCache* states_;
  RunnerOptions opts_;
  std::map<std::pair<int32_t, int32_t>, std::unique_ptr<DecodeGraph>> graphs_;  // by (padded batch, tokens per sequence)
  int64_t graph_replays_ = 0;
  std::shared_ptr<GraphMemory> graph_memory_;
};

}  // namespace revolta
