#include "spec/mtp_drafter.h"

#include <algorithm>
#include <unordered_set>

#include "ops/ops.h"

namespace revolta {

namespace {

// The drafter's sampling row for a request's probabilistic drafts: its temperature, top-k, top-p
// and min-p, no penalties (the verifier compares the target against exactly this distribution).
ops::SampleRow draft_row(const SamplingParams& p) {
  ops::SampleRow row;
  row.temperature = p.temperature;
  row.top_k = p.top_k;
  row.top_p = p.top_p;
  row.min_p = p.min_p;
  return row;
}

Tensor row_ids(const std::vector<int32_t>& ids, Device dev) {
  Tensor t = Tensor::empty({int64_t(ids.size())}, DType::kI32);
  std::copy(ids.begin(), ids.end(), t.ptr<int32_t>());
  return t.to(dev);
}

Tensor gather(const Tensor& from, const std::vector<int32_t>& rows) {
  Tensor out = Tensor::uninitialized({int64_t(rows.size()), from.size(1)}, DType::kF32, from.device());
  ops::gather_rows(from, row_ids(rows, from.device()), out);
  return out;
}

}  // namespace

Draft MtpDrafter::propose(const Request& r, int32_t max_tokens) {
  const auto it = made_.find(r.id);
  if (it == made_.end() || it->second.at != r.num_tokens()) return {};
  const Draft& d = it->second.draft;
  const size_t n = std::min(size_t(std::max(0, max_tokens)), d.tokens.size());
  Draft out;
  out.tokens.assign(d.tokens.begin(), d.tokens.begin() + ptrdiff_t(n));
  if (!d.q.empty()) out.q.assign(d.q.begin(), d.q.begin() + ptrdiff_t(n));
  return out;
}

void MtpDrafter::after_step(const std::vector<Request*>& running, const StepRowMap& rows, const Tensor& hidden) {
  // Finished requests have left `running`: their drafts go; those of requests the step skipped stay.
  std::unordered_map<uint64_t, Made> kept;
  std::vector<DraftSpan> spans;
  std::vector<int32_t> hidden_rows;
  std::vector<Request*> drafting;
  for (Request* r : running) {
    const auto it = rows.find(r);
    if (it == rows.end()) {
      if (auto m = made_.find(r->id); m != made_.end()) kept.emplace(r->id, std::move(m->second));
      continue;
    }
    const StepRows& s = it->second;
    // The step's positions whose next token is known: all but a decoding request's last token.
    const int32_t m = std::min(s.count, r->num_tokens() - 1 - s.start);
    if (m <= 0) continue;
    DraftSpan d;
    d.request = r;
    d.start = s.start;
    d.tokens.assign(r->tokens.begin() + s.start + 1, r->tokens.begin() + s.start + 1 + m);
    d.wanted = s.start + m == r->num_tokens() - 1 && draft_room(*r, opts_.max_model_len) > 0 && r->params.pooling.empty();
    if (d.wanted) drafting.push_back(r);
    for (int32_t i = 0; i < m; ++i) hidden_rows.push_back(s.row + i);
    spans.push_back(std::move(d));
  }
  made_ = std::move(kept);
  if (spans.empty()) return;
  ForwardOutput out = forward_(spans, gather(hidden, hidden_rows), hidden_rows, true, 0);
  auto sampled = [&](const Request* r) { return opts_.probabilistic && r->params.temperature > 1e-5f; };
  const int32_t V = opts_.vocab_size;
  for (int32_t j = 1; !drafting.empty(); ++j) {
    Tensor ids = Tensor::uninitialized({int64_t(drafting.size())}, DType::kI32, out.logits.device());
    ops::argmax(out.logits, ids);
    const Tensor host = ids.to(Device::kCPU);
    Tensor host_logits;
    if (std::any_of(drafting.begin(), drafting.end(), sampled)) host_logits = out.logits.to(Device::kCPU);
    std::vector<DraftSpan> next;
    std::vector<int32_t> keep;  // rows of out.hidden that feed the next MTP pass
    std::vector<Request*> still;
    for (size_t i = 0; i < drafting.size(); ++i) {
      Request* r = drafting[i];
      const int32_t N = r->num_tokens();
      Made& made = made_[r->id];
      int32_t token = host.ptr<int32_t>()[i];
      if (sampled(r)) {
        std::vector<float> q = ops::sample_weights(host_logits.ptr<float>() + int64_t(i) * V, V, draft_row(r->params), nullptr);
        token = ops::draw_index_order(q, r->rng.uniform());
        made.draft.q.push_back(std::move(q));
      }
      made.draft.tokens.push_back(token);
      made.at = N;
      // Draft j + 1 comes from position N - 2 + j, fed draft j: its block must exist.
      if (j >= std::min(opts_.num_speculative_tokens, draft_room(*r, opts_.max_model_len)) ||
          !reserve_(*r, N - 1 + j - r->num_computed_tokens))
        continue;
      DraftSpan d;
      d.request = r;
      d.start = N - 2 + j;
      d.tokens = {token};
      d.wanted = true;
      next.push_back(std::move(d));
      keep.push_back(int32_t(i));
      still.push_back(r);
    }
    if (next.empty()) break;
    out = forward_(next, gather(out.hidden, keep), keep, false, j % opts_.num_layers);
    drafting = std::move(still);
  }
}

}  // namespace revolta
