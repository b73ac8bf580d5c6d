#include "model/decoder_common.h"

#include <cmath>

#include "core/error.h"
#include "ops/ops.h"

namespace revolta {

int64_t EmbeddingAndHead::nbytes() const {
  return int64_t(embed.nbytes()) + (lm_head.data() == embed.data() ? 0 : int64_t(lm_head.nbytes()));
}

Share share_of(int64_t whole, int64_t count, const Communicator* tp) {
  // whole * rank / world: count units each, or with fewer units than ranks the unit of a rank's group
  return tp ? Share{whole * tp->rank() / tp->world_size(), count} : Share{0, whole};
}

ModelConfig rank_config(const ModelConfig& c, int world, bool expert_parallel) {
  ModelConfig r = c;
  if (world == 1) return r;
  auto need = [&](bool ok, int64_t n, const char* what) {
    RV_CHECK_ARG(ok, "tensor_parallel_size ", world, ": the model's ", n, " ", what, " do not split over ", world,
                 " ranks");
  };
  bool dense = c.num_experts == 0;
  for (int32_t l = 0; l < c.num_layers; ++l) dense = dense || !c.is_moe_layer(l);
  need(c.num_heads % world == 0, c.num_heads, "attention heads");
  need(c.num_kv_heads % world == 0 || world % c.num_kv_heads == 0, c.num_kv_heads, "KV heads (nor divide them)");
  r.num_heads = c.num_heads / world;
  r.num_kv_heads = c.num_kv_heads >= world ? c.num_kv_heads / world : 1;
  if (dense) need(c.intermediate_size % world == 0, c.intermediate_size, "MLP intermediates");
  r.intermediate_size = c.intermediate_size / world;
  if (c.num_linear_layers() > 0) {
    need(c.linear_num_key_heads % world == 0, c.linear_num_key_heads, "DeltaNet key heads");
    r.linear_num_key_heads = c.linear_num_key_heads / world;
    r.linear_num_value_heads = c.linear_num_value_heads / world;
  }
  if (c.num_experts > 0) {
    if (expert_parallel) {  // whole experts, E / world a rank
      need(c.num_experts % world == 0, c.num_experts, "experts");
    } else {
      need(c.moe_intermediate_size % world == 0, c.moe_intermediate_size, "expert intermediates");
      r.moe_intermediate_size = c.moe_intermediate_size / world;
    }
    need(c.shared_expert_intermediate_size % world == 0, c.shared_expert_intermediate_size, "shared-expert intermediates");
    r.shared_expert_intermediate_size = c.shared_expert_intermediate_size / world;
  }
  return r;
}

EmbeddingAndHead load_embedding_and_head(const WeightLoader& w, const std::string& prefix, const ModelConfig& c,
                                         DType dt) {
  EmbeddingAndHead e;
  const int64_t V = c.vocab_size, H = c.hidden_size;
  Communicator* tp = w.tensor_parallel();
  Slice rows;
  if (tp && V % tp->world_size() == 0) {
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

void place_media(const ForwardBatch& b, Tensor& residual, const ops::NormInto& norm) {
  if (!b.media_rows.defined()) return;
  const int64_t H = residual.size(1), M = b.media_rows.numel();
  if (b.media_embeds.size(1) == H) {
    ops::scatter_rows(residual, b.media_rows, b.media_embeds);
  } else {
    Tensor main = Tensor::uninitialized({M, H}, DType::kF32, residual.device());
    ops::copy_columns(b.media_embeds, 0, main);
    ops::scatter_rows(residual, b.media_rows, main);
  }
  ops::rms_norm(residual, *norm.weight, norm.eps, *norm.normed);
}

bool add_deepstack(const ForwardBatch& b, int64_t layer, Tensor& residual, const ops::NormInto& norm) {
  if (!b.media_rows.defined()) return false;
  const int64_t H = residual.size(1), M = b.media_rows.numel();
  if (b.media_embeds.size(1) < (layer + 2) * H) return false;
  Tensor features = Tensor::uninitialized({M, H}, DType::kF32, residual.device());
  ops::copy_columns(b.media_embeds, (layer + 1) * H, features);
  Tensor ones = Tensor::empty({M}, DType::kF32);
  std::fill_n(ones.ptr<float>(), M, 1.0f);
  ops::scatter_add_rows(residual, b.media_rows, ones.to(residual.device()), features);
  ops::rms_norm(residual, *norm.weight, norm.eps, *norm.normed);
  return true;
}

Tensor mrope_axes_tensor(const ModelConfig& c, int32_t rotary_dim) {
  const std::vector<int32_t> axes = mrope_axes(c.rope, rotary_dim);
  if (axes.empty()) return {};
  Tensor t = Tensor::empty({int64_t(axes.size())}, DType::kI32);
  std::copy(axes.begin(), axes.end(), t.ptr<int32_t>());
  return t;
}

RopeInputs rope_inputs(const ForwardBatch& b, const ops::RopeTables& rope, const Tensor& axes, const std::string& arch) {
  if (!b.mrope_positions.defined()) return {b.positions, rope};
  RV_CHECK(axes.defined(), arch, ": media positions for a model without mrope_section");
  ops::RopeTables t = rope;
  t.axes = axes;
  return {b.mrope_positions, t};
}

ForwardOutput CausalLM::mtp_forward(const ForwardBatch&, const Tensor&, int32_t, ModelCaches&) {
  RV_CHECK(false, config().architecture, " has no multi-token-prediction layers");
  return {};
}

void CausalLM::replay_states(const Tensor&, const Tensor&, const Tensor&, ModelCaches&) {
  RV_CHECK(false, config().architecture, " has no recurrent layers to replay");
}

void DecoderBase::load_kv_scales(const WeightLoader& w, const std::string& prefix, int32_t layer) {
  if (w.dummy()) return;
  auto scalar = [&](const std::string& name) {
    const Tensor t = w.get(name, w.shape(name), DType::kF32, Device::kCPU);
    RV_CHECK_ARG(t.numel() == 1 && std::isfinite(t.ptr<float>()[0]) && t.ptr<float>()[0] > 0.0f, "model: ", name,
                 " is not one positive KV-cache scale (", t.shape_str(), ")");
    return t.ptr<float>()[0];
  };
  std::pair<float, float> s{0.0f, 0.0f};
  if (w.has(prefix + "k_scale") && w.has(prefix + "v_scale")) s = {scalar(prefix + "k_scale"), scalar(prefix + "v_scale")};
  else if (w.has(prefix + "kv_scale")) s.first = s.second = scalar(prefix + "kv_scale");
  else return;
  if (kv_scales_.size() <= size_t(layer)) kv_scales_.resize(size_t(layer) + 1);
  kv_scales_[size_t(layer)] = s;
}

int32_t set_kv_scales(const std::vector<std::pair<float, float>>& scales, KvCache& cache) {
  if (cache.quant.empty() || cache.k.empty() || cache.k[0].dtype() != DType::kF8E4M3) return 0;
  int32_t missing = 0;
  for (size_t l = 0; l < cache.quant.size(); ++l) {
    const bool have = l < scales.size() && scales[l].first > 0.0f;
    if (have) cache.quant[l].k = scales[l].first, cache.quant[l].v = scales[l].second;
    missing += have ? 0 : 1;
  }
  return missing;
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
  // Gathered as columns ([rank's part, R] each, stacked) so that no index tensor is needed, which
  // a decode graph would have to keep: transposed there and back.
  Tensor columns = Tensor::uninitialized({part, R}, DType::kF32, x.device());
  ops::transpose(local.logits, columns);
  Tensor gathered = Tensor::uninitialized({W * part, R}, DType::kF32, x.device());
  head.tp->all_gather(columns, gathered);
  ForwardOutput out;
  out.logits = Tensor::uninitialized({R, W * part}, DType::kF32, x.device());
  ops::transpose(gathered, out.logits);
  out.hidden = local.hidden;
  return out;
}

}  // namespace revolta
