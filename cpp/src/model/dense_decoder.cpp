#include "model/dense_decoder.h"

#include <cmath>
#include <cstring>

#include "core/error.h"
#include "model/decoder_common.h"

namespace revolta {
namespace {

struct DenseLayer {
  Tensor input_norm, post_attn_norm;
  Tensor qkv, qkv_bias, o, o_bias;  // qkv = [q; k; v] stacked along output rows
  Tensor q_norm, k_norm;
  Tensor gate_up, down;             // gate_up = [gate; up]
};

class DenseDecoderLM final : public DecoderBase {
 public:
  DenseDecoderLM(const WeightLoader& w, const ModelConfig& c, DType dt, DenseDecoderOptions opts)
      : DecoderBase(c, dt, w.device()), opts_(opts), tp_(w.tensor_parallel()) {
    const int64_t H = c.hidden_size, I = c.intermediate_size, D = c.head_dim;
    const int64_t QO = int64_t(c.num_heads) * D, KVO = int64_t(c.num_kv_heads) * D;
    const Shard s = shard_of(c);
    cfg_.num_heads = int32_t(s.heads), cfg_.num_kv_heads = int32_t(s.kv_heads), cfg_.intermediate_size = int32_t(s.inter);
    // Column-parallel q / k / v and gate / up (the rank's heads and intermediates), row-parallel o
    // and down (the matching input columns); the whole tensors when there is one rank.
    const Slice q_rows = Slice::rows(s.first_head * D, (s.first_head + s.heads) * D);
    const Slice kv_rows = Slice::rows(s.first_kv_head * D, (s.first_kv_head + s.kv_heads) * D);
    const Slice o_cols = Slice::cols(q_rows.begin, q_rows.end);
    const Slice i_rows = Slice::rows(s.first_inter, s.first_inter + s.inter), i_cols = Slice::cols(i_rows.begin, i_rows.end);
    head_ = load_embedding_and_head(w, "model.", c, dt);
    final_norm_ = w.get("model.norm.weight", {H}, DType::kF32);
    for (int32_t l = 0; l < c.num_layers; ++l) {
      const std::string p = "model.layers." + std::to_string(l) + ".";
      DenseLayer L;
      L.input_norm = w.get(p + "input_layernorm.weight", {H}, DType::kF32);
      L.post_attn_norm = w.get(p + "post_attention_layernorm.weight", {H}, DType::kF32);
      const std::string a = p + "self_attn.";
      L.qkv = w.get_sliced({a + "q_proj.weight", a + "k_proj.weight", a + "v_proj.weight"}, {{QO, H}, {KVO, H}, {KVO, H}},
                           {q_rows, kv_rows, kv_rows}, dt, true);
      if (c.attention_bias) {
        L.qkv_bias = w.get_sliced({a + "q_proj.bias", a + "k_proj.bias", a + "v_proj.bias"}, {{QO}, {KVO}, {KVO}},
                                  {q_rows, kv_rows, kv_rows}, DType::kF32, false);
        L.qkv_bias = L.qkv_bias.view({L.qkv_bias.numel()});
        if (s.rank == 0) L.o_bias = w.get(a + "o_proj.bias", {H}, DType::kF32);  // added once, before the sum
      }
      L.o = w.get_sliced({a + "o_proj.weight"}, {{H, QO}}, {o_cols}, dt, true);
      if (opts.qk_norm) {
        L.q_norm = w.get(a + "q_norm.weight", {D}, DType::kF32);
        L.k_norm = w.get(a + "k_norm.weight", {D}, DType::kF32);
      }
      const std::string m = p + "mlp.";
      L.gate_up = w.get_sliced({m + "gate_proj.weight", m + "up_proj.weight"}, {{I, H}, {I, H}}, {i_rows, i_rows}, dt, true);
      L.down = w.get_sliced({m + "down_proj.weight"}, {{H, I}}, {i_cols}, dt, true);
      layers_.push_back(std::move(L));
    }
    rope_ = build_rope_tables(c.rope, int32_t(D), c.max_positions);
    rope_.cos = rope_.cos.to(device_);
    rope_.sin = rope_.sin.to(device_);
    for (const auto& L : layers_) bytes_ += int64_t(L.qkv.nbytes() + L.o.nbytes() + L.gate_up.nbytes() + L.down.nbytes());
    bytes_ += head_.nbytes();
  }

