// The hybrid decoder's class, shared by the architectures that extend it (Flash-Next).
// The Qwen3 MoE / hybrid family: each layer mixes tokens with full attention (Qwen3-MoE style,
// or gated with a sigmoid output gate and partial RoPE as in Qwen3-Next / Qwen3.5) or with a
// Gated DeltaNet linear-attention block, then applies a dense SwiGLU MLP or a mixture of experts
// (softmax router, top-k, optional shared expert behind a sigmoid gate).
//
// Weight layouts are normalised at load so the forward is one straight path:
//   attention: one fused projection [q | k | v | gate]
//   DeltaNet:  one fused projection [q | k | v | z | b | a] (Qwen3-Next's per-key-head interleaved
//              in_proj_qkvz / in_proj_ba are reordered; Qwen3.5's split projections are stacked)
//   experts:   per expert [gate; up] and down, from per-expert tensors or fused 3-D tensors
//   (1 + w) RMSNorm weights are stored as 1 + w.
// Under tensor parallelism a rank holds its share of the attention heads (KV heads replicated when
// fewer than ranks), of the DeltaNet key heads with their value heads and conv channels, and of
// every MLP's and expert's intermediates (router and shared-expert gate whole); block outputs are
// partial sums, all-reduced before they join the residual stream.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <numeric>

#include "core/error.h"
#include "model/architectures.h"
#include "model/decoder_common.h"
#include "model/hybrid_decoder.h"
#include "model/moe_router.h"

namespace revolta::hybrid {


// Weights that are rearranged at load (reordered rows, stacked projections, (1 + w) norms) are read
// to the host first and placed afterwards; the rest, the experts above all, go straight to the
// engine's device, so host memory never holds the whole model.
inline constexpr Device kHost = Device::kCPU;

struct AttentionWeights {
  Tensor proj, o, q_norm, k_norm;
};

struct DeltaNetWeights {
  Tensor proj, conv, neg_a, dt_bias, norm, out;  // neg_a = -exp(A_log)
};

struct ExpertWeights {
  Tensor gate_up, down;
};

struct FeedForwardWeights {
  bool moe = false;
  Tensor gate_up, down;  // dense MLP
  Tensor router;  // [E (+ 1), hidden]: a shared expert of the experts' size adds its gate row
  std::vector<ExpertWeights> experts;
  ExpertWeights shared;
  bool shared_routed = false;  // that shared expert rides with the routed ones as expert E
  Tensor shared_gate;          // [1, hidden]: a shared expert of another size, gated on its own
  ops::ExpertTable table;      // the experts' addresses (+ the shared one), on their device
  bool down_transposed = false;  // the table's experts hold down as [inter, hidden]
};

struct Layer {
  bool linear = false;
  int32_t cache_index = 0;  // index among attention or among DeltaNet layers
  Tensor input_norm, post_norm;
  AttentionWeights attn;
  DeltaNetWeights gdn;
  FeedForwardWeights ffn;
};

// Multi-token prediction (Qwen3-Next / Qwen3.5 `mtp.*`): the embedding of the next token and a
// hidden state, each RMS-normalised, go through fc into one full-attention decoder layer, whose
// normalised output the shared LM head reads. Layer i keeps K/V in attention cache layer
// (attention layers + i).
struct MtpWeights {
  Tensor fc_embed, fc_hidden;  // mtp.fc [H, 2H] split by its input halves [embedding | hidden]
  Tensor norm_embed, norm_hidden, norm;
  std::vector<Layer> layers;
};


// Rows of `src` (f32 [R, C]) in the given order, converted to dt.
inline Tensor gather_rows(const Tensor& src, const std::vector<int64_t>& order, DType dt) {
  const int64_t C = src.size(1);
  Tensor out = Tensor::empty({int64_t(order.size()), C}, dt);
  for (size_t i = 0; i < order.size(); ++i)
    convert_from_f32(src.ptr<float>() + order[i] * C, static_cast<char*>(out.data()) + i * C * dtype_size(dt), dt,
                     size_t(C));
  return out;
}

inline Tensor to_dtype(const Tensor& f32, DType dt) {
  std::vector<int64_t> order(size_t(f32.size(0)));
  std::iota(order.begin(), order.end(), 0);
  return gather_rows(f32.view({f32.size(0), f32.numel() / f32.size(0)}), order, dt).view(f32.shape());
}

inline Tensor plus_one(Tensor w) {
  Tensor out = Tensor::empty(w.shape(), DType::kF32);
  for (int64_t i = 0; i < w.numel(); ++i) out.ptr<float>()[i] = w.ptr<float>()[i] + 1.0f;
  return out;
}

inline Tensor stack(const std::vector<Tensor>& parts, DType dt) {
  int64_t rows = 0, cols = parts[0].size(1);
  for (const auto& p : parts) rows += p.size(0);
  Tensor out = Tensor::empty({rows, cols}, dt);
  char* dst = static_cast<char*>(out.data());
  for (const auto& p : parts) {
    std::memcpy(dst, p.data(), p.nbytes());
    dst += p.nbytes();
  }
  return out;
}

class HybridDecoderLM : public DecoderBase {
 public:
  HybridDecoderLM(const WeightLoader& w, const ModelConfig& c, DType dt, const HybridOptions& o)
      : DecoderBase(rank_config(c, w.tensor_parallel() ? w.tensor_parallel()->world_size() : 1, w.expert_parallel()), dt),
        whole_(c), opts_(o), tp_(w.tensor_parallel()), expert_parallel_(w.expert_parallel()) {
    heads_ = share_of(c.num_heads, cfg_.num_heads, tp_), kv_heads_ = share_of(c.num_kv_heads, cfg_.num_kv_heads, tp_);
    key_heads_ = share_of(c.linear_num_key_heads, cfg_.linear_num_key_heads, tp_);
    value_heads_ = share_of(c.linear_num_value_heads, cfg_.linear_num_value_heads, tp_);
    prefix_ = w.has("model.language_model.embed_tokens.weight") ? "model.language_model." : "model.";
    const int64_t H = c.hidden_size;
    head_ = load_embedding_and_head(w, prefix_, c, dt);
    if (!o.hyper_connections) final_norm_ = norm_weight(w, prefix_ + "norm.weight", H);
    int32_t n_attn = 0, n_lin = 0;
    for (int32_t l = 0; l < c.num_layers; ++l) {
      const bool linear = c.linear_layers.empty() ? false : bool(c.linear_layers[size_t(l)]);
      const int32_t index = linear ? n_lin++ : n_attn++;
      layers_.push_back(load_layer(w, prefix_ + "layers." + std::to_string(l) + ".", linear, index, c.is_moe_layer(l),
                                   !o.hyper_connections));
      bytes_ += layer_bytes(layers_.back());
    }
    // A config may name MTP layers that a checkpoint (a converted or a tiny one) does not carry.
    if (c.num_mtp_layers > 0 && w.has("mtp.fc.weight")) load_mtp(w, n_attn);
    rope_ = build_rope_tables(c.rope, c.head_dim, c.max_positions);
    mrope_axes_ = mrope_axes_tensor(c, rope_.rotary_dim);
    bytes_ += head_.nbytes();
    build_expert_tables();
  }

