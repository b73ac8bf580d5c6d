// DFlash and DFlash2 block drafts (the `dflash` package's DFlashDraftModel / DFlash2DraftModel).
// The draft reads hidden states tapped from several target layers (target_layer_ids), fuses them
// (fc, then RMSNorm) into one context row per target token, and proposes a whole block in one
// forward: the block's rows are the target's embeddings of [anchor, mask, ..., mask] (the anchor
// is the last token the target produced), passed through Qwen3-style layers whose attention reads
// the context rows' keys and values and the block's own, bidirectionally. The last layer's rows,
// normalised, go through the target's LM head; row i proposes the token at anchor position + i.
//
// DFlash2 adds, around each layer's attention and MLP, a grouped dynamic causal conv along the
// block (ops::dynamic_conv: a static kernel per channel plus one per channel group that each row
// projects from its own input), and a candidate selector that walks one path through each
// position's top-k tokens, scoring each candidate by its logit plus a low-rank predecessor x
// successor term that the row's hidden state weights.
//
// Keys and values live in a paged KV cache (one cache layer per draft layer, the slots of the
// positions they belong to): a context row writes its position's, a block row writes scratch that
// the block's attention reads and the next context rows overwrite. Attention is the causal paged
// op with each block row its own sequence ending at the block's last position, which makes it see
// every context row and the whole block.
#pragma once

#include <string>
#include <vector>

#include "cache/kv_cache.h"
#include "model/model_config.h"
#include "model/weights.h"
#include "ops/ops.h"

namespace revolta {

struct DFlashConfig {
  ModelConfig layers;  // the draft's own decoder shapes (a Qwen3 config)
  std::vector<int32_t> target_layer_ids;  // tapped after target layer id (HF hidden_states[id + 1])
  int32_t block_size = 16;
  int32_t mask_token_id = -1;
  float input_embedding_scale = 1.0f, output_multiplier = 1.0f, logit_softcap = 0.0f;
  int32_t conv_kernel_size = 0, conv_group_size = 0;  // DFlash2's convs (0: DFlash)
  int32_t selector_rank = 0, selector_top_k = 0;      // DFlash2's selector
  bool dflash2() const { return conv_kernel_size > 0; }
  // The `dflash` package's config.json (a Qwen3 config with a dflash_config block). Throws naming
  // the field that is missing or unsupported.
  static DFlashConfig from_dir(const std::string& dir);
};

// One draft forward over a batch of blocks. Rows of the context (new target rows since the
// request's last draft) and of the blocks, each with its position and cache slot.
struct DFlashInputs {
  Tensor context;                         // f32 [C, targets * hidden]: the tapped target hidden states
  Tensor context_positions, context_slots;  // int32 [C]
  Tensor noise;                           // f32 [R, hidden]: the blocks' rows, embedded (and scaled)
  Tensor block_positions, block_slots;    // int32 [R]
  Tensor first_row;                       // int32 [R]: the first row of each row's block (DFlash2's convs)
  ops::AttentionBatch attention;          // one sequence per block row (see the file comment)
};

// The candidate selector's pick at each position of one block.
struct DFlashPath {
  std::vector<int32_t> tokens;               // [positions]
  std::vector<std::vector<int32_t>> candidates;  // per position, its top-k tokens
  std::vector<std::vector<float>> q;         // per position, the pick's distribution over candidates (temperature > 0)
};

class DFlashDraft {
 public:
  DFlashDraft(const WeightLoader& w, const DFlashConfig& c, int32_t max_positions, DType dt, Device device);
  const DFlashConfig& config() const { return cfg_; }
  int32_t num_layers() const { return int32_t(layers_.size()); }
  // The blocks' final hidden states f32 [R, hidden]; writes K/V of every row into cache layers
  // [first_layer, first_layer + num_layers()).
  Tensor forward(const DFlashInputs& in, KvCache& kv, int32_t first_layer);
  // Logits of hidden rows through the target's LM head (output_multiplier, softcap applied).
  Tensor logits(const Tensor& hidden, const Tensor& lm_head) const;
  // DFlash2: the selector's path for one block's rows (hidden, logits [n, *] on the host) after
  // `anchor`; temperature 0 takes each position's best, else draws with uniforms[i].
  DFlashPath select(const Tensor& hidden, const Tensor& logits, int32_t anchor, float temperature,
                    const std::vector<float>& uniforms) const;

 private:
  struct Conv {
    Tensor base, projection;  // base [2, K, hidden] as two [K, hidden]; projection [2 * K * groups, hidden]
  };
  struct Layer {
    Tensor input_norm, post_norm, qkv, o, q_norm, k_norm, gate_up, down;
    Conv attn_conv, mlp_conv;
  };
  Conv load_conv(const WeightLoader& w, const std::string& p);
  // x' = conv_part(x): part 0 before the block (prepare), 1 after it (finish), dynamic from prepare's input.
  Tensor convolve(const Conv& conv, int part, const Tensor& x, const Tensor& dynamic, const Tensor& first_row) const;

  DFlashConfig cfg_;
  DType dtype_;
  Device device_;
  std::vector<Layer> layers_;
  Tensor fc_, hidden_norm_, norm_;
  Tensor predecessor_, successor_, selector_projection_;  // DFlash2's selector, on the host
  ops::RopeTables rope_;
};

}  // namespace revolta
