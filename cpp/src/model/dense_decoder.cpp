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
      : DecoderBase(rank_config(c, w.tensor_parallel() ? w.tensor_parallel()->world_size() : 1), dt, w.device()),
        opts_(opts), tp_(w.tensor_parallel()) {
    const int64_t H = c.hidden_size, I = c.intermediate_size, D = c.head_dim;
    const int64_t QO = int64_t(c.num_heads) * D, KVO = int64_t(c.num_kv_heads) * D;
    // Column-parallel q / k / v and gate / up (the rank's heads and intermediates), row-parallel o
    // and down (the matching input columns); the whole tensors when there is one rank.
    const Share heads = share_of(c.num_heads, cfg_.num_heads, tp_), kv = share_of(c.num_kv_heads, cfg_.num_kv_heads, tp_);
    const Share inter = share_of(I, cfg_.intermediate_size, tp_);
    const Slice q_rows = heads.rows(D), kv_rows = kv.rows(D), o_cols = heads.cols(D);
    const Slice i_rows = inter.rows(1), i_cols = inter.cols(1);
    // (a multimodal checkpoint holds the decoder under model.language_model.)
    const std::string prefix = w.has("model.language_model.embed_tokens.weight") ? "model.language_model." : "model.";
    head_ = load_embedding_and_head(w, prefix, c, dt);
    final_norm_ = w.get(prefix + "norm.weight", {H}, DType::kF32);
    for (int32_t l = 0; l < c.num_layers; ++l) {
      const std::string p = prefix + "layers." + std::to_string(l) + ".";
      DenseLayer L;
      L.input_norm = w.get(p + "input_layernorm.weight", {H}, DType::kF32);
      L.post_attn_norm = w.get(p + "post_attention_layernorm.weight", {H}, DType::kF32);
      const std::string a = p + "self_attn.";
      load_kv_scales(w, a, l);
      L.qkv = w.get_sliced({a + "q_proj.weight", a + "k_proj.weight", a + "v_proj.weight"}, {{QO, H}, {KVO, H}, {KVO, H}},
                           {q_rows, kv_rows, kv_rows}, dt, true);
      if (c.attention_bias) {
        L.qkv_bias = w.get_sliced({a + "q_proj.bias", a + "k_proj.bias", a + "v_proj.bias"}, {{QO}, {KVO}, {KVO}},
                                  {q_rows, kv_rows, kv_rows}, DType::kF32, false);
        L.qkv_bias = L.qkv_bias.view({L.qkv_bias.numel()});
        if (!tp_ || tp_->rank() == 0) L.o_bias = w.get(a + "o_proj.bias", {H}, DType::kF32);  // added once, before the sum
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
    mrope_axes_ = mrope_axes_tensor(c, rope_.rotary_dim);
    if (mrope_axes_.defined()) mrope_axes_ = mrope_axes_.to(device_);
    for (const auto& L : layers_) bytes_ += int64_t(L.qkv.nbytes() + L.o.nbytes() + L.gate_up.nbytes() + L.down.nbytes());
    bytes_ += head_.nbytes();
  }

  bool takes_media() const override { return mrope_axes_.defined(); }

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
    place_media(b, residual, first_norm);  // media placeholders take their encoder outputs
    const RopeInputs r = rope_inputs(b, rope_, mrope_axes_, cfg_.architecture);
    for (size_t l = 0; l < layers_.size(); ++l) {
      const DenseLayer& L = layers_[l];
      ops::linear(x, L.qkv, L.qkv_bias.defined() ? &L.qkv_bias : nullptr, qkv);
      ops::QkNorm norm;
      if (opts_.qk_norm) norm = {&L.q_norm, &L.k_norm, eps};
      ops::qkv_rope_attention(qkv, norm, r.positions, r.tables, b.slot_mapping, q, cache.k[l], cache.v[l], b.attention,
                              scale, attn, nullptr, cache.quant_of(l));
      ops::linear(attn.view({T, QO}), L.o, L.o_bias.defined() ? &L.o_bias : nullptr, proj);
      if (tp_) tp_->all_reduce_sum(proj);  // the ranks' heads' shares of the output projection
      ops::add_rms_norm(residual, proj, L.post_attn_norm, eps, x);
      ops::linear_swiglu(x, L.gate_up, act);
      ops::linear(act, L.down, nullptr, proj);
      if (tp_) tp_->all_reduce_sum(proj);
      const Tensor& next_norm = l + 1 < layers_.size() ? layers_[l + 1].input_norm : final_norm_;
      ops::add_rms_norm(residual, proj, next_norm, eps, x);
      add_deepstack(b, int64_t(l), residual, ops::NormInto{&next_norm, eps, &x});
    }
    return final_outputs(x, b, head_);
  }

 private:
  DenseDecoderOptions opts_;
  Communicator* tp_ = nullptr;
  EmbeddingAndHead head_;
  Tensor final_norm_;
  std::vector<DenseLayer> layers_;
  ops::RopeTables rope_;
  Tensor mrope_axes_;  // multimodal RoPE's axes (undefined: none)
};

}  // namespace

std::unique_ptr<CausalLM> make_dense_decoder(const WeightLoader& weights, const ModelConfig& config,
                                             DType weight_dtype, const DenseDecoderOptions& opts) {
  return std::make_unique<DenseDecoderLM>(weights, config, weight_dtype, opts);
}

}  // namespace revolta
