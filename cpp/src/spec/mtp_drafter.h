// Drafts from the checkpoint's multi-token-prediction layers, in vLLM's order: after each forward
// the MTP layer runs over every position the step computed whose next token is now known, fed
// that token and the target's hidden state there, which writes its K/V and, at a request's last
// position, gives its first draft; further drafts come from the MTP layer fed its own output
// hidden state and the previous draft. The drafts wait here for the request's next step.
#pragma once

#include <functional>
#include <unordered_map>

#include "runtime/model_runner.h"
#include "spec/drafter.h"

namespace revolta {

struct MtpDrafterOptions {
  int32_t num_layers = 1;  // the checkpoint's MTP layers, used in turn
  int32_t num_speculative_tokens = 1;
  int32_t max_model_len = 0;
  int32_t vocab_size = 0;
  // draft_sample_method probabilistic: a sampled request's drafts are drawn from the MTP layer's
  // distribution under its temperature, top-k, top-p and min-p (kept for the verifier).
  bool probabilistic = false;
};

// The MTP layer `layer` over spans, fed hidden rows `fed`; `rows` names them among the rows of
// the step's hidden states (first) or of the previous draft pass, for ranks that gather their own.
using MtpForward = std::function<ForwardOutput(const std::vector<DraftSpan>& spans, const Tensor& fed,
                                               const std::vector<int32_t>& rows, bool first, int32_t layer)>;
// Room for the request's KV up to `n` more tokens than it has computed (false: no free block).
using ReserveSlots = std::function<bool(Request& r, int32_t n)>;

class MtpDrafter final : public Drafter {
 public:
  MtpDrafter(const MtpDrafterOptions& opts, MtpForward forward, ReserveSlots reserve)
      : opts_(opts), forward_(std::move(forward)), reserve_(std::move(reserve)) {}
  Draft propose(const Request& r, int32_t max_tokens) override;
  bool reads_hidden() const override { return true; }
  void after_step(const std::vector<Request*>& running, const StepRowMap& rows, const Tensor& hidden) override;

 private:
  struct Made {
    Draft draft;
    int32_t at = -1;  // made after the step that ended with num_tokens() == at
  };
  MtpDrafterOptions opts_;
  MtpForward forward_;
  ReserveSlots reserve_;
  std::unordered_map<uint64_t, Made> made_;  // by request id; only running requests are kept
};

}  // namespace revolta
