#include "sample/sampler.h"

#include <algorithm>
#include <map>

#include "ops/ops.h"

namespace revolta {

ops::SampleRow sample_row(const SamplingContext& c, size_t history, int32_t V, std::vector<ops::SampleAdjust>& adjust,
                          const std::vector<uint32_t>* allowed) {
  const SamplingParams& p = *c.params;
  const std::vector<int32_t>& toks = *c.tokens;
  ops::SampleRow row;
  row.temperature = p.temperature;
  row.top_p = p.top_p;
  row.top_k = p.top_k;
  row.min_p = p.min_p;
  row.repetition_penalty = p.repetition_penalty;
  row.presence_penalty = p.presence_penalty;
  row.frequency_penalty = p.frequency_penalty;
  row.num_logprobs = p.logprobs;
  row.adjust_begin = int32_t(adjust.size());
  std::map<int32_t, ops::SampleAdjust> by_token;
  if (int32_t(history) - c.num_prompt_tokens < p.min_tokens) {
    if (!p.ignore_eos)
      for (int32_t e : *c.eos_token_ids) by_token[e].masked = 1;
    for (int32_t t : p.stop_token_ids) by_token[t].masked = 1;
  }
  for (const auto& [t, b] : p.logit_bias) by_token[t].bias += b;
  if (p.repetition_penalty != 1.0f)
    for (size_t i = 0; i < history; ++i) by_token[toks[i]].seen = 1;
  if (p.presence_penalty != 0.0f || p.frequency_penalty != 0.0f)
    for (size_t i = size_t(c.num_prompt_tokens); i < history; ++i) ++by_token[toks[i]].out_count;
  if (allowed) {  // every token in order, the grammar's refusals merged with the adjustments above
    auto ok = [&](int32_t t) { return size_t(t) / 32 < allowed->size() && ((*allowed)[size_t(t) / 32] >> (t % 32)) & 1u; };
    auto it = by_token.lower_bound(0);
    for (int32_t t = 0; t < V; ++t) {
      const bool listed = it != by_token.end() && it->first == t;
      if (!listed && ok(t)) continue;
      ops::SampleAdjust a = listed ? it->second : ops::SampleAdjust{};
      a.token = t;
      a.masked |= ok(t) ? 0 : 1;
      adjust.push_back(a);
      if (listed) ++it;
    }
  } else {
    for (auto& [t, a] : by_token)
      if (t >= 0 && t < V) {
        a.token = t;
        adjust.push_back(a);
      }
  }
  row.adjust_end = int32_t(adjust.size());
  return row;
}

std::vector<TokenOutput> sample_rows(const Tensor& device_logits, const std::vector<SamplingContext>& rows) {
  const bool wants_logits = std::any_of(rows.begin(), rows.end(),
                                        [](const SamplingContext& c) { return c.params->return_generation_logits; });
  // Raw rows are returned on the host: sample them there too (the same op, on the CPU).
  const Tensor logits = wants_logits && device_logits.device() != Device::kCPU ? device_logits.to(Device::kCPU) : device_logits;
  const int32_t V = int32_t(logits.shape().back());
  std::vector<ops::SampleRow> op_rows;
  std::vector<ops::SampleAdjust> adjust;
  for (const SamplingContext& c : rows) {
    ops::SampleRow row = sample_row(c, c.history == SamplingContext::kAllTokens ? c.tokens->size() : c.history, V, adjust,
                                    c.grammar && c.grammar->constrains() ? &c.grammar->allowed() : nullptr);
    if (c.params->temperature > 1e-5f) row.uniform = float(c.rng->uniform());
    op_rows.push_back(row);
  }
  std::vector<ops::SampleResult> res;
  ops::sample(logits, op_rows, adjust, res);
  std::vector<TokenOutput> out(res.size());
  for (size_t i = 0; i < res.size(); ++i) {
    const SamplingParams& p = *rows[i].params;
    out[i].token = res[i].token;
    out[i].logprob = res[i].logprob;
    for (int32_t j = 0; j < std::min(p.logprobs, int32_t(ops::kMaxTopLogprobs)); ++j)
      out[i].top_logprobs.push_back({res[i].top_ids[j], res[i].top_logprobs[j]});
    if (p.return_generation_logits) {
      const float* row = logits.ptr<float>() + int64_t(i) * V;
      out[i].logits.assign(row, row + V);
    }
  }
  return out;
}

}  // namespace revolta
