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
      : DecoderBase(c, dt, w.device()), opts_(opts) {
    const int64_t H = c.hidden_size, I = c.intermediate_size, D = c.head_dim;
    const int64_t QO = int64_t(c.num_heads) * D, KVO = int64_t(c.num_kv_heads) * D;
    head_ = load_embedding_and_head(w, "model.", c, dt);
    final_norm_ = w.get("model.norm.weight", {H}, DType::kF32);
    for (int32_t l = 0; l < c.num_layers; ++l) {
      const std::string p = "model.layers." + std::to_string(l) + ".";
      DenseLayer L;
      L.input_norm = w.get(p + "input_layernorm.weight", {H}, DType::kF32);
      L.post_attn_norm = w.get(p + "post_attention_layernorm.weight", {H}, DType::kF32);
      const std::string a = p + "self_attn.";
      L.qkv = w.get_stacked_linear({a + "q_proj.weight", a + "k_proj.weight", a + "v_proj.weight"},
                                   {{QO, H}, {KVO, H}, {KVO, H}}, dt);
      if (c.attention_bias) {
        L.qkv_bias = w.get_stacked({a + "q_proj.bias", a + "k_proj.bias", a + "v_proj.bias"},
                                   {{QO}, {KVO}, {KVO}}, DType::kF32);
        L.o_bias = w.get(a + "o_proj.bias", {H}, DType::kF32);
      }
      L.o = w.get_linear(a + "o_proj.weight", {H, QO}, dt);
      if (opts.qk_norm) {
        L.q_norm = w.get(a + "q_norm.weight", {D}, DType::kF32);
        L.k_norm = w.get(a + "k_norm.weight", {D}, DType::kF32);
      }
      const std::string m = p + "mlp.";
      L.gate_up = w.get_stacked_linear({m + "gate_proj.weight", m + "up_proj.weight"}, {{I, H}, {I, H}}, dt);
      L.down = w.get_linear(m + "down_proj.weight", {H, I}, dt);
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
    ops::embedding(b.token_ids, head_.embed, residual, &first_norm);
    for (size_t l = 0; l < layers_.size(); ++l) {
      const DenseLayer& L = layers_[l];
      ops::linear(x, L.qkv, L.qkv_bias.defined() ? &L.qkv_bias : nullptr, qkv);
      ops::QkNorm norm;
      if (opts_.qk_norm) norm = {&L.q_norm, &L.k_norm, eps};
      ops::qkv_rope_attention(qkv, norm, b.positions, rope_, b.slot_mapping, q, cache.k[l], cache.v[l], b.attention,
                              scale, attn);
      ops::linear(attn.view({T, QO}), L.o, L.o_bias.defined() ? &L.o_bias : nullptr, proj);
      ops::add_rms_norm(residual, proj, L.post_attn_norm, eps, x);
      ops::linear_swiglu(x, L.gate_up, act);
      ops::linear(act, L.down, nullptr, proj);
      const Tensor& next_norm = l + 1 < layers_.size() ? layers_[l + 1].input_norm : final_norm_;
      ops::add_rms_norm(residual, proj, next_norm, eps, x);
    }
    return final_outputs(x, b, head_.lm_head);
  }

 private:
  DenseDecoderOptions opts_;
  EmbeddingAndHead head_;
  Tensor final_norm_;
  std::vector<DenseLayer> layers_;
  ops::RopeTables rope_;
};

}  // namespace

std::unique_ptr<CausalLM> make_dense_decoder(const WeightLoader& weights, const ModelConfig& config,
                                             DType weight_dtype, const DenseDecoderOptions& opts) {
  return std::make_unique<DenseDecoderLM>(weights, config, weight_dtype, opts);
}

}  // namespace revolta