  // Decode batches up to this many tokens take the device-side expert path, which needs no
  // host round trip; on the CPU, grouping by expert pays from two tokens on.
  int32_t max_captured_batch() const override { return has_moe_ ? fused_expert_tokens_ : CausalLM::max_captured_batch(); }

  ForwardOutput forward(const ForwardBatch& b, ModelCaches& caches) override {
    const int64_t T = b.token_ids.numel(), H = cfg_.hidden_size;
    const float eps = cfg_.rms_norm_eps;
    Tensor residual = Tensor::uninitialized({T, H}, DType::kF32, device_);
    Tensor x = Tensor::uninitialized({T, H}, DType::kF32, device_);
    const ops::NormInto first_norm{&layers_[0].input_norm, eps, &x};
    embed_tokens(head_, b.token_ids, residual, first_norm);
    place_media(b, residual, first_norm);  // media placeholders take their encoder outputs
    // Each block's output is added to the residual stream and normalised for the next block
    // (ops::ResidualNorm, which the routing and the expert kernels fuse): x is the normalised input
    // of every block.
    for (size_t l = 0; l < layers_.size(); ++l) {
      const Layer& L = layers_[l];
      const ops::ResidualNorm post{&residual, &L.post_norm, eps, &x};
      Tensor y = L.linear ? deltanet(L, b, *caches.state, x) : attention(L, b, *caches.kv, x);
      reduce(y);
      const bool last = l + 1 == layers_.size();
      const Tensor& next = last ? final_norm_ : layers_[l + 1].input_norm;
      // what the step reads after this block: the next block's input projection, or the LM head
      const Tensor& ahead = last ? head_.lm_head : layers_[l + 1].linear ? layers_[l + 1].gdn.proj : layers_[l + 1].attn.proj;
      feed_forward(L.ffn, y, post, ops::ResidualNorm{&residual, &next, eps, &x}, ahead);
      add_deepstack(b, int64_t(l), residual, ops::NormInto{&next, eps, &x});
    }
    return final_outputs(x, b, head_);
  }

  int32_t num_mtp_layers() const override { return int32_t(mtp_.layers.size()); }
  bool takes_media() const override { return mrope_axes_.defined() && !opts_.hyper_connections; }

  ForwardOutput mtp_forward(const ForwardBatch& b, const Tensor& hidden, int32_t layer, ModelCaches& caches) override {
    RV_CHECK(layer >= 0 && layer < num_mtp_layers(), cfg_.architecture, ": no multi-token-prediction layer ", layer);
    const int64_t T = b.token_ids.numel(), H = cfg_.hidden_size;
    RV_CHECK(hidden.size(0) == T && hidden.size(1) == H, "mtp_forward: hidden states [", hidden.size(0), ", ",
             hidden.size(1), "] for ", T, " tokens");
    const float eps = cfg_.rms_norm_eps;
    const Device dev = device_;
    const Layer& L = mtp_.layers[size_t(layer)];
    Tensor embedded = Tensor::uninitialized({T, H}, DType::kF32, dev), e = Tensor::uninitialized({T, H}, DType::kF32, dev);
    const ops::NormInto embed_norm{&mtp_.norm_embed, eps, &e};
    embed_tokens(head_, b.token_ids, embedded, embed_norm);
    Tensor h = Tensor::uninitialized({T, H}, DType::kF32, dev);
    ops::rms_norm(hidden, mtp_.norm_hidden, eps, h);
    // fc over [e | h] as two projections; their sum is the layer's residual stream.
    Tensor residual = project(e, mtp_.fc_embed), x = Tensor::uninitialized({T, H}, DType::kF32, dev);
    ops::add_rms_norm(residual, project(h, mtp_.fc_hidden), L.input_norm, eps, x);
    Tensor y = attention(L, b, *caches.kv, x);
    reduce(y);
    feed_forward(L.ffn, y, ops::ResidualNorm{&residual, &L.post_norm, eps, &x},
                 ops::ResidualNorm{&residual, &mtp_.norm, eps, &x}, head_.lm_head);
    return final_outputs(x, b, head_);
  }

  std::vector<Tensor>* kept_inputs() override { return &kept_; }

