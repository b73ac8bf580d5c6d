// Speculative decoding in the engine step. Before a step, each running request in decode gets up
// to num_speculative_tokens drafts appended to its tokens (the scheduling rule then computes them
// with its last token, and the runner samples all of them: Request::sample_rows). After the
// forward, row j is the target's distribution after draft j - 1. Greedy requests keep drafts while
// they equal the row's argmax; sampled ones keep a draft with the row's probability of it and
// otherwise draw from the rest (spec/rejection.h), so the output follows the target exactly. The
// first rejected row gives the next token (all accepted: the last row gives a bonus token);
// rejected drafts leave tokens and KV blocks, and the step is committed with the accepted length
// only, so no block holding a rejected draft is ever hashed for prefix caching.
#include <algorithm>
#include <unordered_map>

#include "core/device_runtime.h"
#include "core/error.h"
#include "engine/engine_impl.h"
#include "ops/ops.h"
#include "sample/sampler.h"
#include "ops/cpu/cpu_ops.h"
#include "spec/ngram_drafter.h"
#include "spec/rejection.h"

namespace revolta {

void Engine::Impl::propose_drafts() {
  const int32_t k = cfg.num_speculative_tokens;
  for (Request* r : scheduler->running()) {
    const SamplingParams& p = r->params;
    if (r->num_draft_tokens > 0 || r->num_computed_tokens + 1 != r->num_tokens() || p.logprobs >= 0 ||
        p.return_generation_logits || r->num_output_tokens() < p.min_tokens)
      continue;
    // A step yields at most drafts + 1 tokens: stay within max_tokens and max_model_len.
    const int32_t room = std::min(r->params.max_tokens - r->num_output_tokens(), cfg.max_model_len - r->num_tokens()) - 1;
    if (room <= 0) continue;
    if (caches->states() && !caches->manager().take_scratch_slot(*r)) continue;
    std::vector<int32_t> drafts = propose_ngram(r->tokens, cfg.prompt_lookup_min, cfg.prompt_lookup_max, std::min(k, room));
    if (drafts.empty()) continue;
    r->tokens.insert(r->tokens.end(), drafts.begin(), drafts.end());
    r->num_draft_tokens = int32_t(drafts.size());
    r->sample_rows = r->num_draft_tokens + 1;
  }
}

std::vector<int32_t> Engine::Impl::verify_on_host(Request& r, const Tensor& logits, int32_t first_row) {
  const int32_t k = r.num_draft_tokens, V = int32_t(logits.size(1));
  Tensor ids = Tensor::empty({k + 1}, DType::kI32);
  for (int32_t j = 0; j <= k; ++j) ids.ptr<int32_t>()[j] = first_row + j;
  Tensor rows = Tensor::uninitialized({k + 1, V}, DType::kF32, logits.device());
  ops::gather_rows(logits, ids.to(logits.device()), rows);
  const Tensor host = rows.to(Device::kCPU);
  const SamplingContext c{&r.params, &r.tokens, r.num_prompt_tokens, &model_cfg.eos_token_ids, &r.rng};
  const size_t before_drafts = r.tokens.size() - size_t(k);
  const bool sampled = r.params.temperature > 1e-5f;
  std::vector<int32_t> emitted;
  for (int32_t j = 0; j <= k; ++j) {
    std::vector<ops::SampleAdjust> adjust;
    const ops::SampleRow row = sample_row(c, before_drafts + size_t(j), V, adjust);
    const std::vector<float> w = ops::cpu::sample_weights(host.ptr<float>() + int64_t(j) * V, V, row, adjust.data());
    const int32_t draft = j < k ? r.tokens[before_drafts + size_t(j)] : -1;
    if (!sampled) {  // greedy with penalties or masks: the adjusted argmax
      emitted.push_back(int32_t(std::max_element(w.begin(), w.end()) - w.begin()));
    } else if (j == k) {  // every draft kept: the last row gives one more token
      emitted.push_back(ops::cpu::draw_index_order(w, r.rng.uniform()));
    } else {
      const double u_accept = r.rng.uniform(), u_residual = r.rng.uniform();
      const DraftVerdict v = fault.kind == FaultInjection::Kind::kAcceptDrafts ? DraftVerdict{true, draft}
                                                                                : verify_draft(w, draft, u_accept, u_residual);
      emitted.push_back(v.token);
    }
    if (emitted.back() != draft) break;  // the first token that is not its draft ends the step
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
  // Requests without drafts sample their one row as in any step.
  std::vector<int32_t> single_rows;
  std::vector<SamplingContext> contexts;
  std::unordered_map<const Request*, size_t> sampler_of;
  for (size_t i = 0; i < S; ++i) {
    Request* r = result.samplers[i];
    sampler_of[r] = i;
    if (result.rows_per_sampler[i] != 1) continue;
    single_rows.push_back(first[i]);
    contexts.push_back({&r->params, &r->tokens, r->num_prompt_tokens, &model_cfg.eos_token_ids, &r->rng});
  }
  std::vector<TokenOutput> sampled;
  if (!single_rows.empty()) {
    Tensor rows = Tensor::empty({int64_t(single_rows.size())}, DType::kI32);
    std::copy(single_rows.begin(), single_rows.end(), rows.ptr<int32_t>());
    Tensor picked = Tensor::uninitialized({int64_t(single_rows.size()), result.logits.size(1)}, DType::kF32, dev);
    ops::gather_rows(result.logits, rows.to(dev), picked);
    sampled = sample_rows(picked, contexts);
  }
  size_t next_single = 0;
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
      accept(r, std::move(sampled[next_single++]));
      continue;
    }
    const int32_t k = r.num_draft_tokens;
    const std::vector<int32_t> emitted = plain_greedy(&r) ? std::vector<int32_t>(argmax + first[i], argmax + first[i] + k + 1)
                                                        : verify_on_host(r, result.logits, first[i]);
    const int32_t* verdict = emitted.data();
    const int32_t* draft = r.tokens.data() + (r.tokens.size() - size_t(k));
    int32_t a = 0;
    while (a < k && verdict[a] == draft[a]) ++a;
    ++live.spec_num_drafts;
    live.spec_num_draft_tokens += k;
    live.spec_num_accepted_tokens += a;
    for (int32_t j = 0; j < a; ++j) ++live.spec_accepted_per_position[size_t(j)];
    // Commit the input token and the accepted drafts (their K/V are right), then hand out the
    // tokens through accept(), which checks stops and lengths one by one.
    r.tokens.resize(r.tokens.size() - size_t(k - a));
    r.num_draft_tokens = 0;
    r.sample_rows = 1;
    if (a < k && caches->states()) {
      // The recurrent state ran through the rejected drafts too: back to the state before the
      // step, and the input token and accepted drafts are computed again with the next token
      // (their K/V are rewritten with the same values). No extra forward: they join the next step.
      r.state_restore = r.scratch_slot;
      commit_one(r, 0);
    } else {
      commit_one(r, s.num_new_tokens - (k - a));
    }
    caches->manager().trim(r);
    r.tokens.resize(r.tokens.size() - size_t(a));
    for (int32_t j = 0; j <= a; ++j) {
      TokenOutput tok;
      tok.token = emitted[size_t(j)];
      if (accept(r, std::move(tok))) break;  // finished (a stop token, or its length)
    }
  }
}

}  // namespace revolta
