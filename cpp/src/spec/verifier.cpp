#include "spec/verifier.h"

#include "ops/ops.h"
#include "sample/sampler.h"
#include "spec/sampled_drafts.h"

namespace revolta {

namespace {

Tensor gather(const Tensor& logits, const std::vector<int32_t>& rows) {
  Tensor ids = Tensor::empty({int64_t(rows.size())}, DType::kI32);
  std::copy(rows.begin(), rows.end(), ids.ptr<int32_t>());
  Tensor out = Tensor::uninitialized({int64_t(rows.size()), logits.size(1)}, DType::kF32, logits.device());
  ops::gather_rows(logits, ids.to(logits.device()), out);
  return out;
}

TokenOutput token_of(int32_t t) {
  TokenOutput o;
  o.token = t;
  return o;
}

}  // namespace

std::vector<Verdict> Verifier::verify(const StepLogits& step,
                                      const std::unordered_map<uint64_t, std::vector<std::vector<float>>>& q_of) {
  const size_t S = step.samplers.size();
  std::vector<int32_t> first(S + 1, 0);
  for (size_t i = 0; i < S; ++i) first[i + 1] = first[i] + step.rows_per_sampler[i];
  auto drawn_q = [&](const Request* r) { return q_of.find(r->id); };
  // Plain-greedy drafted requests: every row's argmax, on the device, in one op.
  bool greedy_drafts = false;
  for (size_t i = 0; i < S; ++i) greedy_drafts |= step.rows_per_sampler[i] > 1 && plain_greedy(step.samplers[i]);
  Tensor host_ids;
  if (greedy_drafts) {
    Tensor ids = Tensor::uninitialized({int64_t(first[S])}, DType::kI32, step.logits.device());
    ops::argmax(step.logits, ids);
    host_ids = ids.to(Device::kCPU);
  }
  // Every other row in one sampling pass: an undrafted request its one row, a drafted one all its
  // k + 1 rows, row j with the drafts before it as history (so penalties and masks see them).
  std::vector<int32_t> sample_ids;
  std::vector<SamplingContext> contexts;
  std::vector<size_t> first_sample(S, 0);
  for (size_t i = 0; i < S; ++i) {
    Request* r = step.samplers[i];
    first_sample[i] = sample_ids.size();
    const int32_t rows = step.rows_per_sampler[i];
    if (rows > 1 && (plain_greedy(r) || drawn_q(r) != q_of.end())) continue;
    const size_t before_drafts = r->tokens.size() - size_t(rows - 1);
    for (int32_t j = 0; j < rows; ++j) {
      sample_ids.push_back(first[i] + j);
      contexts.push_back({&r->params, &r->tokens, r->num_prompt_tokens, &eos_, &r->rng, before_drafts + size_t(j), r->grammar.get()});
    }
  }
  std::vector<TokenOutput> sampled;
  if (!sample_ids.empty()) sampled = sample_rows(gather(step.logits, sample_ids), contexts);

  std::vector<Verdict> verdicts(S);
  for (size_t i = 0; i < S; ++i) {
    Request& r = *step.samplers[i];
    Verdict& v = verdicts[i];
    const int32_t rows = step.rows_per_sampler[i];
    if (rows == 1) {
      v.tokens.push_back(std::move(sampled[first_sample[i]]));
      continue;
    }
    const int32_t k = rows - 1;
    const int32_t* draft = r.tokens.data() + (r.tokens.size() - size_t(k));
    if (const auto q = drawn_q(&r); q != q_of.end()) {
      v = verify_drawn_drafts(r, step.logits, first[i], q->second);
    } else {
      const bool greedy = plain_greedy(&r);
      for (int32_t j = 0; j <= k; ++j)
        v.tokens.push_back(greedy ? token_of(host_ids.ptr<int32_t>()[first[i] + j]) : std::move(sampled[first_sample[i] + size_t(j)]));
      while (v.accepted < k && v.tokens[size_t(v.accepted)].token == draft[v.accepted]) ++v.accepted;
      if (keep_every_sampled_ && !greedy) {
        for (int32_t j = 0; j < k; ++j) v.tokens[size_t(j)] = token_of(draft[j]);
        v.accepted = k;
      }
    }
    v.drafts = k;
  }
  return verdicts;
}

// Drafts drawn from q: the target's rows against q on a host copy, one row after another.
Verdict Verifier::verify_drawn_drafts(Request& r, const Tensor& logits, int32_t first_row, const std::vector<std::vector<float>>& q) {
  const int32_t k = int32_t(q.size()), V = int32_t(logits.size(1));
  std::vector<int32_t> ids(size_t(k) + 1);
  for (int32_t j = 0; j <= k; ++j) ids[size_t(j)] = first_row + j;
  const Tensor host = gather(logits, ids).to(Device::kCPU);
  const SamplingContext c{&r.params, &r.tokens, r.num_prompt_tokens, &eos_, &r.rng};
  const size_t before_drafts = r.tokens.size() - size_t(k);
  Verdict v;
  for (int32_t j = 0; j <= k; ++j) {
    std::vector<ops::SampleAdjust> adjust;
    const ops::SampleRow row = sample_row(c, before_drafts + size_t(j), V, adjust);
    const std::vector<float> p = ops::sample_weights(host.ptr<float>() + int64_t(j) * V, V, row, adjust.data());
    if (j == k) {  // every draft kept: the last row gives one more token
      v.tokens.push_back(token_of(ops::draw_index_order(p, r.rng.uniform())));
      break;
    }
    const int32_t draft = r.tokens[before_drafts + size_t(j)];
    const double u_accept = r.rng.uniform(), u_residual = r.rng.uniform();
    const DraftVerdict d = keep_every_sampled_ ? DraftVerdict{true, draft} : verify_sampled_draft(p, q[size_t(j)], draft, u_accept, u_residual);
    v.tokens.push_back(token_of(d.token));
    if (!d.accepted) break;
    ++v.accepted;
  }
  return v;
}

}  // namespace revolta