  void replay_states(const Tensor& rows, const Tensor& seq_starts, const Tensor& seq_slots, ModelCaches& caches) override {
    const int64_t R = rows.numel(), value_dim = int64_t(cfg_.linear_num_value_heads) * cfg_.linear_value_head_dim;
    for (const Layer& L : layers_) {
      if (!L.linear) continue;
      const size_t layer = size_t(L.cache_index);
      RV_CHECK(layer < kept_.size() && kept_[layer].defined(), "replay_states: the last forward kept no rows");
      Tensor fused = Tensor::uninitialized({R, kept_[layer].size(1)}, DType::kF32, device_);
      ops::gather_rows(kept_[layer], rows, fused);
      Tensor unused = Tensor::uninitialized({R, value_dim}, DType::kF32, device_);
      const ops::GdnWeights w{&L.gdn.proj, &L.gdn.conv, &L.gdn.neg_a, &L.gdn.dt_bias, &L.gdn.norm, cfg_.rms_norm_eps};
      ops::gdn_decode(nullptr, fused, w, caches.state->conv[layer], caches.state->ssm[layer], seq_starts, seq_slots,
                      unused);
    }
  }

  // Weights are prepared on the host (reordered, stacked, (1 + w) norms), then moved here.
  void place(Device device) override {
    if (device == device_) return;
    auto move = [&](Tensor& t) {
      if (t.defined()) t = t.to(device);
    };
    const bool tied = head_.lm_head.data() == head_.embed.data();
    move(head_.embed);
    if (tied) head_.lm_head = head_.embed;
    else move(head_.lm_head);
    move(final_norm_);
    move(rope_.cos);
    move(rope_.sin);
    move(mrope_axes_);
    auto move_layer = [&](Layer& L) {
      for (Tensor* t : {&L.input_norm, &L.post_norm, &L.attn.proj, &L.attn.o, &L.attn.q_norm, &L.attn.k_norm,
                        &L.gdn.proj, &L.gdn.conv, &L.gdn.neg_a, &L.gdn.dt_bias, &L.gdn.norm, &L.gdn.out,
                        &L.ffn.gate_up, &L.ffn.down, &L.ffn.router, &L.ffn.shared.gate_up, &L.ffn.shared.down,
                        &L.ffn.shared_gate})
        move(*t);
      for (ExpertWeights& e : L.ffn.experts) move(e.gate_up), move(e.down);
    };
    for (Layer& L : layers_) move_layer(L);
    for (Layer& L : mtp_.layers) move_layer(L);
    for (Tensor* t : {&mtp_.fc_embed, &mtp_.fc_hidden, &mtp_.norm_embed, &mtp_.norm_hidden, &mtp_.norm}) move(*t);
    device_ = device;
    build_expert_tables();
  }

 protected:
  Tensor norm_weight(const WeightLoader& w, const std::string& name, int64_t n) const {
    Tensor t = w.get(name, {n}, DType::kF32, kHost);
    return opts_.one_plus_norm ? plus_one(t) : t;
  }

  // norms: the layer's own input and post-attention norms (not where hyper-connections replace them).
  Layer load_layer(const WeightLoader& w, const std::string& p, bool linear, int32_t cache_index, bool moe, bool norms) {
    const int64_t H = cfg_.hidden_size;
    Layer L;
    L.linear = linear;
    L.cache_index = cache_index;
    if (norms) {
      L.input_norm = norm_weight(w, p + "input_layernorm.weight", H);
      L.post_norm = norm_weight(w, p + "post_attention_layernorm.weight", H);
    }
    if (linear) load_deltanet(w, p + "linear_attn.", L.gdn);
    else load_attention(w, p + "self_attn.", L.attn), load_kv_scales(w, p + "self_attn.", cache_index);
    load_ffn(w, p + "mlp.", moe, L.ffn);
    return L;
  }

  void load_mtp(const WeightLoader& w, int32_t num_attention_layers) {
    const int64_t H = cfg_.hidden_size;
    const Tensor fc = w.get("mtp.fc.weight", {H, 2 * H}, DType::kF32, kHost);
    mtp_.fc_embed = Tensor::empty({H, H}, dtype_);
    mtp_.fc_hidden = Tensor::empty({H, H}, dtype_);
    for (int64_t r = 0; r < H; ++r) {
      const float* row = fc.ptr<float>() + r * 2 * H;
      convert_from_f32(row, static_cast<char*>(mtp_.fc_embed.data()) + r * H * dtype_size(dtype_), dtype_, size_t(H));
      convert_from_f32(row + H, static_cast<char*>(mtp_.fc_hidden.data()) + r * H * dtype_size(dtype_), dtype_, size_t(H));
    }
    mtp_.norm_embed = norm_weight(w, "mtp.pre_fc_norm_embedding.weight", H);
    mtp_.norm_hidden = norm_weight(w, "mtp.pre_fc_norm_hidden.weight", H);
    mtp_.norm = norm_weight(w, "mtp.norm.weight", H);
    bytes_ += int64_t(mtp_.fc_embed.nbytes() + mtp_.fc_hidden.nbytes());
    for (int32_t i = 0; i < cfg_.num_mtp_layers; ++i) {
      const std::string p = "mtp.layers." + std::to_string(i) + ".";
      const bool moe = cfg_.num_experts > 0 && w.has(p + "mlp.gate.weight");
      mtp_.layers.push_back(load_layer(w, p, false, num_attention_layers + i, moe, /*norms=*/true));
      bytes_ += layer_bytes(mtp_.layers.back());
    }
    std::fprintf(stderr, "revolta: %d multi-token-prediction layer(s) (mtp.*) ready for speculative decoding\n",
                 cfg_.num_mtp_layers);
  }

