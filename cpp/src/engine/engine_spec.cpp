// Speculative decoding in the engine step. Before a step, each running plain-greedy request in
// decode gets up to num_speculative_tokens drafts appended to its tokens (the scheduling rule then
// computes them with its last token, and the runner samples all of them: Request::sample_rows).
// After the forward, row j's argmax is the target's token after draft j - 1: drafts are accepted
// while they match it, the first mismatch's row gives the next token (so a step yields 1 + the
// accepted drafts, exactly the tokens plain greedy decoding would), rejected drafts leave tokens
// and KV blocks, and the step is committed with the accepted length only, so no block holding a
// rejected draft is ever hashed for prefix caching.
#include <algorithm>
#include <unordered_map>

#include "core/device_runtime.h"
#include "core/error.h"
#include "engine/engine_impl.h"
#include "ops/ops.h"
#include "sample/sampler.h"
#include "spec/ngram_drafter.h"

namespace revolta {

void Engine::Impl::propose_drafts() {
  const int32_t k = cfg.num_speculative_tokens;
  for (Request* r : scheduler->running()) {
    if (r->num_draft_tokens > 0 || r->num_computed_tokens + 1 != r->num_tokens() || !plain_greedy(r)) continue;
    // A step yields at most drafts + 1 tokens: stay within max_tokens and max_model_len.
    const int32_t room = std::min(r->params.max_tokens - r->num_output_tokens(), cfg.max_model_len - r->num_tokens()) - 1;
    if (room <= 0) continue;
    std::vector<int32_t> drafts = propose_ngram(r->tokens, cfg.prompt_lookup_min, cfg.prompt_lookup_max, std::min(k, room));
    if (drafts.empty()) continue;
    r->tokens.insert(r->tokens.end(), drafts.begin(), drafts.end());
    r->num_draft_tokens = int32_t(drafts.size());
    r->sample_rows = r->num_draft_tokens + 1;
  }
}

void Engine::Impl::finish_speculative_step(const std::vector<ScheduledRequest>& scheduled, StepLogits& result) {
  const size_t S = result.samplers.size();
  std::vector<int32_t> first(S + 1, 0);
  for (size_t i = 0; i < S; ++i) first[i + 1] = first[i] + result.rows_per_sampler[i];
  const Device dev = result.logits.device();
  // Every row's argmax: the verdicts on the drafts (their requests are plain greedy).
  Tensor ids = Tensor::uninitialized({int64_t(first[S])}, DType::kI32, dev);
  ops::argmax(result.logits, ids);
  const Tensor host_ids = ids.to(Device::kCPU);
  const int32_t* argmax = host_ids.ptr<int32_t>();
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
    const int32_t* verdict = argmax + first[i];
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
    commit_one(r, s.num_new_tokens - (k - a));
    caches->manager().trim(r);
    r.tokens.resize(r.tokens.size() - size_t(a));
    for (int32_t j = 0; j <= a; ++j) {
      TokenOutput tok;
      tok.token = verdict[j];
      if (accept(r, std::move(tok))) break;  // finished (a stop token, or its length)
    }
  }
}

}  // namespace revolta
