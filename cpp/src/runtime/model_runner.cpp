#include "runtime/model_runner.h"

#include <algorithm>
#include <cstring>

#include "core/error.h"

namespace revolta {
namespace {

// Verify graphs are recorded for up to this many tokens per sequence (the last token + 7 drafts).
constexpr int32_t kMaxGraphTokensPerSequence = 8;

// The metadata vectors in one int32 buffer, in a fixed order; `at` gives each one's offset.
enum Part { kIds, kPositions, kSlots, kRows, kQueryStart, kSeqLens, kTables, kTokenSeq, kStateSlots };

struct Packed {
  std::vector<int32_t> host;
  std::vector<size_t> at;
};

}  // namespace

// A recorded decode step for a fixed padded batch size: static device inputs, updated in one
// copy before each replay, and the logits tensor the recorded forward writes.
struct ModelRunner::DecodeGraph {
  int32_t batch = 0, max_blocks = 0, tokens = 1;  // padded sequences, tokens per sequence
  Tensor meta;  // device int32: the packed metadata
  ForwardBatch batch_desc;
  Tensor logits, hidden;          // the recorded forward's outputs (hidden: with HiddenRows::kEvery)
  std::vector<Tensor> kept;       // the model's kept inputs the recorded forward writes
  std::unique_ptr<DeviceGraph> graph;
};

namespace {

template <typename M>
Packed pack(const M& m) {
  Packed p;
  for (const auto* v : {&m.ids, &m.positions, &m.slots, &m.rows, &m.query_start, &m.seq_lens, &m.tables, &m.token_seq,
                        &m.state_slots}) {
    p.at.push_back(p.host.size());
    p.host.insert(p.host.end(), v->begin(), v->end());
  }
  return p;
}

// Points the batch at the packed metadata `meta` (on the model's device): T token rows, S
// sequences; the attention's host arrays at m (valid through the forward), device mirrors too.
template <typename M>
void bind(ForwardBatch& b, const Tensor& meta, const Packed& p, const M& m, int32_t T, int32_t S, int32_t block_size) {
  auto part = [&](Part k, int64_t n) { return meta.slice_rows(int64_t(p.at[k]), int64_t(p.at[k]) + n); };
  b.token_ids = part(kIds, T);
  b.positions = part(kPositions, T);
  b.slot_mapping = part(kSlots, T);
  b.logits_row_ids = part(kRows, int64_t(m.rows.size()));
  b.logits_rows = m.rows;
  if (m.hidden == HiddenRows::kSampled) {  // the hidden states of the same rows
    b.hidden_row_ids = b.logits_row_ids;
    b.hidden_rows = m.rows;
  } else if (m.hidden == HiddenRows::kEvery) {
    b.hidden_rows.resize(size_t(T));
    for (int32_t t = 0; t < T; ++t) b.hidden_rows[size_t(t)] = t;
  }
  b.seq_starts = part(kQueryStart, S + 1);
  b.seq_state_slots = part(kStateSlots, S);
  b.attention.query_start = m.query_start.data();
  b.attention.seq_lens = m.seq_lens.data();
  b.attention.block_tables = m.tables.data();
  b.attention.num_seqs = S;
  b.attention.max_blocks_per_seq = m.max_blocks;
  b.attention.block_size = block_size;
  b.attention.max_seq_len = m.max_seq_len;
  if (meta.device() != Device::kCPU) {
    const int32_t* d = meta.ptr<int32_t>();
    b.attention.dev_query_start = d + p.at[kQueryStart];
    b.attention.dev_seq_lens = d + p.at[kSeqLens];
    b.attention.dev_block_tables = d + p.at[kTables];
    b.attention.dev_token_seq = d + p.at[kTokenSeq];
  }
}

}  // namespace

ModelRunner::ModelRunner(CausalLM& model, KvCache& cache, StateCache* states, RunnerOptions options)
    : model_(model), cache_(cache), states_(states), opts_(std::move(options)) {}

ModelRunner::~ModelRunner() = default;

ModelRunner::Metadata ModelRunner::build(const SchedulerOutput& step, StepLogits& out, int32_t pad_to,
                                         int32_t max_blocks, bool fed, int32_t pad_tokens) {
  const int32_t S = int32_t(step.scheduled.size());
  const int32_t bs = cache_.block_size;
  Metadata m;
  m.max_blocks = max_blocks;
  for (const auto& s : step.scheduled) m.max_blocks = std::max(m.max_blocks, int32_t(s.request->block_table.size()));
  const int32_t rows = std::max(S, pad_to);
  m.query_start.assign(size_t(rows) + 1, 0);
  m.seq_lens.assign(size_t(rows), 1);
  m.tables.assign(size_t(rows) * size_t(m.max_blocks), 0);
  int32_t t = 0;
  for (int32_t s = 0; s < S; ++s) {
    Request& r = *step.scheduled[size_t(s)].request;
    const int32_t n = step.scheduled[size_t(s)].num_new_tokens;
    const int32_t start = r.num_computed_tokens;
    // Fed ids replace the first S token ids: every request then feeds exactly its one new token.
    RV_CHECK(r.last_token_on_device == fed && (!fed || (n == 1 && t == s && start + 1 == r.num_tokens())),
             "model runner: request ", r.id, fed ? " is not a decode of a token still on the device, yet ids are fed"
                                               : "'s input token is still on the device and is not fed to this step");
    for (int32_t i = 0; i < n; ++i, ++t) {
      const int32_t p = start + i;
      m.ids.push_back(r.tokens[size_t(p)]);
      m.positions.push_back(r.rope_position(p));
      m.slots.push_back(r.block_table[size_t(p / bs)] * bs + p % bs);
      m.token_seq.push_back(s);
    }
    if (r.media) media_inputs(r, start, n, t - n, m);
    m.query_start[size_t(s) + 1] = t;
    m.seq_lens[size_t(s)] = start + n;
    m.max_seq_len = std::max(m.max_seq_len, start + n);
    std::copy(r.block_table.begin(), r.block_table.end(), m.tables.begin() + size_t(s) * size_t(m.max_blocks));
    m.state_slots.push_back(r.state_slot);
    if (r.sample_rows > 1)
      for (int32_t i = t - n; i < t; ++i) m.kept.push_back(i);
    if (!r.params.pooling.empty()) {  // its hidden states are pooled; nothing is sampled
      out.pooled.push_back({&r, t - n, start, n});
    } else if (start + n == r.num_tokens()) {  // its last `sample_rows` positions are sampled
      RV_CHECK(r.sample_rows >= 1 && r.sample_rows <= n, "model runner: request ", r.id, " samples ", r.sample_rows,
               " rows of a step that computes ", n, " of its tokens");
      for (int32_t k = r.sample_rows; k > 0; --k) m.rows.push_back(t - k);
      out.samplers.push_back(&r);
      out.rows_per_sampler.push_back(r.sample_rows);
    }
  }
  // Prompt positions whose next token's log-probability was asked for: rows after the sampled ones
  // (never in a graph's step: those compute a request's last tokens, past its prompt).
  for (int32_t s = 0, first_row = 0; s < S; first_row += step.scheduled[size_t(s)].num_new_tokens, ++s) {
    Request& r = *step.scheduled[size_t(s)].request;
    if (r.params.prompt_logprobs < 0) continue;
    const int32_t start = r.num_computed_tokens;
    const int32_t end = std::min(start + step.scheduled[size_t(s)].num_new_tokens, r.num_prompt_tokens - 1);
    if (end <= start) continue;
    for (int32_t p = start; p < end; ++p) m.rows.push_back(first_row + (p - start));
    out.prompt.push_back({&r, start, end - start});
  }
  if (!m.media_rows.empty() || std::any_of(step.scheduled.begin(), step.scheduled.end(), [](const ScheduledRequest& x) {
        return x.request->media && x.request->media->spatial(x.request->num_computed_tokens,
                                                             x.request->num_computed_tokens + x.num_new_tokens);
      })) {
    for (const ScheduledRequest& x : step.scheduled)  // every row's 3 positions (text rows: equal)
      for (int32_t p = x.request->num_computed_tokens; p < x.request->num_computed_tokens + x.num_new_tokens; ++p)
        for (int a = 0; a < 3; ++a) m.mrope.push_back(x.request->media ? x.request->media->position(p, a) : p);
  }
  for (int32_t s = S; s < rows; ++s) {  // padding: pad_tokens tokens per sequence, no cache or state write
    m.state_slots.push_back(-1);
    for (int32_t i = 0; i < pad_tokens; ++i, ++t) {
      m.ids.push_back(0);
      m.positions.push_back(i);
      m.slots.push_back(-1);
      m.token_seq.push_back(s);
      m.rows.push_back(t);
    }
    m.query_start[size_t(s) + 1] = t;
    m.seq_lens[size_t(s)] = pad_tokens;
    m.max_seq_len = std::max(m.max_seq_len, pad_tokens);
  }
  return m;
}

void ModelRunner::media_inputs(const Request& r, int32_t start, int32_t n, int32_t first_row, Metadata& m) const {
  const auto& spans = r.media->spans;
  for (size_t i = 0; i < spans.size(); ++i) {
    const int32_t b = std::max(start, spans[i].input.offset), e = std::min(start + n, spans[i].end());
    if (b >= e) continue;
    RV_CHECK(i < r.encoded.size() && r.encoded[i], "model runner: request ", r.id, "'s media item ", i,
             " is scheduled before it was encoded");
    const Tensor& enc = *r.encoded[i];
    const int64_t H = enc.size(1);
    for (int32_t p = b; p < e; ++p) {
      m.media_rows.push_back(first_row + (p - start));
      const float* row = enc.ptr<float>() + int64_t(p - spans[i].input.offset) * H;
      m.media_embeds.insert(m.media_embeds.end(), row, row + H);
    }
  }
}

ModelRunner::DecodeGraph* ModelRunner::graph_for(const SchedulerOutput& step) {
  if (!graphs_enabled() || step.scheduled.empty()) return nullptr;
  const int32_t S = int32_t(step.scheduled.size()), q = step.scheduled[0].num_new_tokens;
  for (const auto& s : step.scheduled) {  // every sequence computes its last q tokens and samples them all
    const Request& r = *s.request;
    if (s.num_new_tokens != q || !r.params.pooling.empty() || r.sample_rows != q || r.num_computed_tokens + q != r.num_tokens() ||
        (r.media && r.media->spatial(r.num_computed_tokens, r.num_tokens())))
      return nullptr;
  }
  int32_t size = 0;
  for (int32_t b : opts_.graph_batch_sizes)
    if (b >= S && (size == 0 || b < size)) size = b;
  if (size == 0 || !capturable(size, q)) return nullptr;
  if (auto it = graphs_.find({size, q}); it != graphs_.end()) return it->second.get();
  return record(size, q);
}

bool ModelRunner::graphs_enabled() const {
  return model_.device() != Device::kCPU && !opts_.graph_batch_sizes.empty() && opts_.hidden != HiddenRows::kSampled;
}

bool ModelRunner::capturable(int32_t size, int32_t q) const {
  return q <= kMaxGraphTokensPerSequence && size * q <= model_.max_captured_batch() &&
         (q == 1 || model_.captures_verify_steps());
}

int32_t ModelRunner::capture_graphs(int32_t tokens_per_sequence) {
  if (!graphs_enabled()) return 0;
  std::vector<int32_t> sizes;
  for (int32_t b : opts_.graph_batch_sizes)
    if (capturable(b, tokens_per_sequence)) sizes.push_back(b);
  std::sort(sizes.rbegin(), sizes.rend());  // the largest first: the smaller ones fit in its blocks
  if (sizes.empty()) return 0;
  {  // An eager run first: whatever the model keeps from its first forward is not graph memory.
    StepLogits unused;
    Metadata m = build(SchedulerOutput{}, unused, sizes[0], 1, false, tokens_per_sequence);
    m.hidden = opts_.hidden;
    run_metadata(m, nullptr);
  }
  int32_t n = 0;
  for (int32_t b : sizes)
    if (!graphs_.count({b, tokens_per_sequence})) n += record(b, tokens_per_sequence) != nullptr;
  return n;
}

std::vector<int32_t> ModelRunner::recorded_batch_sizes() const {
  std::vector<int32_t> sizes;
  for (const auto& [key, g] : graphs_)
    if (key.second == 1) sizes.push_back(key.first);
  return sizes;
}

int64_t ModelRunner::graph_memory_bytes() const { return graph_memory_ ? int64_t(graph_memory_->bytes()) : 0; }

// Records the step of `size` padded sequences of q tokens: static inputs sized for the padded
// batch and the longest block table. It joins the map only once recorded, so a failed recording
// is retried rather than replayed.
ModelRunner::DecodeGraph* ModelRunner::record(int32_t size, int32_t q) {
  auto g = std::make_unique<DecodeGraph>();
  g->batch = size;
  g->tokens = q;
  g->max_blocks = (opts_.max_model_len + cache_.block_size - 1) / cache_.block_size;
  StepLogits unused;
  Metadata m = build(SchedulerOutput{}, unused, size, g->max_blocks, false, q);
  m.hidden = opts_.hidden;
  const Packed p = pack(m);
  g->meta = Tensor::empty({int64_t(p.host.size())}, DType::kI32, model_.device());
  device_runtime(model_.device()).copy_to_device(g->meta.data(), p.host.data(), p.host.size() * 4);
  ForwardBatch& b = g->batch_desc;
  bind(b, g->meta, p, m, size * q, size, cache_.block_size);
  std::vector<Tensor>* kept = model_.kept_inputs();
  if (opts_.keep_verify_rows && q > 1 && kept) {  // a verify graph keeps every row (padding last)
    std::vector<int32_t> all(size_t(size * q));
    for (size_t i = 0; i < all.size(); ++i) all[i] = int32_t(i);
    b.kept_rows = device_ints(all);
  }
  // Replays see other steps' metadata: nothing may be planned from these host arrays.
  b.attention.query_start = b.attention.seq_lens = b.attention.block_tables = nullptr;
  b.attention.max_seq_len = opts_.max_model_len;
  b.attention.decode_only = true;
  b.attention.tokens_per_seq = q;
  ModelCaches caches{&cache_, states_};
  DecodeGraph* raw = g.get();
  DeviceRuntime& rt = device_runtime(model_.device());
  if (!graph_memory_) graph_memory_ = rt.graph_memory();
  raw->graph = rt.capture(
      [&] {
        // The sizing run's outputs go back to the pool before the recorded run.
        raw->logits = raw->hidden = Tensor();
        if (kept) kept->clear();
        ForwardOutput f = model_.forward(raw->batch_desc, caches);
        raw->logits = f.logits;
        raw->hidden = f.hidden;
      },
      graph_memory_);
  if (raw->batch_desc.kept_rows.defined()) raw->kept = *kept;
  graphs_[{size, q}] = std::move(g);
  return raw;
}

void ModelRunner::feed(Tensor& meta, size_t ids_at, const Tensor& fed_ids) {
  RV_CHECK(fed_ids.dtype() == DType::kI32 && fed_ids.device() == meta.device(),
           "model runner: fed token ids must be int32 on the model's device");
  int32_t* dst = meta.ptr<int32_t>() + ids_at;
  const size_t bytes = size_t(fed_ids.numel()) * 4;
  if (meta.device() == Device::kCPU) std::memcpy(dst, fed_ids.data(), bytes);
  else device_runtime(meta.device()).copy_on_device(dst, fed_ids.data(), bytes);
}

StepLogits ModelRunner::run_graph(DecodeGraph& g, const SchedulerOutput& step, const Tensor* fed_ids) {
  StepLogits out;
  Metadata m = build(step, out, g.batch, g.max_blocks, fed_ids != nullptr, g.tokens);
  RV_CHECK(m.max_blocks == g.max_blocks, "decode graph: block table longer than max_model_len allows");
  const Packed p = pack(m);
  device_runtime(model_.device()).copy_to_device(g.meta.data(), p.host.data(), p.host.size() * 4);
  if (fed_ids) feed(g.meta, p.at[kIds], *fed_ids);
  g.graph->replay();
  ++graph_replays_;
  const int64_t T = int64_t(step.scheduled.size()) * g.tokens;
  out.logits = g.logits.slice_rows(0, T);
  if (g.hidden.defined()) out.hidden = g.hidden.slice_rows(0, T);
  if (!g.kept.empty()) *model_.kept_inputs() = g.kept;  // replay_states reads what the graph wrote
  return out;
}

StepLogits ModelRunner::execute(const SchedulerOutput& step, const std::vector<StateAction>& state_actions,
                                const Tensor* fed_ids) {
  RV_CHECK(!fed_ids || fed_ids->numel() == int64_t(step.scheduled.size()), "model runner: ",
           fed_ids ? fed_ids->numel() : 0, " fed token ids for ", step.scheduled.size(), " scheduled requests");
  RV_CHECK(states_ || state_actions.empty(), "model runner: state actions for a model without recurrent state");
  if (!state_actions.empty()) states_->apply(state_actions);  // eagerly, before any graph replay
  if (DecodeGraph* g = graph_for(step)) return run_graph(*g, step, fed_ids);
  StepLogits out;
  Metadata m = build(step, out, 0, 1, fed_ids != nullptr);
  m.hidden = out.pooled.empty() ? opts_.hidden : HiddenRows::kEvery;
  ForwardOutput f = run_metadata(m, fed_ids);
  out.logits = f.logits;
  out.hidden = f.hidden;
  if (!out.prompt.empty()) {  // the sampled rows first, then the prompt positions'
    int64_t sampled = 0, prompt = 0;
    for (int32_t n : out.rows_per_sampler) sampled += n;
    for (const auto& pr : out.prompt) prompt += pr.count;
    out.prompt_logits = f.logits.slice_rows(sampled, sampled + prompt);
    out.logits = f.logits.slice_rows(0, sampled);
    if (m.hidden == HiddenRows::kSampled && f.hidden.defined()) out.hidden = f.hidden.slice_rows(0, sampled);
  }
  return out;
}

ForwardOutput ModelRunner::run_metadata(const Metadata& m, const Tensor* fed_ids) {
  const int32_t T = int32_t(m.ids.size()), S = int32_t(m.seq_lens.size());
  const Device dev = model_.device();
  const Packed p = pack(m);
  Tensor meta = Tensor::uninitialized({int64_t(std::max<size_t>(1, p.host.size()))}, DType::kI32, dev);
  if (dev == Device::kCPU) std::copy(p.host.begin(), p.host.end(), meta.ptr<int32_t>());
  else device_runtime(dev).copy_to_device(meta.data(), p.host.data(), p.host.size() * 4);
  if (fed_ids) feed(meta, p.at[kIds], *fed_ids);
  ForwardBatch b;
  bind(b, meta, p, m, T, S, cache_.block_size);
  if (opts_.keep_verify_rows && !m.kept.empty()) b.kept_rows = device_ints(m.kept);
  if (!m.media_rows.empty()) {
    b.media_rows = device_ints(m.media_rows);
    const int64_t M = int64_t(m.media_rows.size());
    Tensor e = Tensor::empty({M, int64_t(m.media_embeds.size()) / M}, DType::kF32);
    std::copy(m.media_embeds.begin(), m.media_embeds.end(), e.ptr<float>());
    b.media_embeds = e.to(dev);
  }
  if (!m.mrope.empty()) b.mrope_positions = device_ints(m.mrope).view({T, 3});
  ModelCaches caches{&cache_, states_};
  return model_.forward(b, caches);
}

Tensor ModelRunner::device_ints(const std::vector<int32_t>& v) const {
  Tensor t = Tensor::empty({int64_t(v.size())}, DType::kI32);
  std::copy(v.begin(), v.end(), t.ptr<int32_t>());
  return t.to(model_.device());
}

void ModelRunner::replay_states(const std::vector<StateReplay>& replays) {
  if (replays.empty()) return;
  std::vector<int32_t> rows, starts{0}, slots;
  for (const StateReplay& r : replays) {
    for (int32_t i = 0; i < r.count; ++i) rows.push_back(r.first + i);
    starts.push_back(int32_t(rows.size()));
    slots.push_back(r.slot);
  }
  ModelCaches caches{&cache_, states_};
  model_.replay_states(device_ints(rows), device_ints(starts), device_ints(slots), caches);
}

ForwardOutput ModelRunner::draft_forward(const std::vector<DraftSpan>& spans, const Tensor& hidden, int32_t layer) {
  const int32_t bs = cache_.block_size, S = int32_t(spans.size());
  Metadata m;
  for (const DraftSpan& d : spans) m.max_blocks = std::max(m.max_blocks, int32_t(d.request->block_table.size()));
  m.query_start.assign(size_t(S) + 1, 0);
  m.tables.assign(size_t(S) * size_t(m.max_blocks), 0);
  int32_t t = 0;
  for (int32_t s = 0; s < S; ++s) {
    const DraftSpan& d = spans[size_t(s)];
    const Request& r = *d.request;
    const int32_t n = int32_t(d.tokens.size()), end = d.start + n;
    RV_CHECK(n > 0 && int64_t(end) <= int64_t(r.block_table.size()) * bs, "model runner: draft span of request ", r.id,
             " [", d.start, ", ", end, ") beyond its ", r.block_table.size(), " blocks");
    for (int32_t i = 0; i < n; ++i, ++t) {
      const int32_t p = d.start + i;
      m.ids.push_back(d.tokens[size_t(i)]);
      m.positions.push_back(r.rope_position(p));
      m.slots.push_back(r.block_table[size_t(p / bs)] * bs + p % bs);
      m.token_seq.push_back(s);
    }
    m.query_start[size_t(s) + 1] = t;
    m.seq_lens.push_back(end);
    m.max_seq_len = std::max(m.max_seq_len, end);
    std::copy(r.block_table.begin(), r.block_table.end(), m.tables.begin() + size_t(s) * size_t(m.max_blocks));
    m.state_slots.push_back(-1);
    if (d.wanted) m.rows.push_back(t - 1);
  }
  RV_CHECK(hidden.size(0) == t, "model runner: ", hidden.size(0), " hidden rows for ", t, " draft tokens");
  m.hidden = HiddenRows::kSampled;
  const Device dev = model_.device();
  const Packed p = pack(m);
  Tensor meta = Tensor::uninitialized({int64_t(p.host.size())}, DType::kI32, dev);
  if (dev == Device::kCPU) std::copy(p.host.begin(), p.host.end(), meta.ptr<int32_t>());
  else device_runtime(dev).copy_to_device(meta.data(), p.host.data(), p.host.size() * 4);
  ForwardBatch b;
  bind(b, meta, p, m, t, S, bs);
  ModelCaches caches{&cache_, states_};
  return model_.mtp_forward(b, hidden, layer, caches);
}

}  // namespace revolta