  void load_attention(const WeightLoader& w, const std::string& p, AttentionWeights& a) {
    const int64_t H = whole_.hidden_size, D = whole_.head_dim, NH = whole_.num_heads, KVH = whole_.num_kv_heads;
    const int64_t per_head = opts_.gated_attention ? 2 * D : D, nh = heads_.count;  // q_proj rows of a head
    auto rows = [&](const std::string& name, int64_t n, const Share& s, int64_t unit) {
      return w.get_sliced({p + name}, {{n * unit, H}}, {s.rows(unit)}, DType::kF32, false, kHost);
    };
    Tensor q = rows("q_proj.weight", NH, heads_, per_head);
    Tensor k = rows("k_proj.weight", KVH, kv_heads_, D), v = rows("v_proj.weight", KVH, kv_heads_, D);
    std::vector<Tensor> parts;
    if (opts_.gated_attention) {  // q_proj rows per head are [query (D) | gate (D)]
      std::vector<int64_t> qrows, grows;
      for (int64_t h = 0; h < nh; ++h)
        for (int64_t d = 0; d < D; ++d) qrows.push_back(h * 2 * D + d), grows.push_back(h * 2 * D + D + d);
      parts = {gather_rows(q, qrows, dtype_), to_dtype(k, dtype_), to_dtype(v, dtype_), gather_rows(q, grows, dtype_)};
    } else {
      parts = {to_dtype(q, dtype_), to_dtype(k, dtype_), to_dtype(v, dtype_)};
    }
    a.proj = stack(parts, dtype_);
    a.o = w.get_sliced({p + "o_proj.weight"}, {{H, NH * D}}, {heads_.cols(D)}, dtype_, true);
    a.q_norm = norm_weight(w, p + "q_norm.weight", D);
    a.k_norm = norm_weight(w, p + "k_norm.weight", D);
  }

  // A rank's key heads come with their value heads (value head j belongs to key head j / r) and
  // the conv channels of both.
  void load_deltanet(const WeightLoader& w, const std::string& p, DeltaNetWeights& g) {
    const ModelConfig& c = whole_;
    const int64_t H = c.hidden_size, Hk = c.linear_num_key_heads, Hv = c.linear_num_value_heads;
    const int64_t Dk = c.linear_key_head_dim, Dv = c.linear_value_head_dim, r = Hv / Hk;
    const int64_t key_dim = Hk * Dk, value_dim = Hv * Dv, conv_dim = 2 * key_dim + value_dim;
    const int64_t nk = key_heads_.count, nv = value_heads_.count, K = c.linear_conv_kernel_dim;
    RV_CHECK(Hk > 0 && Hv % Hk == 0, "linear_num_value_heads must be a multiple of linear_num_key_heads");
    // The rank's q, k and v channels of the [q | k | v] conv input.
    const Slice q_rows = key_heads_.rows(Dk), v_rows = value_heads_.rows(Dv);
    const Slice k_rows = Slice::rows(key_dim + q_rows.begin, key_dim + q_rows.end);
    const Slice qkv_v_rows = Slice::rows(2 * key_dim + v_rows.begin, 2 * key_dim + v_rows.end);
    if (w.has(p + "in_proj_qkvz.weight")) {  // Qwen3-Next: grouped per key head
      const int64_t group = 2 * Dk + 2 * r * Dv;
      Tensor qkvz = w.get_sliced({p + "in_proj_qkvz.weight"}, {{Hk * group, H}}, {key_heads_.rows(group)}, DType::kF32,
                                 false, kHost);
      Tensor ba = w.get_sliced({p + "in_proj_ba.weight"}, {{2 * Hv, H}}, {key_heads_.rows(2 * r)}, DType::kF32, false,
                               kHost);
      std::vector<int64_t> order;
      auto add = [&](int64_t offset, int64_t len) {
        for (int64_t gk = 0; gk < nk; ++gk)
          for (int64_t i = 0; i < len; ++i) order.push_back(gk * group + offset + i);
      };
      add(0, Dk);                   // q
      add(Dk, Dk);                  // k
      add(2 * Dk, r * Dv);          // v
      add(2 * Dk + r * Dv, r * Dv); // z
      std::vector<int64_t> ba_order;
      for (int64_t which = 0; which < 2; ++which)  // b then a
        for (int64_t gk = 0; gk < nk; ++gk)
          for (int64_t i = 0; i < r; ++i) ba_order.push_back(gk * 2 * r + which * r + i);
      g.proj = stack({gather_rows(qkvz, order, dtype_), gather_rows(ba, ba_order, dtype_)}, dtype_);
    } else {  // Qwen3.5: separate projections, already in order
      const std::string qkv = p + "in_proj_qkv.weight";
      g.proj = w.get_sliced({qkv, qkv, qkv, p + "in_proj_z.weight", p + "in_proj_b.weight", p + "in_proj_a.weight"},
                            {{conv_dim, H}, {conv_dim, H}, {conv_dim, H}, {value_dim, H}, {Hv, H}, {Hv, H}},
                            {q_rows, k_rows, qkv_v_rows, v_rows, value_heads_.rows(1), value_heads_.rows(1)}, dtype_, false);
    }
    const std::string conv = p + "conv1d.weight";
    const std::vector<int64_t> conv_shape{conv_dim, 1, K};
    g.conv = w.get_sliced({conv, conv, conv}, {conv_shape, conv_shape, conv_shape}, {q_rows, k_rows, qkv_v_rows},
                          DType::kF32, false)
                 .view({2 * nk * Dk + nv * Dv, K});
    Tensor a_log = w.get_sliced({p + "A_log"}, {{Hv}}, {value_heads_.rows(1)}, DType::kF32, false, kHost);
    g.neg_a = Tensor::empty({nv}, DType::kF32);
    for (int64_t i = 0; i < nv; ++i) g.neg_a.ptr<float>()[i] = -std::exp(a_log.ptr<float>()[i]);
    g.dt_bias = w.get_sliced({p + "dt_bias"}, {{Hv}}, {value_heads_.rows(1)}, DType::kF32, false).view({nv});
    g.norm = w.get(p + "norm.weight", {Dv}, DType::kF32);
    g.out = w.get_sliced({p + "out_proj.weight"}, {{H, value_dim}}, {value_heads_.cols(Dv)}, dtype_, false);
  }

