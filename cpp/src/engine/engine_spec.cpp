// A step with speculative decoding on. Before it, each running request in decode gets up to
// num_speculative_tokens drafts from the Drafter appended to its tokens (the scheduling rule then
// computes them with its last token, and the runner samples all of them: Request::sample_rows).
// After the forward the Verifier (spec/verifier.h) says which drafts the target keeps; rejected
// drafts leave tokens and KV blocks, and the step is committed with the accepted length only, so
// no block holding a rejected draft is ever hashed for prefix caching. A recurrent state that ran
// through rejected drafts is restored to the state before the step and replayed through the kept
// tokens' recurrences only. Then the drafter sees the step (MTP drafts the next step's tokens).
#include <algorithm>
#include <chrono>

#include "engine/engine_impl.h"
#include "spec/mtp_drafter.h"
#include "spec/ngram_drafter.h"

namespace revolta {

namespace {

int64_t micros(std::chrono::steady_clock::duration d) {
  return int64_t(std::chrono::duration_cast<std::chrono::microseconds>(d).count());
}

}  // namespace

void Engine::Impl::make_speculation() {
  const bool wrong_rule = fault.kind == FaultInjection::Kind::kAcceptDrafts && fault.accept_rate < 0;
  verifier = std::make_unique<Verifier>(model_cfg.eos_token_ids, wrong_rule);
  if (!mtp) {
    drafter = std::make_unique<NgramDrafter>(cfg.prompt_lookup_min, cfg.prompt_lookup_max);
    return;
  }
  MtpDrafterOptions o;
  o.num_layers = model->num_mtp_layers();
  o.num_speculative_tokens = cfg.num_speculative_tokens;
  o.max_model_len = cfg.max_model_len;
  o.vocab_size = model_cfg.vocab_size;
  o.probabilistic = cfg.draft_sample_method == "probabilistic";
  // Under tensor parallelism every rank drafts from its own hidden states (the same values).
  MtpForward forward = [this](const std::vector<DraftSpan>& spans, const Tensor& fed, const std::vector<int32_t>& rows,
                              bool first, int32_t layer) {
    auto here = [&] { return serving->runner->draft_forward(spans, fed, layer); };
    return tp ? tp->draft_forward(spans, rows, first, layer, here) : here();
  };
  ReserveSlots reserve = [this](Request& r, int32_t n) { return serving->caches->manager().allocate_slots(r, n); };
  drafter = std::make_unique<MtpDrafter>(o, std::move(forward), std::move(reserve));
}

void Engine::Impl::speculative_step() {
  phase_step = live.num_steps + 1;
  enter("speculative step");
  using Clock = std::chrono::steady_clock;
  const auto t0 = Clock::now();
  propose_drafts();
  const auto t1 = Clock::now();
  SchedulerOutput plan = serving->scheduler->schedule();
  if (plan.empty()) return;
  begin_step(plan.scheduled);
  StepRowMap rows;
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
  drafter->after_step(serving->scheduler->running(), rows, result.hidden);
  live.spec_draft_time_us += micros(t1 - t0) + micros(Clock::now() - t2);
  if (drafted) live.spec_verify_time_us += micros(t2 - t1);
}

void Engine::Impl::propose_drafts() {
  const int32_t k = cfg.num_speculative_tokens;
  drawn_q.clear();
  for (Request* r : serving->scheduler->running()) {
    const SamplingParams& p = r->params;
    // In decode: one token to compute, not of the prompt (its first token comes from the prefill).
    if (r->num_draft_tokens > 0 || r->num_computed_tokens + 1 != r->num_tokens() ||
        r->num_computed_tokens < r->num_prompt_tokens || p.logprobs >= 0 || p.return_generation_logits ||
        r->num_output_tokens() < p.min_tokens || r->grammar)  // (a guided row needs its mask step by step)
      continue;
    const int32_t room = draft_room(*r, cfg.max_model_len);
    if (room <= 0) continue;
    Draft d = drafter->propose(*r, std::min(k, room));
    if (d.tokens.empty()) continue;
    if (serving->caches->states() && !serving->caches->manager().take_scratch_slot(*r)) continue;
    r->tokens.insert(r->tokens.end(), d.tokens.begin(), d.tokens.end());
    r->num_draft_tokens = int32_t(d.tokens.size());
    r->sample_rows = r->num_draft_tokens + 1;
    if (!d.q.empty()) drawn_q[r->id] = std::move(d.q);
  }
}

// REVOLTA_FAULT_INJECT=accept-drafts:R: R drafts kept a verify step on average and the row token
// after them, to benchmark speculation at a stated acceptance where drafts cannot be right.
void Engine::Impl::force_acceptance(const int32_t* draft, Verdict& v) {
  const int32_t k = v.drafts, a = fault.forced_accepts(k);
  if (v.tokens.size() < size_t(a) + 1) v.tokens.resize(size_t(a) + 1);
  for (int32_t j = 0; j < a; ++j) v.tokens[size_t(j)].token = draft[j];
  if (a < k && v.tokens[size_t(a)].token == draft[a]) v.tokens[size_t(a)].token = (draft[a] + 1) % model_cfg.vocab_size;
  v.accepted = a;
}

void Engine::Impl::finish_speculative_step(const std::vector<ScheduledRequest>& scheduled, StepLogits& result) {
  std::vector<Verdict> verdicts = verifier->verify(result, drawn_q);
  drawn_q.clear();
  std::unordered_map<const Request*, size_t> sampler_of;
  for (size_t i = 0; i < result.samplers.size(); ++i) sampler_of[result.samplers[i]] = i;
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
    Verdict& v = verdicts[it->second];
    if (v.drafts == 0) {
      commit_one(r, s.num_new_tokens);
      accept(r, std::move(v.tokens[0]));
      continue;
    }
    const int32_t k = v.drafts;
    if (fault.kind == FaultInjection::Kind::kAcceptDrafts && fault.accept_rate >= 0)
      force_acceptance(r.tokens.data() + (r.tokens.size() - size_t(k)), v);
    const int32_t a = v.accepted;
    ++live.spec_num_drafts;
    live.spec_num_draft_tokens += k;
    live.spec_num_accepted_tokens += a;
    for (int32_t j = 0; j < a; ++j) ++live.spec_accepted_per_position[size_t(j)];
    // Commit the input token and the accepted drafts (their K/V are right), then hand out the
    // tokens through accept(), which checks stops and lengths one by one.
    r.tokens.resize(r.tokens.size() - size_t(k - a));
    r.num_draft_tokens = 0;
    r.sample_rows = 1;
    if (a < k && serving->caches->states()) {
      // The recurrent state ran through the rejected drafts too: back to the state before the
      // step, then through the input token and the accepted drafts again (their recurrences only,
      // from the inputs the forward kept).
      restores.push_back({r.scratch_slot, r.state_slot});
      replays.push_back({r.state_slot, kept, s.num_new_tokens - (k - a)});
    }
    kept += s.num_new_tokens;
    commit_one(r, s.num_new_tokens - (k - a));
    serving->caches->manager().trim(r);
    r.tokens.resize(r.tokens.size() - size_t(a));
    for (int32_t j = 0; j <= a; ++j)
      if (accept(r, std::move(v.tokens[size_t(j)]))) break;  // finished (a stop token, or its length)
  }
  // A finished request's slots are free but unused until the next schedule: rolling them too is harmless.
  if (!restores.empty()) {
    auto roll_back = [&] {
      serving->caches->states()->apply(restores);
      serving->runner->replay_states(replays);
    };
    if (tp) tp->roll_back(restores, replays, roll_back);
    else roll_back();
  }
}

}  // namespace revolta
