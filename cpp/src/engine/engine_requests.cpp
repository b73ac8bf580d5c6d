// A request's bookkeeping after a forward: committing computed tokens (blocks registered, state
// snapshots), taking a sampled token (stops and lengths), finishing and staging outputs. The step
// files call these; nothing here calls back into them.
#include <algorithm>

#include "engine/engine_impl.h"

namespace revolta {

void Engine::Impl::commit(const std::vector<ScheduledRequest>& scheduled) {
  for (const auto& s : scheduled) commit_one(*s.request, s.num_new_tokens);
}

void Engine::Impl::commit_one(Request& r, int32_t num_new_tokens) {
  const int32_t before = r.num_computed_tokens;
  r.num_computed_tokens += num_new_tokens;
  live.prompt_tokens_computed += std::max(0, std::min(r.num_computed_tokens, r.num_prompt_tokens) - before);
  const StateAction snapshot = serving->caches->commit(r);
  if (tp && snapshot.to >= 0) rank_snapshots.push_back(snapshot);
}

bool Engine::Impl::accept(Request& r, TokenOutput tok) {
  const int32_t t = tok.token;
  if (r.last_token_on_device) r.tokens.back() = t;  // the placeholder a queued step was fed for
  else r.tokens.push_back(t);
  r.last_token_on_device = false;
  const bool off_grammar = r.grammar && !r.grammar->consume(t);  // (drawn from its mask: not expected)
  r.pending.push_back(std::move(tok));
  ++live.generation_tokens;

  const auto& stops = r.params.stop_token_ids;
  const auto& eos = model_cfg.eos_token_ids;
  if (std::find(stops.begin(), stops.end(), t) != stops.end() ||
      (!r.params.ignore_eos && std::find(eos.begin(), eos.end(), t) != eos.end())) {
    finish(r, FinishReason::kStop, t);
    return true;
  }
  if (off_grammar || r.num_output_tokens() >= r.params.max_tokens || r.num_tokens() >= cfg.max_model_len) {
    finish(r, FinishReason::kLength);
    return true;
  }
  emit(r, false);
  return false;
}

void Engine::Impl::emit(Request& r, bool finished) {
  RequestOutput o;
  o.request_id = r.id;
  o.tokens = std::move(r.pending);
  r.pending.clear();
  o.finished = finished;
  o.finish_reason = r.finish_reason;
  o.stop_token_id = r.stop_token_id;
  o.num_prompt_tokens = r.num_prompt_tokens;
  o.num_cached_tokens = std::max(0, r.num_cached_tokens);
  o.error = r.error;
  if (finished && !r.params.pooling.empty()) o.embedding.assign(r.pooled.begin(), r.pooled.end());
  // Sent once, with the first output, which comes after the prompt's last chunk.
  if (!r.prompt_logprobs.empty() && r.num_computed_tokens >= r.num_prompt_tokens) o.prompt_logprobs = std::move(r.prompt_logprobs);
  staged.emplace_back(std::move(o), r.callback);
}

void Engine::Impl::finish(Request& r, FinishReason reason, int32_t stop_token) {
  r.finish_reason = reason;
  r.stop_token_id = stop_token;
  auto owned = serving->scheduler->remove(r.id);  // frees its blocks
  ++live.requests_finished;
  emit(*owned, true);
}

}  // namespace revolta