  // An expert whole (expert parallelism).
  void load_whole_mlp(const WeightLoader& w, const std::string& q, int64_t I, ExpertWeights& e) {
    const int64_t H = whole_.hidden_size;
    e.gate_up = w.get_stacked_linear({q + "gate_proj.weight", q + "up_proj.weight"}, {{I, H}, {I, H}}, dtype_);
    e.down = w.get_linear(q + "down_proj.weight", {H, I}, dtype_);
  }

  void load_ffn(const WeightLoader& w, const std::string& p, bool moe, FeedForwardWeights& f) {
    const int64_t H = whole_.hidden_size;
    f.moe = moe;
    // Column-parallel gate / up (the rank's intermediates), row-parallel down (their columns).
    auto mlp = [&](const std::string& q, int64_t I, int64_t count, ExpertWeights& e) {
      const Share s = share_of(I, count, tp_);
      e.gate_up = w.get_sliced({q + "gate_proj.weight", q + "up_proj.weight"}, {{I, H}, {I, H}}, {s.rows(1), s.rows(1)},
                               dtype_, true);
      e.down = w.get_sliced({q + "down_proj.weight"}, {{H, I}}, {s.cols(1)}, dtype_, true);
    };
    if (!f.moe) {
      ExpertWeights e;
      mlp(p, whole_.intermediate_size, cfg_.intermediate_size, e);
      f.gate_up = e.gate_up, f.down = e.down;
      return;
    }
    const int64_t E = whole_.num_experts, I = whole_.moe_intermediate_size;
    // Expert parallelism: this rank's experts whole, the others' left empty (never grouped here).
    const Share held = expert_parallel_ ? share_of(E, E / tp_->world_size(), tp_) : Share{0, E};
    // transformers 5's fused layout (made-up weights take the per-expert one, which ranks read in parts)
    if (w.has(p + "experts.gate_up_proj") && !w.dummy()) {
      const std::string gu_name = p + "experts.gate_up_proj", dn_name = p + "experts.down_proj";
      if (expert_parallel_) {
        f.experts.resize(size_t(E));
        for (int64_t e = held.first; e < held.first + held.count; ++e)
          f.experts[size_t(e)] = {w.get_sliced({gu_name}, {{E * 2 * I, H}}, {Slice::rows(e * 2 * I, (e + 1) * 2 * I)}, dtype_, false),
                                  w.get_sliced({dn_name}, {{E * H, I}}, {Slice::rows(e * H, (e + 1) * H)}, dtype_, false)};
      } else if (!tp_) {  // the whole tensors, each expert a view of them
        Tensor gu = w.get(gu_name, {E, 2 * I, H}, dtype_), dn = w.get(dn_name, {E, H, I}, dtype_);
        for (int64_t e = 0; e < E; ++e)
          f.experts.push_back({gu.slice_rows(e, e + 1).view({2 * I, H}), dn.slice_rows(e, e + 1).view({H, I})});
      } else {  // a rank reads its rows of each expert's gate and up, its columns of down (as 2-D)
        const Share s = share_of(I, cfg_.moe_intermediate_size, tp_);
        for (int64_t e = 0; e < E; ++e) {
          const int64_t g0 = e * 2 * I + s.first, u0 = e * 2 * I + I + s.first;
          Tensor gate_up = w.get_sliced({gu_name, gu_name}, {{E * 2 * I, H}, {E * 2 * I, H}},
                                        {Slice::rows(g0, g0 + s.count), Slice::rows(u0, u0 + s.count)}, dtype_, false);
          Tensor down = w.get_sliced({dn_name}, {{E * H, I}}, {Slice::block(e * H, (e + 1) * H, s.first, s.first + s.count)},
                                     dtype_, false);
          f.experts.push_back({gate_up, down});
        }
      }
    } else {
      f.experts.resize(size_t(E));
      for (int64_t e = held.first; e < held.first + held.count; ++e) {
        if (expert_parallel_) load_whole_mlp(w, p + "experts." + std::to_string(e) + ".", I, f.experts[size_t(e)]);
        else mlp(p + "experts." + std::to_string(e) + ".", I, cfg_.moe_intermediate_size, f.experts[size_t(e)]);
      }
    }
    const int64_t SI = whole_.shared_expert_intermediate_size;
    if (SI > 0) mlp(p + "shared_expert.", SI, cfg_.shared_expert_intermediate_size, f.shared);
    // A shared expert of the routed experts' size and format joins them: its gate logit comes out
    // of the router's GEMV as one more column and its rows out of the same expert kernels.
    const DType routed = f.experts[size_t(held.first)].gate_up.dtype();
    for (const ExpertWeights& e : f.experts)
      RV_CHECK(!e.gate_up.defined() || (e.gate_up.dtype() == routed && e.down.dtype() == routed), "model: the experts of ", p,
               " mix weight formats (",
               dtype_name(routed), ", ", dtype_name(e.gate_up.dtype()), ", ", dtype_name(e.down.dtype()), ")");
    // (Under expert parallelism the shared expert stays split over the ranks: it runs on its own,
    // its gate row taken back out of the same stacked router.)
    const bool alike = SI == I && f.shared.gate_up.dtype() == routed && f.shared.down.dtype() == routed;
    f.shared_routed = alike && !expert_parallel_;
    if (alike) {
      f.router = w.get_stacked({p + "gate.weight", p + "shared_expert_gate.weight"}, {{E, H}, {1, H}}, DType::kF32);
      if (!f.shared_routed) f.shared_gate = f.router.slice_rows(E, E + 1), f.router = f.router.slice_rows(0, E);
    } else {
      f.router = w.get(p + "gate.weight", {E, H}, DType::kF32);
      if (SI > 0) f.shared_gate = w.get(p + "shared_expert_gate.weight", {1, H}, DType::kF32);
    }
  }

