// Speculative decoding in the engine step. Before a step, each running request in decode gets up
// to num_speculative_tokens drafts appended to its tokens (the scheduling rule then computes them
// with its last token, and the runner samples all of them: Request::sample_rows). After the
// forward, row j is the target's distribution after draft j - 1. Greedy requests keep drafts while
// they equal the row's (adjusted) argmax; sampled ones draw every row as without speculation and
// keep drafts while they equal the draws, which is rejection sampling of a point-mass draft
// exactly, so the output follows the target. The first row that differs gives the next token
// (all accepted: the last row gives a bonus token); rejected drafts leave tokens and KV blocks,
// and the step is committed with the accepted length only, so no block holding a rejected draft
// is ever hashed for prefix caching. A recurrent state that ran through rejected drafts is
// restored to the state before the step and replayed through the kept tokens' recurrences only.
//
// MTP drafting (vLLM's order): after each forward the MTP layer runs over every position the step
// computed whose next token is now known, fed that token and the target's hidden state there,
// which writes its K/V and, at a request's last position, gives its first draft; further drafts
// come from the MTP layer fed its own output hidden state and the previous draft.
#include <algorithm>
#include <chrono>
#include <unordered_map>

#include "core/device_runtime.h"
#include "core/error.h"
#include "engine/engine_impl.h"
#include "ops/ops.h"
#include "sample/sampler.h"
#include "ops/cpu/cpu_ops.h"
#include "spec/ngram_drafter.h"
#include "spec/sampled_drafts.h"

