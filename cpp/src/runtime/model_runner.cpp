#include "runtime/model_runner.h"

#include <algorithm>

namespace revolta {

StepLogits ModelRunner::execute(const SchedulerOutput& step) {
  const int32_t T = step.num_batched_tokens;
  const int32_t S = int32_t(step.scheduled.size());
  const int32_t bs = cache_.block_size;
  int32_t max_blocks = 1;
  for (const auto& s : step.scheduled)
    max_blocks = std::max(max_blocks, int32_t(s.request->block_table.size()));

  ForwardBatch b;
  b.token_ids = Tensor::empty({T}, DType::kI32);
  b.positions = Tensor::empty({T}, DType::kI32);
  b.slot_mapping = Tensor::empty({T}, DType::kI32);
  std::vector<int32_t> query_start(size_t(S) + 1, 0), seq_lens(static_cast<size_t>(S));
  std::vector<int32_t> tables(size_t(S) * size_t(max_blocks), 0);
  StepLogits out;

  int32_t* ids = b.token_ids.ptr<int32_t>();
  int32_t* pos = b.positions.ptr<int32_t>();
  int32_t* slot = b.slot_mapping.ptr<int32_t>();
  int32_t t = 0;
  for (int32_t s = 0; s < S; ++s) {
    const Request& r = *step.scheduled[size_t(s)].request;
    const int32_t n = step.scheduled[size_t(s)].num_new_tokens;
    const int32_t start = r.num_computed_tokens;
    for (int32_t i = 0; i < n; ++i, ++t) {
      const int32_t p = start + i;
      ids[t] = r.tokens[size_t(p)];
      pos[t] = p;
      slot[t] = r.block_table[size_t(p / bs)] * bs + p % bs;
    }
    query_start[size_t(s) + 1] = t;
    seq_lens[size_t(s)] = start + n;
    std::copy(r.block_table.begin(), r.block_table.end(), tables.begin() + size_t(s) * size_t(max_blocks));
    if (states_) {
      Request& req = *step.scheduled[size_t(s)].request;
      if (req.state_restore >= 0) states_->copy(req.state_restore, req.state_slot);  // prefix-cache hit
      else if (req.state_fresh) states_->zero(req.state_slot);
      req.state_fresh = false;
      req.state_restore = -1;
      b.state_slots.push_back(req.state_slot);
    }
    if (start + n == r.num_tokens()) {
      b.logits_rows.push_back(t - 1);
      out.samplers.push_back(step.scheduled[size_t(s)].request);
    }
  }
  b.attention.query_start = query_start.data();
  b.attention.seq_lens = seq_lens.data();
  b.attention.block_tables = tables.data();
  b.attention.num_seqs = S;
  b.attention.max_blocks_per_seq = max_blocks;
  b.attention.block_size = bs;
  ModelCaches caches{&cache_, states_};
  out.logits = model_.forward(b, caches);
  return out;
}

}  // namespace revolta