  void build_expert_tables() {
    DType experts = dtype_;  // the experts' weight format (a quantized checkpoint's blocks)
    for (Layer* layer : all_layers())
      for (const ExpertWeights& e : layer->ffn.experts)
        if (e.gate_up.defined()) experts = e.gate_up.dtype();
    const bool device_kernels =
        device_ != Device::kCPU &&
        ops::supports_op(device_, ops::Op::kMoeRouteExperts, {experts, cfg_.hidden_size, cfg_.moe_intermediate_size});
    // Past the device kernels' shape limits: host grouping only, no graphs.
    fused_expert_tokens_ = device_ == Device::kCPU ? 1 : device_kernels ? kFusedExpertTokensOnDevice : 0;
    for (Layer* layer : all_layers()) {
      FeedForwardWeights& f = layer->ffn;
      if (!f.moe) continue;
      has_moe_ = true;
      const int64_t E = int64_t(f.experts.size()), n = E + (f.shared_routed ? 1 : 0);
      // The device kernels stream 16-bit down matrices as [inter, hidden]; blocks stay as stored.
      const bool transposed = device_kernels && !is_block_dtype(experts);
      if (f.down_transposed != transposed) {
        for (int64_t e = 0; e < n; ++e) {
          Tensor& d = e < E ? f.experts[size_t(e)].down : f.shared.down;
          if (!d.defined()) continue;  // another rank's expert
          Tensor t = Tensor::uninitialized({d.size(1), d.size(0)}, d.dtype(), d.device());
          ops::transpose(d, t);
          d = t;
        }
        f.down_transposed = transposed;
      }
      Tensor gu = Tensor::empty({n}, DType::kI64), dn = Tensor::empty({n}, DType::kI64);
      for (int64_t e = 0; e < n; ++e) {  // (zero, as empty() left it: another rank's expert)
        const ExpertWeights& x = e < E ? f.experts[size_t(e)] : f.shared;
        if (!x.gate_up.defined()) continue;
        gu.ptr<int64_t>()[e] = int64_t(reinterpret_cast<intptr_t>(x.gate_up.data()));
        dn.ptr<int64_t>()[e] = int64_t(reinterpret_cast<intptr_t>(x.down.data()));
      }
      f.table = {gu.to(device_), dn.to(device_), experts, cfg_.hidden_size,
                 cfg_.moe_intermediate_size, f.down_transposed};
    }
  }

  std::vector<Layer*> all_layers() {
    std::vector<Layer*> out;
    for (Layer& L : layers_) out.push_back(&L);
    for (Layer& L : mtp_.layers) out.push_back(&L);
    return out;
  }

  // The layer's matrices (a layer holds either attention or DeltaNet, a dense MLP or experts).
  static int64_t layer_bytes(const Layer& L) {
    int64_t n = 0;
    for (const Tensor* t : {&L.attn.proj, &L.attn.o, &L.gdn.proj, &L.gdn.out, &L.ffn.gate_up, &L.ffn.down,
                            &L.ffn.shared.gate_up, &L.ffn.shared.down})
      n += t->defined() ? int64_t(t->nbytes()) : 0;
    for (const auto& e : L.ffn.experts)
      if (e.gate_up.defined()) n += int64_t(e.gate_up.nbytes() + e.down.nbytes());
    return n;
  }

  // The attention block's output projection (not yet added to the residual stream).
  Tensor attention(const Layer& L, const ForwardBatch& b, KvCache& kv, const Tensor& x) {
    const int64_t T = x.size(0), D = cfg_.head_dim, NH = cfg_.num_heads, KVH = cfg_.num_kv_heads;
    const int64_t QO = NH * D, KVO = KVH * D, width = L.attn.proj.size(0);
    const float eps = cfg_.rms_norm_eps;
    const Device dev = x.device();
    Tensor fused = Tensor::uninitialized({T, width}, DType::kF32, dev);
    ops::linear(x, L.attn.proj, nullptr, fused);
    Tensor q = Tensor::uninitialized({T, NH, D}, DType::kF32, dev), attn = Tensor::uninitialized({T, NH, D}, DType::kF32, dev);
    const ops::QkNorm norm{&L.attn.q_norm, &L.attn.k_norm, eps};
    const ops::OutputGate gate{&fused, QO + 2 * KVO};  // gated attention: the gate's columns follow q, k, v
    const RopeInputs r = rope_inputs(b, rope_, mrope_axes_, cfg_.architecture);
    ops::qkv_rope_attention(fused, norm, r.positions, r.tables, b.slot_mapping, q, kv.k[size_t(L.cache_index)],
                            kv.v[size_t(L.cache_index)], b.attention, 1.0f / std::sqrt(float(D)), attn,
                            opts_.gated_attention ? &gate : nullptr, kv.quant_of(size_t(L.cache_index)));
    return project(attn.view({T, QO}), L.attn.o);
  }

  // The DeltaNet block's output projection (not yet added to the residual stream); the kept rows
  // of its input projection are kept for replay_states.
  Tensor deltanet(const Layer& L, const ForwardBatch& b, StateCache& states, const Tensor& x) {
    Tensor fused = Tensor::uninitialized({x.size(0), L.gdn.proj.size(0)}, DType::kF32, x.device());
    Tensor y = deltanet_block(L, b, states, x, fused);
    keep_inputs(L, b, fused);
    return y;
  }