namespace revolta {

namespace {

int64_t micros(std::chrono::steady_clock::duration d) {
  return int64_t(std::chrono::duration_cast<std::chrono::microseconds>(d).count());
}

// A step yields at most drafts + 1 tokens: drafts stay within max_tokens and max_model_len.
int32_t draft_room(const Request& r, const EngineConfig& cfg) {
  return std::min(r.params.max_tokens - r.num_output_tokens(), cfg.max_model_len - r.num_tokens()) - 1;
}

}  // namespace

void Engine::Impl::speculative_step() {
  phase_step = live.num_steps + 1;
  enter("speculative step");
  using Clock = std::chrono::steady_clock;
  const auto t0 = Clock::now();
  propose_drafts();
  const auto t1 = Clock::now();
  SchedulerOutput plan = scheduler->schedule();
  if (plan.empty()) return;
  begin_step(plan.scheduled);
  std::unordered_map<const Request*, StepRows> rows;
  int32_t row = 0;
  bool drafted = false;
  for (const ScheduledRequest& s : plan.scheduled) {
    rows[s.request] = {s.request->num_computed_tokens, row, s.num_new_tokens};
    row += s.num_new_tokens;
    drafted |= s.request->num_draft_tokens > 0;
  }
  StepLogits result = forward(plan);
  ++live.num_steps;
  finish_speculative_step(plan.scheduled, result);
  const auto t2 = Clock::now();
  if (mtp) draft_with_mtp(rows, result.hidden);
  live.spec_draft_time_us += micros(t1 - t0) + micros(Clock::now() - t2);
  if (drafted) live.spec_verify_time_us += micros(t2 - t1);
}

void Engine::Impl::draft_with_mtp(const std::unordered_map<const Request*, StepRows>& rows, const Tensor& hidden) {
  // Finished requests have left running(); the step's rows of the others are still in `hidden`.
  std::vector<DraftSpan> spans;
  std::vector<int32_t> hidden_rows;
  std::vector<Request*> drafting;
  for (Request* r : scheduler->running()) {
    const auto it = rows.find(r);
    if (it == rows.end()) continue;
    const StepRows& s = it->second;
    // The step's positions whose next token is known: all but a decoding request's last token.
    const int32_t m = std::min(s.count, r->num_tokens() - 1 - s.start);
    if (m <= 0) continue;
    DraftSpan d;
    d.request = r;
    d.start = s.start;
    d.tokens.assign(r->tokens.begin() + s.start + 1, r->tokens.begin() + s.start + 1 + m);
    d.wanted = s.start + m == r->num_tokens() - 1 && draft_room(*r, cfg) > 0;
    if (d.wanted) drafting.push_back(r);
    r->mtp_drafts.clear();
    r->mtp_draft_q.clear();
    r->mtp_drafts_at = -1;
    for (int32_t i = 0; i < m; ++i) hidden_rows.push_back(s.row + i);
    spans.push_back(std::move(d));
  }
  if (spans.empty()) return;
  const Device dev = hidden.device();
  auto device_rows = [&](const std::vector<int32_t>& ids) {
    Tensor t = Tensor::empty({int64_t(ids.size())}, DType::kI32);
    std::copy(ids.begin(), ids.end(), t.ptr<int32_t>());
    return t.to(dev);
  };
  Tensor h = Tensor::uninitialized({int64_t(hidden_rows.size()), hidden.size(1)}, DType::kF32, dev);
  ops::gather_rows(hidden, device_rows(hidden_rows), h);
  // Under tensor parallelism every rank drafts from its own hidden states (the same values).
  ForwardOutput out = tp ? tp->draft_forward(spans, hidden_rows, true, 0, [&] { return runner->draft_forward(spans, h, 0); })
                         : runner->draft_forward(spans, h, 0);
  const int32_t L = model->num_mtp_layers(), V = model_cfg.vocab_size;
  // Probabilistic drafts of sampled requests: drawn on the host from the MTP layer's distribution
  // under the request's temperature, top-k, top-p and min-p (kept for verification).
  auto sampled_draft = [&](const Request* r) {
    return cfg.draft_sample_method == "probabilistic" && r->params.temperature > 1e-5f;
  };
  for (int32_t j = 1; !drafting.empty(); ++j) {
    Tensor ids = Tensor::uninitialized({int64_t(drafting.size())}, DType::kI32, dev);
    ops::argmax(out.logits, ids);
    const Tensor host = ids.to(Device::kCPU);
    Tensor host_logits;
    if (std::any_of(drafting.begin(), drafting.end(), sampled_draft)) host_logits = out.logits.to(Device::kCPU);
    std::vector<DraftSpan> next;
    std::vector<int32_t> keep;  // rows of out.hidden that feed the next MTP step
    std::vector<Request*> still;
    for (size_t i = 0; i < drafting.size(); ++i) {
      Request* r = drafting[i];
      const int32_t N = r->num_tokens();
      int32_t draft = host.ptr<int32_t>()[i];
      if (sampled_draft(r)) {
        std::vector<float> q = ops::cpu::sample_weights(host_logits.ptr<float>() + int64_t(i) * V, V, draft_row(r->params), nullptr);
        draft = ops::cpu::draw_index_order(q, r->rng.uniform());
        r->mtp_draft_q.push_back(std::move(q));
      }
      r->mtp_drafts.push_back(draft);
      r->mtp_drafts_at = N;
      // Draft j + 1 comes from position N - 2 + j, fed draft j: its block must exist.
      if (j >= std::min(cfg.num_speculative_tokens, draft_room(*r, cfg)) ||
          !caches->manager().allocate_slots(*r, N - 1 + j - r->num_computed_tokens))
        continue;
      DraftSpan d;
      d.request = r;
      d.start = N - 2 + j;
      d.tokens = {r->mtp_drafts.back()};
      d.wanted = true;
      next.push_back(std::move(d));
      keep.push_back(int32_t(i));
      still.push_back(r);
    }
    if (next.empty()) break;
    Tensor fed = Tensor::uninitialized({int64_t(keep.size()), out.hidden.size(1)}, DType::kF32, dev);
    ops::gather_rows(out.hidden, device_rows(keep), fed);
    out = tp ? tp->draft_forward(next, keep, false, j % L, [&] { return runner->draft_forward(next, fed, j % L); })
             : runner->draft_forward(next, fed, j % L);
    drafting = std::move(still);
  }
}

void Engine::Impl::propose_drafts() {
  const int32_t k = cfg.num_speculative_tokens;
  for (Request* r : scheduler->running()) {
    const SamplingParams& p = r->params;
    // In decode: one token to compute, not of the prompt (its first token comes from the prefill).
    if (r->num_draft_tokens > 0 || r->num_computed_tokens + 1 != r->num_tokens() ||
        r->num_computed_tokens < r->num_prompt_tokens || p.logprobs >= 0 || p.return_generation_logits ||
        r->num_output_tokens() < p.min_tokens || r->grammar)  // (a guided row needs its mask step by step)
      continue;
    const int32_t room = draft_room(*r, cfg);
    if (room <= 0) continue;
    std::vector<int32_t> drafts;
    if (!mtp) drafts = propose_ngram(r->tokens, cfg.prompt_lookup_min, cfg.prompt_lookup_max, std::min(k, room));
    else if (r->mtp_drafts_at == r->num_tokens())
      drafts.assign(r->mtp_drafts.begin(), r->mtp_drafts.begin() + std::min<size_t>(size_t(std::min(k, room)), r->mtp_drafts.size()));
    if (drafts.empty()) continue;
    if (caches->states() && !caches->manager().take_scratch_slot(*r)) continue;
    r->tokens.insert(r->tokens.end(), drafts.begin(), drafts.end());
    r->num_draft_tokens = int32_t(drafts.size());
    r->sample_rows = r->num_draft_tokens + 1;
    if (mtp && !r->mtp_draft_q.empty())  // probabilistic drafts: the distributions they came from
      r->draft_q.assign(r->mtp_draft_q.begin(), r->mtp_draft_q.begin() + ptrdiff_t(drafts.size()));
  }
}

// REVOLTA_FAULT_INJECT=accept-drafts[:R]: the drafts kept and the row token after them, as the
// fault says (tests of the verifier, benchmarks at a stated acceptance); else as verified.
int32_t Engine::Impl::force_acceptance(const Request& r, const int32_t* draft, int32_t k, int32_t a,
                                       std::vector<int32_t>& emitted) {
  if (fault.accept_rate < 0) {  // a wrong rule: every sampled point-mass draft kept
    if (plain_greedy(&r) || !r.draft_q.empty()) return a;
    std::copy(draft, draft + k, emitted.begin());
    return k;
  }
  a = fault.forced_accepts(k);  // drafts kept up to a, then the row's token
  if (size_t(a) >= emitted.size()) emitted.resize(size_t(a) + 1, 0);
  std::copy(draft, draft + a, emitted.begin());
  if (a < k && emitted[size_t(a)] == draft[a]) emitted[size_t(a)] = (draft[a] + 1) % model_cfg.vocab_size;  // the step ends at row a
  return a;
}

// The drafter's sampling row for a request's probabilistic drafts: its temperature, top-k, top-p
// and min-p, no penalties (the verifier compares the target against exactly this distribution).
ops::SampleRow Engine::Impl::draft_row(const SamplingParams& p) {
  ops::SampleRow row;
  row.temperature = p.temperature;
  row.top_k = p.top_k;
  row.top_p = p.top_p;
  row.min_p = p.min_p;
  return row;
}

// Probabilistic drafts: the target's rows against the distributions the drafts were drawn from,
// on a host copy (spec/sampled_drafts.h).
std::vector<int32_t> Engine::Impl::verify_sampled_drafts(Request& r, const Tensor& logits, int32_t first_row) {
  const int32_t k = r.num_draft_tokens, V = int32_t(logits.size(1));
  Tensor ids = Tensor::empty({k + 1}, DType::kI32);
  for (int32_t j = 0; j <= k; ++j) ids.ptr<int32_t>()[j] = first_row + j;
  Tensor rows = Tensor::uninitialized({k + 1, V}, DType::kF32, logits.device());
  ops::gather_rows(logits, ids.to(logits.device()), rows);
  const Tensor host = rows.to(Device::kCPU);
  const SamplingContext c{&r.params, &r.tokens, r.num_prompt_tokens, &model_cfg.eos_token_ids, &r.rng};
  const size_t before_drafts = r.tokens.size() - size_t(k);
  const bool keep_all = fault.kind == FaultInjection::Kind::kAcceptDrafts && fault.accept_rate < 0;  // a wrong rule
  std::vector<int32_t> emitted;
  for (int32_t j = 0; j <= k; ++j) {
    std::vector<ops::SampleAdjust> adjust;
    const ops::SampleRow row = sample_row(c, before_drafts + size_t(j), V, adjust);
    const std::vector<float> p = ops::cpu::sample_weights(host.ptr<float>() + int64_t(j) * V, V, row, adjust.data());
    if (j == k) {  // every draft kept: the last row gives one more token
      emitted.push_back(ops::cpu::draw_index_order(p, r.rng.uniform()));
      break;
    }
    const int32_t draft = r.tokens[before_drafts + size_t(j)];
    const double u_accept = r.rng.uniform(), u_residual = r.rng.uniform();
    const DraftVerdict v = keep_all ? DraftVerdict{true, draft} : verify_sampled_draft(p, r.draft_q[size_t(j)], draft, u_accept, u_residual);
    emitted.push_back(v.token);
    if (!v.accepted) break;
  }
  return emitted;
}

void Engine::Impl::finish_speculative_step(const std::vector<ScheduledRequest>& scheduled, StepLogits& result) {
  const size_t S = result.samplers.size();
  std::vector<int32_t> first(S + 1, 0);
  for (size_t i = 0; i < S; ++i) first[i + 1] = first[i] + result.rows_per_sampler[i];
  const Device dev = result.logits.device();
  // The verdicts of plain-greedy drafted requests: every row's argmax, on the device, in one op.
  bool greedy_drafts = false;
  for (size_t i = 0; i < S; ++i) greedy_drafts |= result.rows_per_sampler[i] > 1 && plain_greedy(result.samplers[i]);
  Tensor host_ids;
  const int32_t* argmax = nullptr;
  if (greedy_drafts) {
    Tensor ids = Tensor::uninitialized({int64_t(first[S])}, DType::kI32, dev);
    ops::argmax(result.logits, ids);
    host_ids = ids.to(Device::kCPU);
    argmax = host_ids.ptr<int32_t>();
  }
  // Every other row is sampled in one pass on the model's device: a request without drafts its
  // one row as in any step, a drafted one all its k + 1 rows, row j with the drafts before it as
  // history (so penalties and masks see them). A point-mass draft kept with probability p(draft),
  // else replaced by a draw from p without it, is exactly a draw x from p kept when x == draft:
  // so row j's draw verifies draft j, and the first draw that differs ends the step.
  std::vector<int32_t> sample_ids;
  std::vector<SamplingContext> contexts;
  std::vector<size_t> first_sample(S, 0);
  std::unordered_map<const Request*, size_t> sampler_of;
  for (size_t i = 0; i < S; ++i) {
    Request* r = result.samplers[i];
    sampler_of[r] = i;
    first_sample[i] = sample_ids.size();
    const int32_t rows = result.rows_per_sampler[i];
    if (rows > 1 && (plain_greedy(r) || !r->draft_q.empty())) continue;
    const size_t before_drafts = r->tokens.size() - size_t(rows - 1);
    for (int32_t j = 0; j < rows; ++j) {
      sample_ids.push_back(first[i] + j);
      contexts.push_back({&r->params, &r->tokens, r->num_prompt_tokens, &model_cfg.eos_token_ids, &r->rng,
                          before_drafts + size_t(j), r->grammar.get()});
    }
  }
  std::vector<TokenOutput> sampled;
  if (!sample_ids.empty()) {
    Tensor rows = Tensor::empty({int64_t(sample_ids.size())}, DType::kI32);
    std::copy(sample_ids.begin(), sample_ids.end(), rows.ptr<int32_t>());
    Tensor picked = Tensor::uninitialized({int64_t(sample_ids.size()), result.logits.size(1)}, DType::kF32, dev);
    ops::gather_rows(result.logits, rows.to(dev), picked);
    sampled = sample_rows(picked, contexts);
  }
  std::vector<StateReplay> replays;
  std::vector<StateAction> restores;
  int32_t kept = 0;  // the step's kept verify rows before this request's (ModelRunner::replay_states)
  for (const ScheduledRequest& s : scheduled) {
    Request& r = *s.request;
    const auto it = sampler_of.find(&r);
    if (it == sampler_of.end()) {  // a prefill chunk: nothing sampled
      commit_one(r, s.num_new_tokens);
      continue;
    }
    const size_t i = it->second;
    if (result.rows_per_sampler[i] == 1) {
      commit_one(r, s.num_new_tokens);
      accept(r, std::move(sampled[first_sample[i]]));
      continue;
    }
    const int32_t k = r.num_draft_tokens;
    // The rows' tokens: from q-drawn drafts' verification, else the argmax or the draw of each row.
    const int32_t* draft = r.tokens.data() + (r.tokens.size() - size_t(k));
    std::vector<int32_t> emitted;
    if (!r.draft_q.empty()) emitted = verify_sampled_drafts(r, result.logits, first[i]);
    else
      for (int32_t j = 0; j <= k; ++j)
        emitted.push_back(plain_greedy(&r) ? argmax[first[i] + j] : sampled[first_sample[i] + size_t(j)].token);
    int32_t a = 0;
    while (a < k && emitted[size_t(a)] == draft[a]) ++a;
    if (fault.kind == FaultInjection::Kind::kAcceptDrafts) a = force_acceptance(r, draft, k, a, emitted);
    ++live.spec_num_drafts;
    live.spec_num_draft_tokens += k;
    live.spec_num_accepted_tokens += a;
    for (int32_t j = 0; j < a; ++j) ++live.spec_accepted_per_position[size_t(j)];
    // Commit the input token and the accepted drafts (their K/V are right), then hand out the
    // tokens through accept(), which checks stops and lengths one by one.
    r.tokens.resize(r.tokens.size() - size_t(k - a));
    r.num_draft_tokens = 0;
    r.sample_rows = 1;
    r.draft_q.clear();
    if (a < k && caches->states()) {
      // The recurrent state ran through the rejected drafts too: back to the state before the
      // step, then through the input token and the accepted drafts again (their recurrences only,
      // from the inputs the forward kept).
      restores.push_back({r.scratch_slot, r.state_slot});
      replays.push_back({r.state_slot, kept, s.num_new_tokens - (k - a)});
    }
    kept += s.num_new_tokens;
    commit_one(r, s.num_new_tokens - (k - a));
    caches->manager().trim(r);
    r.tokens.resize(r.tokens.size() - size_t(a));
    for (int32_t j = 0; j <= a; ++j) {
      TokenOutput tok;
      tok.token = emitted[size_t(j)];
      if (accept(r, std::move(tok))) break;  // finished (a stop token, or its length)
    }
  }
  // A finished request's slots are free but unused until the next schedule: rolling them too is harmless.
  if (!restores.empty()) {
    auto roll_back = [&] {
      caches->states()->apply(restores);
      runner->replay_states(replays);
    };
    if (tp) tp->roll_back(restores, replays, roll_back);
    else roll_back();
  }
}

}  // namespace revolta