  ForwardOutput forward(const ForwardBatch& b, ModelCaches& caches) override {
    KvCache& cache = *caches.kv;
    const int64_t T = b.token_ids.numel(), H = cfg_.hidden_size, D = cfg_.head_dim;
    const int64_t NH = cfg_.num_heads, KVH = cfg_.num_kv_heads, I = cfg_.intermediate_size;
    const int64_t QO = NH * D, KVO = KVH * D;
    const float eps = cfg_.rms_norm_eps, scale = 1.0f / std::sqrt(float(D));

    Tensor residual = Tensor::uninitialized({T, H}, DType::kF32, device_);
    Tensor x = Tensor::uninitialized({T, H}, DType::kF32, device_);
    Tensor qkv = Tensor::uninitialized({T, QO + 2 * KVO}, DType::kF32, device_);
    Tensor q = Tensor::uninitialized({T, NH, D}, DType::kF32, device_);
    Tensor attn = Tensor::uninitialized({T, NH, D}, DType::kF32, device_);
    Tensor proj = Tensor::uninitialized({T, H}, DType::kF32, device_);
    Tensor act = Tensor::uninitialized({T, I}, DType::kF32, device_);

    const ops::NormInto first_norm{&layers_[0].input_norm, eps, &x};
    embed_tokens(head_, b.token_ids, residual, first_norm);
    for (size_t l = 0; l < layers_.size(); ++l) {
      const DenseLayer& L = layers_[l];
      ops::linear(x, L.qkv, L.qkv_bias.defined() ? &L.qkv_bias : nullptr, qkv);
      ops::QkNorm norm;
      if (opts_.qk_norm) norm = {&L.q_norm, &L.k_norm, eps};
      ops::qkv_rope_attention(qkv, norm, b.positions, rope_, b.slot_mapping, q, cache.k[l], cache.v[l], b.attention,
                              scale, attn);
      ops::linear(attn.view({T, QO}), L.o, L.o_bias.defined() ? &L.o_bias : nullptr, proj);
      if (tp_) tp_->all_reduce_sum(proj);  // the ranks' heads' shares of the output projection
      ops::add_rms_norm(residual, proj, L.post_attn_norm, eps, x);
      ops::linear_swiglu(x, L.gate_up, act);
      ops::linear(act, L.down, nullptr, proj);
      if (tp_) tp_->all_reduce_sum(proj);
      const Tensor& next_norm = l + 1 < layers_.size() ? layers_[l + 1].input_norm : final_norm_;
      ops::add_rms_norm(residual, proj, next_norm, eps, x);
    }
    return final_outputs(x, b, head_);
  }

 private:
  // A rank's heads, KV heads and MLP intermediates (all of them with one rank). With fewer KV heads
  // than ranks each KV head is replicated on world / KV heads ranks, the ones its query heads are on.
  struct Shard {
    int rank = 0;
    int64_t heads, first_head, kv_heads, first_kv_head, inter, first_inter;
  };
  Shard shard_of(const ModelConfig& c) const {
    const int W = tp_ ? tp_->world_size() : 1, r = tp_ ? tp_->rank() : 0;
    const int64_t NH = c.num_heads, KVH = c.num_kv_heads, I = c.intermediate_size;
    RV_CHECK_ARG(NH % W == 0 && I % W == 0 && (KVH % W == 0 || W % KVH == 0), "tensor_parallel_size ", W,
                 ": the model's ", NH, " attention heads, ", KVH, " KV heads and ", I,
                 " MLP intermediates must split evenly (KV heads may also divide it)");
    Shard s;
    s.rank = r;
    s.heads = NH / W, s.first_head = r * s.heads;
    s.kv_heads = kv_heads_per_rank(c, W), s.first_kv_head = KVH >= W ? r * s.kv_heads : r * KVH / W;
    s.inter = I / W, s.first_inter = r * s.inter;
    return s;
  }

  DenseDecoderOptions opts_;
  Communicator* tp_ = nullptr;
  EmbeddingAndHead head_;
  Tensor final_norm_;
  std::vector<DenseLayer> layers_;
  ops::RopeTables rope_;
};

}  // namespace

int32_t kv_heads_per_rank(const ModelConfig& c, int world) {
  return c.num_kv_heads >= world ? c.num_kv_heads / world : 1;
}

std::unique_ptr<CausalLM> make_dense_decoder(const WeightLoader& weights, const ModelConfig& config,
                                             DType weight_dtype, const DenseDecoderOptions& opts) {
  return std::make_unique<DenseDecoderLM>(weights, config, weight_dtype, opts);
}

}  // namespace revolta