  // A verify step's rows of a DeltaNet block's input projection, which replay_states reads.
  void keep_inputs(const Layer& L, const ForwardBatch& b, const Tensor& fused) {
    if (!b.kept_rows.defined()) return;
    const size_t layer = size_t(L.cache_index);
    kept_.resize(std::max(kept_.size(), layer + 1));
    kept_[layer] = Tensor::uninitialized({b.kept_rows.numel(), fused.size(1)}, DType::kF32, fused.device());
    ops::gather_rows(fused, b.kept_rows, kept_[layer]);
  }

  Tensor deltanet_block(const Layer& L, const ForwardBatch& b, StateCache& states, const Tensor& x, Tensor& fused) {
    const ModelConfig& c = cfg_;
    const int64_t T = x.size(0), Hk = c.linear_num_key_heads, Hv = c.linear_num_value_heads;
    const int64_t Dk = c.linear_key_head_dim, Dv = c.linear_value_head_dim;
    const int64_t key_dim = Hk * Dk, value_dim = Hv * Dv, conv_dim = 2 * key_dim + value_dim;
    const Device dev = x.device();
    const size_t layer = size_t(L.cache_index);
    Tensor normed = Tensor::uninitialized({T, value_dim}, DType::kF32, dev);
    if (T <= kDecodeTokens) {  // projection, conv, norms, gates, recurrent rule and output norm in one op
      const ops::GdnWeights w{&L.gdn.proj, &L.gdn.conv, &L.gdn.neg_a, &L.gdn.dt_bias, &L.gdn.norm, cfg_.rms_norm_eps};
      if (T == 1) {  // the gated norm's RMS left to the output projection (ops::GroupScale)
        Tensor squares = Tensor::uninitialized({T, Hv, (Dv + 31) / 32}, DType::kF32, dev);
        ops::gdn_decode(&x, fused, w, states.conv[layer], states.ssm[layer], b.seq_starts, b.seq_state_slots, normed,
                        &squares);
        Tensor y = Tensor::uninitialized({T, L.gdn.out.size(0)}, DType::kF32, dev);
        ops::linear_scaled(normed, ops::GroupScale{&squares, cfg_.rms_norm_eps}, L.gdn.out, y);
        return y;
      }
      ops::gdn_decode(&x, fused, w, states.conv[layer], states.ssm[layer], b.seq_starts, b.seq_state_slots, normed);
      return project(normed, L.gdn.out);
    }
    ops::linear(x, L.gdn.proj, nullptr, fused);
    Tensor conv_out = Tensor::uninitialized({T, conv_dim}, DType::kF32, dev);
    Tensor g = Tensor::uninitialized({T, Hv}, DType::kF32, dev), beta = Tensor::uninitialized({T, Hv}, DType::kF32, dev);
    ops::gdn_gates(fused, conv_dim + value_dim, L.gdn.neg_a, L.gdn.dt_bias, beta, g);
    Tensor q = Tensor::uninitialized({T, Hk, Dk}, DType::kF32, dev), k = Tensor::uninitialized({T, Hk, Dk}, DType::kF32, dev);
    Tensor v = Tensor::uninitialized({T, Hv, Dv}, DType::kF32, dev), core = Tensor::uninitialized({T, Hv, Dv}, DType::kF32, dev);
    // The conv reads [q | k | v] straight from the fused projection's first conv_dim columns.
    ops::causal_conv1d(fused, L.gdn.conv, states.conv[layer], b.seq_starts, b.seq_state_slots, conv_out, true);
    ops::gdn_split_qkv(conv_out, 1e-6f, q, k, v);
    ops::gated_delta_rule(q, k, v, g, beta, states.ssm[layer], b.seq_starts, b.seq_state_slots, core, kChunk);
    ops::gated_rms_norm(core, fused, conv_dim, L.gdn.norm, cfg_.rms_norm_eps, normed);  // z: columns of the projection
    return project(normed, L.gdn.out);
  }

  // The block output y goes into the residual stream and its norm into post.normed (x), the MLP's
  // input; x is then overwritten with the next block's normalised input (then.normed is x too).
  // ahead: the weights the step reads after this block (ops::moe_route_experts' warm hint).
  void feed_forward(const FeedForwardWeights& f, const Tensor& y, const ops::ResidualNorm& post,
                    const ops::ResidualNorm& then, const Tensor& ahead) {
    const Tensor& x = *post.normed;
    const int64_t T = x.size(0), H = cfg_.hidden_size;
    if (!f.moe) {
      ops::add_rms_norm(*post.residual, y, *post.weight, post.eps, *post.normed);
      Tensor act = Tensor::uninitialized({T, f.down.size(1)}, DType::kF32, x.device());
      ops::linear_swiglu(x, f.gate_up, act);
      residual_out(act, f.down, then);
      return;
    }
    const int64_t E = cfg_.num_experts, S = f.shared_routed ? 1 : 0, K = cfg_.num_experts_per_tok + S;
    const Device dev = x.device();
    // Routing is computed on the model's device. A device runs every batch through moe_experts
    // (decode kernels, or grouping by expert on the device for prefill); the CPU groups prefill
    // batches by expert on the host and moves the experts' rows by gather / scatter ops.
    Tensor ids = Tensor::uninitialized({T, K}, DType::kI32, dev), weights = Tensor::uninitialized({T, K}, DType::kF32, dev);
    const bool device_experts = device_ != Device::kCPU && fused_expert_tokens_ > 0;
    const bool gated_shared = f.shared_gate.defined();  // added after the routed experts
    if ((T <= fused_expert_tokens_ || device_experts) && !gated_shared) {  // the add + norm, routing, experts
      Tensor out = Tensor::uninitialized({T, H}, DType::kF32, dev);
      ops::moe_route_experts(y, f.router, E, cfg_.norm_topk_prob, post, ids, weights, f.table, out, tp_ ? nullptr : &then,
                             &ahead);
      if (tp_) reduce_into(out, then);  // a rank's part of each expert's output
      return;
    }
    ops::moe_route(y, f.router, E, cfg_.norm_topk_prob, ids, weights, &post);  // the add + norm first
    Tensor out = experts_output(f, x, ids, weights);
    reduce_into(out, then);
  }

