#include "model/decoder_common.h"


#include "core/error.h"
#include "ops/ops.h"

namespace revolta {

int64_t EmbeddingAndHead::nbytes() const {
  return int64_t(embed.nbytes()) + (lm_head.data() == embed.data() ? 0 : int64_t(lm_head.nbytes()));
}

EmbeddingAndHead load_embedding_and_head(const WeightLoader& w, const std::string& prefix, const ModelConfig& c,
                                         DType dt) {
  EmbeddingAndHead e;
  const int64_t V = c.vocab_size, H = c.hidden_size;
  Communicator* tp = w.tensor_parallel();
  Slice rows;
  if (tp && tp->world_size() > 1 && V % tp->world_size() == 0) {
    const int64_t part = V / tp->world_size();
    e.tp = tp, e.first_id = tp->rank() * part;
    rows = Slice::rows(e.first_id, e.first_id + part);
  }
  auto load = [&](const std::string& name) { return w.get_sliced({name}, {{V, H}}, {rows}, dt, false); };
  e.embed = load(prefix + "embed_tokens.weight");
  if (c.tie_word_embeddings || !w.has("lm_head.weight")) {
    RV_CHECK(c.tie_word_embeddings, "model ", w.dir(), ": missing tensor 'lm_head.weight'");
    e.lm_head = e.embed;
  } else {
    e.lm_head = load("lm_head.weight");
  }
  return e;
}

void embed_tokens(const EmbeddingAndHead& head, const Tensor& ids, Tensor& out, const ops::NormInto& norm) {
  if (!head.tp) return ops::embedding(ids, head.embed, out, &norm);
  ops::embedding_shard(ids, head.embed, head.first_id, out);
  head.tp->all_reduce_sum(out);
  ops::rms_norm(out, *norm.weight, norm.eps, *norm.normed);
}

ForwardOutput CausalLM::mtp_forward(const ForwardBatch&, const Tensor&, int32_t, ModelCaches&) {
  RV_CHECK(false, config().architecture, " has no multi-token-prediction layers");
  return {};
}

void CausalLM::replay_states(const Tensor&, const Tensor&, const Tensor&, ModelCaches&) {
  RV_CHECK(false, config().architecture, " has no recurrent layers to replay");
}

void DecoderBase::place(Device device) {
  RV_CHECK(device == device_, cfg_.architecture, ": weights are loaded onto their device directly");
}

ForwardOutput final_outputs(const Tensor& x, const ForwardBatch& batch, const Tensor& lm_head) {
  const std::vector<int32_t>& wanted = batch.logits_rows;
  const int64_t H = x.size(1), R = int64_t(wanted.size());
  bool every_row = R == x.size(0);
  for (int64_t r = 0; every_row && r < R; ++r) every_row = wanted[size_t(r)] == r;
  Tensor picked = every_row ? x : Tensor::uninitialized({R, H}, DType::kF32, x.device());
  if (!every_row) ops::gather_rows(x, batch.logits_row_ids, picked);
  ForwardOutput out;
  out.logits = Tensor::uninitialized({R, lm_head.size(0)}, DType::kF32, x.device());
  ops::linear(picked, lm_head, nullptr, out.logits);
  bool every_hidden = int64_t(batch.hidden_rows.size()) == x.size(0);
  for (size_t r = 0; every_hidden && r < batch.hidden_rows.size(); ++r) every_hidden = batch.hidden_rows[r] == int32_t(r);
  if (every_hidden) {
    out.hidden = x;
  } else if (!batch.hidden_rows.empty()) {
    out.hidden = Tensor::uninitialized({int64_t(batch.hidden_rows.size()), H}, DType::kF32, x.device());
    ops::gather_rows(x, batch.hidden_row_ids, out.hidden);
  }
  return out;
}

ForwardOutput final_outputs(const Tensor& x, const ForwardBatch& batch, const EmbeddingAndHead& head) {
  if (!head.tp) return final_outputs(x, batch, head.lm_head);
  ForwardOutput local = final_outputs(x, batch, head.lm_head);  // [R, the rank's vocabulary]
  const int64_t W = head.tp->world_size(), R = local.logits.size(0), part = local.logits.size(1);
  Tensor gathered = Tensor::uninitialized({W * R, part}, DType::kF32, x.device());
  head.tp->all_gather(local.logits, gathered);
  // gathered is [rank, row, part]; the logits are [row, rank, part]
  Tensor order = Tensor::empty({W * R}, DType::kI32);
  for (int64_t r = 0; r < R; ++r)
    for (int64_t w = 0; w < W; ++w) order.ptr<int32_t>()[r * W + w] = int32_t(w * R + r);
  ForwardOutput out;
  out.logits = Tensor::uninitialized({R, W * part}, DType::kF32, x.device());
  Tensor rows = out.logits.view({R * W, part});
  ops::gather_rows(gathered, order.to(x.device()), rows);
  out.hidden = local.hidden;
  return out;
}

}  // namespace revolta
