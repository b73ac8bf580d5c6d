// Engine-side request state. num_computed_tokens catches up to num_tokens(); that is the whole
// scheduling rule (prefill, chunked prefill, prefix hits and recompute after preemption alike).
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <vector>

#include "revolta/engine.h"
#include "sample/grammar.h"
#include "sample/rng.h"
#include "sched/media.h"

namespace revolta {

enum class RequestStatus { kWaiting, kRunning, kFinished };

// Disk reads queued for a request's prefix (KvTiers::prefetch): how many, and how many are left.
struct TierReads {
  int32_t queued = 0;
  std::atomic<int32_t> left{0};
};

struct Request {
  uint64_t id = 0;
  std::unique_ptr<GrammarMatcher> grammar;  // guided decoding: the tokens its grammar allows next
  std::vector<int32_t> tokens;  // prompt followed by the generated tokens
  // Async scheduling: tokens.back() is a placeholder for a token a queued step produces on the
  // device; the step after it reads the token there, and the host fills it in when it arrives.
  bool last_token_on_device = false;
  int32_t num_prompt_tokens = 0;
  SamplingParams params;
  SchedulingTag tag;
  OutputCallback callback;
  RequestStatus status = RequestStatus::kWaiting;

  int32_t num_computed_tokens = 0;  // tokens whose K/V are in the cache
  // Logits rows sampled in the step that computes its last token: 1, or 1 + its draft tokens
  // when a verifier checks them (the runner's hook for speculative decoding).
  int32_t sample_rows = 1;
  int32_t num_cached_tokens = -1;   // prefix-cache hit of the first schedule (-1: not yet)
  std::vector<int32_t> block_table;
  std::vector<uint64_t> block_hashes;  // hashes of the leading full blocks already registered
  int32_t state_slot = -1;     // recurrent-state slot (hybrid models), owned while scheduled
  bool state_fresh = false;    // the slot must be zeroed before the next forward
  int32_t state_restore = -1;  // snapshot slot to copy into state_slot before the next forward
  int32_t snapshot_slot = -1;  // the snapshot this request last saved (superseded ones are freed)
  int32_t scratch_slot = -1;   // speculative decoding: its state before a verify step, for rollback
  std::shared_ptr<TierReads> tier_reads;  // KV offload: its prefix's entries read from disk ahead of it
  std::vector<TokenOutput> prompt_logprobs;  // collected as prompt chunks run; sent with the first output
  std::vector<double> pooled;  // a pooling request: the sum of its rows' hidden states (mean) or its last row
  // A multimodal prompt: its media spans and rotary positions, and each span's encoder output
  // (f32 [tokens, hidden] on the host) from when it is encoded until the prompt has read it.
  std::shared_ptr<const MediaPrompt> media;
  std::vector<std::shared_ptr<const Tensor>> encoded;

  Rng rng;
  std::vector<TokenOutput> pending;  // produced since the last output was emitted
  FinishReason finish_reason = FinishReason::kNone;
  int32_t stop_token_id = -1;
  std::string error;

  // Draft tokens at the end of `tokens`, proposed for this step and verified by its forward; the
  // scheduling rule counts them (num_tokens), the output does not. (Drafters keep their own state.)
  int32_t num_draft_tokens = 0;

  int32_t num_tokens() const { return int32_t(tokens.size()); }
  // The rotary position of token i (its time axis under multimodal RoPE).
  int32_t rope_position(int32_t i) const { return media ? media->position(i, 0) : i; }
  // Token i as prefix-cache keys see it (media spans keyed by their content).
  int32_t cache_token(int32_t i) const { return media ? media->cache_token(tokens, i) : tokens[size_t(i)]; }
  int32_t num_output_tokens() const { return num_tokens() - num_prompt_tokens - num_draft_tokens; }
  // Takes the drafts back (a step that cannot schedule them whole, preemption, verification).
  void drop_drafts() {
    tokens.resize(tokens.size() - size_t(num_draft_tokens));
    num_draft_tokens = 0;
    sample_rows = 1;
  }
};

// Greedy with nothing that needs the logits or the token history on the host: its token is the
// argmax, so it can be read a step later (async scheduling) or checked against drafts.
inline bool plain_greedy(const Request* r) {
  const SamplingParams& p = r->params;
  return p.temperature == 0.0f && p.guided_kind.empty() && p.logit_bias.empty() && p.logprobs < 0 && !p.return_generation_logits && p.repetition_penalty == 1.0f &&
         p.presence_penalty == 0.0f && p.frequency_penalty == 0.0f && r->num_output_tokens() >= p.min_tokens;
}

}  // namespace revolta
