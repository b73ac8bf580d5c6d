// Pieces every decoder architecture shares: the token embedding with its (possibly tied) output
// head, and the final projection of the rows that sample.
#pragma once

#include <string>
#include <vector>

#include "model/model.h"
#include "model/model_config.h"
#include "model/weights.h"

namespace revolta {

struct EmbeddingAndHead {
  Tensor embed, lm_head;  // lm_head shares embed's memory when the embeddings are tied
  // Vocabulary-parallel: a tensor-parallel rank's rows [first_id, first_id + rows) of both, and the
  // group whose ranks hold the others; null: the whole vocabulary.
  Communicator* tp = nullptr;
  int64_t first_id = 0;
  int64_t nbytes() const;
};

// A tensor-parallel rank's part of `whole` units (heads, channels, intermediates): [first, first +
// count), count being rank_config's; the rows or columns of a tensor holding `unit` of them each.
struct Share {
  int64_t first = 0, count = 0;
  Slice rows(int64_t unit) const { return Slice::rows(first * unit, (first + count) * unit); }
  Slice cols(int64_t unit) const { return Slice::cols(first * unit, (first + count) * unit); }
};
Share share_of(int64_t whole, int64_t count, const Communicator* tp);

// Loads `<prefix>embed_tokens.weight` and `lm_head.weight` (or ties them); names the missing one.
// Under tensor parallelism (the loader's group) each rank loads its part of the vocabulary when the
// vocabulary splits evenly, else the whole.
EmbeddingAndHead load_embedding_and_head(const WeightLoader& w, const std::string& prefix, const ModelConfig& c,
                                         DType dt);

// The bookkeeping part of CausalLM that every decoder shares.
class DecoderBase : public CausalLM {
 public:
  DecoderBase(const ModelConfig& c, DType dt, Device device = Device::kCPU) : cfg_(c), dtype_(dt), device_(device) {}
  const ModelConfig& config() const override { return cfg_; }
  CacheSpecs cache_specs() const override { return cache_specs_for(cfg_); }
  int64_t weight_bytes() const override { return bytes_; }
  DType weight_dtype() const override { return dtype_; }
  Device device() const override { return device_; }
  void place(Device device) override;
  std::vector<std::pair<float, float>> kv_scales() const override { return kv_scales_; }

 protected:
  // The checkpoint's KV-cache scales of the attention at `prefix` (prefix + "k_scale" / "v_scale",
  // or one "kv_scale" for both, per-tensor scalars) as cache layer `layer`'s, when it has them.
  void load_kv_scales(const WeightLoader& w, const std::string& prefix, int32_t layer);
  std::vector<std::pair<float, float>> kv_scales_;
  ModelConfig cfg_;
  DType dtype_;
  Device device_;
  int64_t bytes_ = 0;
};

// The forward's outputs from the final hidden states x [T, hidden]: logits of the batch's logits
// rows (when they are every row in order, as in decode steps and so every decode graph, x goes to
// the LM head as it is) and the hidden states of its hidden rows.
ForwardOutput final_outputs(const Tensor& x, const ForwardBatch& batch, const Tensor& lm_head);
// The same through a vocabulary-parallel head: each rank's logits columns, gathered in vocabulary order.
ForwardOutput final_outputs(const Tensor& x, const ForwardBatch& batch, const EmbeddingAndHead& head);

// The token lookup into out (f32 [T, hidden]) and its first input norm into norm.normed (fused
// where the head is whole; a sharded one sums the ranks' lookups first).
void embed_tokens(const EmbeddingAndHead& head, const Tensor& ids, Tensor& out, const ops::NormInto& norm);

// Multimodal prompts (ForwardBatch::media_rows): the media rows' embeddings (the first H columns of
// media_embeds) replace their tokens' in residual [T, H], and norm.normed is made again.
void place_media(const ForwardBatch& b, Tensor& residual, const ops::NormInto& norm);
// Deepstack (Qwen3-VL): after decoder layer `layer` the media rows' residual takes that layer's
// vision features (media_embeds columns [(1 + layer) H, (2 + layer) H), while there are any), and
// norm.normed is made again. Returns whether it added any.
bool add_deepstack(const ForwardBatch& b, int64_t layer, Tensor& residual, const ops::NormInto& norm);

// Multimodal RoPE: the config's per-frequency axes (int32 on the host; undefined: none), and the
// tables and positions a batch ropes with (its media positions when it has them).
Tensor mrope_axes_tensor(const ModelConfig& c, int32_t rotary_dim);
struct RopeInputs {
  const Tensor& positions;
  ops::RopeTables tables;
};
RopeInputs rope_inputs(const ForwardBatch& b, const ops::RopeTables& rope, const Tensor& axes, const std::string& arch);

}  // namespace revolta