  // The routed experts (and a shared one) of x [T, hidden] as routed by ids / weights.
  Tensor experts_output(const FeedForwardWeights& f, const Tensor& x, const Tensor& ids, const Tensor& weights) {
    const int64_t T = x.size(0), H = cfg_.hidden_size, E = cfg_.num_experts, S = f.shared_routed ? 1 : 0;
    const int64_t K = cfg_.num_experts_per_tok + S;
    const Device dev = x.device();
    if (T <= fused_expert_tokens_ || (device_ != Device::kCPU && fused_expert_tokens_ > 0)) {
      Tensor out = Tensor::uninitialized({T, H}, DType::kF32, dev);
      ops::moe_experts(x, ids, weights, f.table, out, nullptr);
      add_shared_expert(f, x, out);
      return out;
    }
    const Tensor hids = ids.to(Device::kCPU), hw = weights.to(Device::kCPU);
    const auto routed = group_by_expert(hids.ptr<int32_t>(), hw.ptr<float>(), T, E + S, K);
    Tensor acc = Tensor::empty({T, H}, DType::kF32, dev);  // zeroed
    for (int64_t e = 0; e < E + S; ++e) {  // grouped by expert: one batched GEMM pair per expert
      const auto& list = routed[size_t(e)];
      const ExpertWeights& ex = e < E ? f.experts[size_t(e)] : f.shared;
      if (list.empty() || !ex.gate_up.defined()) continue;  // (undefined: another rank's expert)
      const int64_t n = int64_t(list.size());
      Tensor rows = Tensor::uninitialized({n}, DType::kI32), wgt = Tensor::uninitialized({n}, DType::kF32);
      for (int64_t i = 0; i < n; ++i) rows.ptr<int32_t>()[i] = int32_t(list[size_t(i)].first), wgt.ptr<float>()[i] = list[size_t(i)].second;
      const Tensor drows = rows.to(dev), dwgt = wgt.to(dev);
      Tensor xe = Tensor::uninitialized({n, H}, DType::kF32, dev), ye = Tensor::uninitialized({n, H}, DType::kF32, dev);
      ops::gather_rows(x, drows, xe);
      mlp(ex.gate_up, ex.down, xe, ye);
      ops::scatter_add_rows(acc, drows, dwgt, ye);
    }
    add_shared_expert(f, x, acc);
    return acc;
  }

  void add_shared_expert(const FeedForwardWeights& f, const Tensor& x, Tensor& acc) {
    if (!f.shared_gate.defined()) return;
    const int64_t T = x.size(0), H = cfg_.hidden_size;
    Tensor ys = Tensor::uninitialized({T, H}, DType::kF32, x.device()), gate = Tensor::uninitialized({T, 1}, DType::kF32, x.device());
    mlp(f.shared.gate_up, f.shared.down, x, ys);
    ops::linear(x, f.shared_gate, nullptr, gate);
    ops::add_gated_rows(acc, ys, gate);
  }

  // A block's output projection, added to the residual stream and normalised for the next block.
  // (A GEMV whose last block did the add + norm measured slower on the H200 than these two launches.)
  void residual_out(const Tensor& x, const Tensor& weight, const ops::ResidualNorm& then) {
    Tensor y = project(x, weight);
    reduce_into(y, then);
  }

  // Under tensor parallelism a block's output is each rank's partial sum: summed over the ranks here.
  void reduce(Tensor& y) {
    if (tp_) tp_->all_reduce_sum(y);
  }

  // y (reduced) added to the residual stream and normalised.
  void reduce_into(Tensor& y, const ops::ResidualNorm& then) {
    reduce(y);
    ops::add_rms_norm(*then.residual, y, *then.weight, then.eps, *then.normed);
  }

  static Tensor project(const Tensor& x, const Tensor& weight) {
    Tensor y = Tensor::uninitialized({x.size(0), weight.size(0)}, DType::kF32, x.device());
    ops::linear(x, weight, nullptr, y);
    return y;
  }

  static void mlp(const Tensor& gate_up, const Tensor& down, const Tensor& x, Tensor& out) {
    const int64_t T = x.size(0), I = down.size(1);
    Tensor act = Tensor::uninitialized({T, I}, DType::kF32, x.device());
    ops::linear_swiglu(x, gate_up, act);
    ops::linear(act, down, nullptr, out);
  }

  static constexpr int32_t kChunk = 64;
  static constexpr int64_t kDecodeTokens = 64;  // DeltaNet batches up to this size take gdn_decode
  // Past this many tokens a batch reads more expert matrices per token than grouping costs.
  static constexpr int32_t kFusedExpertTokensOnDevice = 64;
  int32_t fused_expert_tokens_ = 1;
  bool has_moe_ = false;
  ModelConfig whole_;  // the unsharded model's (cfg_ is the rank's)
  HybridOptions opts_;
  Communicator* tp_ = nullptr;
  bool expert_parallel_ = false;  // whole experts, a share of them per rank
  Share heads_, kv_heads_, key_heads_, value_heads_;
  std::string prefix_;
  EmbeddingAndHead head_;
  Tensor final_norm_;
  std::vector<Layer> layers_;
  MtpWeights mtp_;
  std::vector<Tensor> kept_;  // per DeltaNet layer: the last forward's kept rows of its projection
  ops::RopeTables rope_;
  Tensor mrope_axes_;  // RopeTables::axes of its multimodal RoPE (undefined: none)
};

}  // namespace revolta::hybrid
