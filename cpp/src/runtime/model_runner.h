// Turns a scheduler step into batch metadata (token ids, positions, cache slots, block tables),
// runs the model forward and returns the logits rows of the requests that sample this step.
#pragma once

#include <memory>
#include <vector>

#include "cache/kv_cache.h"
#include "model/model.h"
#include "sched/scheduler.h"

namespace revolta {

struct StepLogits {
  Tensor logits;                      // [samplers.size(), vocab]
  std::vector<Request*> samplers;     // requests that reach their last token this step
};

class ModelRunner {
 public:
  ModelRunner(CausalLM& model, KvCache& cache, StateCache* states)
      : model_(model), cache_(cache), states_(states) {}
  StepLogits execute(const SchedulerOutput& step);

 private:
  CausalLM& model_;
  KvCache& cache_;
  StateCache* states_;
};

}  // namespace revolta
