// The model interface the runner drives. Forward code sees tokens, positions and cache slots; it
// knows nothing about requests or scheduling.
#pragma once

#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "cache/cache_spec.h"
#include "dist/communicator.h"
#include "model/model_config.h"
#include "ops/ops.h"

namespace revolta {

struct ForwardBatch {
  Tensor token_ids;     // int32 [T]
  Tensor positions;     // int32 [T]
  Tensor slot_mapping;  // int32 [T]
  ops::AttentionBatch attention;
  std::vector<int32_t> logits_rows;  // token rows whose next-token logits are wanted
  Tensor logits_row_ids;             // the same rows, int32 on the model's device
  std::vector<int32_t> hidden_rows;  // token rows whose final hidden states are wanted (drafters)
  Tensor hidden_row_ids;             // the same rows, int32 on the model's device
  Tensor seq_starts;                 // int32 [S + 1] query starts, on the model's device
  Tensor seq_state_slots;            // int32 [S] state slots, on the model's device
  // Rows whose recurrent-layer inputs the forward keeps for replay_states (the rows of sequences
  // that verify drafts), int32 on the model's device; empty: none kept.
  Tensor kept_rows;
  // Multimodal prompts: token rows (int32 [M]) whose input is a media embedding (f32 [M, hidden])
  // instead of their token's, and when the step holds media positions, every row's multimodal
  // rotary positions (int32 [T, 3]: time, height, width), which then replace `positions` for RoPE.
  // All on the model's device; empty: none.
  Tensor media_rows, media_embeds, mrope_positions;
};

struct ForwardOutput {
  Tensor logits;  // f32 [logits_rows, vocab]
  Tensor hidden;  // f32 [hidden_rows, hidden_size], after the final norm (what the LM head reads); empty when none asked
};

struct ModelCaches {
  KvCache* kv = nullptr;
  StateCache* state = nullptr;  // null for models without recurrent layers
};

class CausalLM {
 public:
  virtual ~CausalLM() = default;
  virtual const ModelConfig& config() const = 0;
  // What its layers need cached (cache/cache_spec.h), as cache_specs_for(config()) says.
  virtual CacheSpecs cache_specs() const = 0;
  virtual int64_t weight_bytes() const = 0;
  virtual DType weight_dtype() const = 0;
  virtual Device device() const = 0;  // where its weights live and its forward runs
  // Moves the weights to `device` (models whose loading happens on the host first).
  virtual void place(Device device) = 0;
  // Writes the batch's K/V (and recurrent states) into the caches and returns the logits of the
  // batch's logits rows and the final hidden states of its hidden rows.
  virtual ForwardOutput forward(const ForwardBatch& batch, ModelCaches& caches) = 0;
  // Multi-token prediction, the checkpoint's own drafter: how many MTP layers it carries (0: none).
  virtual int32_t num_mtp_layers() const { return 0; }
  // MTP layer `layer` over a batch whose row i holds the token that follows row i's position and
  // hidden row i (f32 [T, hidden]: the target's final hidden state there, or the previous MTP
  // step's output). Writes that layer's K/V (attention cache layer: attention layers + layer) and
  // returns the logits of the logits rows and the MTP's final hidden states of the hidden rows.
  virtual ForwardOutput mtp_forward(const ForwardBatch& batch, const Tensor& hidden, int32_t layer, ModelCaches& caches);
  // Recurrent models under speculative decoding: re-runs only the recurrent layers' state updates
  // (conv and delta rule, no projection) over rows of the last forward's kept rows (`rows` index
  // them), grouped into sequences by seq_starts (int32 [S + 1]), on the states of seq_slots (int32
  // [S]), which the caller has set to the states before that forward. So a rejected draft's state
  // is rolled back to the last kept token without a second pass through the model.
  virtual void replay_states(const Tensor& rows, const Tensor& seq_starts, const Tensor& seq_slots, ModelCaches& caches);
  // The kept inputs themselves (null: none), so that a recorded graph's buffers can be made the
  // current ones after it replays.
  virtual std::vector<Tensor>* kept_inputs() { return nullptr; }
  // The checkpoint's per-layer KV-cache scales (an FP8 cache's k_scale / v_scale), by attention
  // cache layer; {0, 0} for a layer it has none for, empty when it has none at all.
  virtual std::vector<std::pair<float, float>> kv_scales() const { return {}; }
  // The largest decode batch whose forward stays on the device (no host round trip), so that a
  // graph can record it.
  virtual int32_t max_captured_batch() const { return 1 << 30; }
  // Whether its forward reads ForwardBatch's media rows and multimodal positions.
  virtual bool takes_media() const { return false; }
  // Whether a verify step (several tokens a sequence, rows kept for replay_states) may be recorded.
  virtual bool captures_verify_steps() const { return true; }
};

// An E4M3 cache's per-layer scales (the checkpoint's, CausalLM::kv_scales, or measured ones; other
// caches: nothing to do). Returns how many of its layers `scales` has none for (those keep 1.0).
int32_t set_kv_scales(const std::vector<std::pair<float, float>>& scales, KvCache& cache);

// Reads config.json, picks the architecture and loads its weights converted to weight_dtype onto
// the device (made-up values when dummy; from the GGUF file gguf_weights.json names, quantized
// matrices kept in their blocks, when gguf). Throws naming the unsupported architecture or the
// missing tensor.
// With tp (a tensor-parallel group of more than one rank) the model is rank tp->rank()'s shard
// (its config() is rank_config's).
std::unique_ptr<CausalLM> load_model(const std::string& dir, const ModelConfig& config, DType weight_dtype,
                                     Device device = Device::kCPU, bool dummy = false, bool gguf = false,
                                     Communicator* tp = nullptr, bool expert_parallel = false);
// A tensor-parallel rank's config: its share of the attention, KV and DeltaNet heads and of every
// MLP's and expert's intermediates (a KV head is replicated on world / KV heads ranks when there are
// fewer than ranks). Throws std::invalid_argument naming tensor_parallel_size when a count does not
// split over `world` ranks. expert_parallel: each rank holds whole experts (their intermediates
// stay whole; the experts must split over the ranks).
ModelConfig rank_config(const ModelConfig& config, int world, bool expert_parallel = false);
// Throws std::invalid_argument naming the config field when a shape is beyond the device's kernels.
void check_device_limits(const ModelConfig& config, Device device);
std::vector<std::string> supported_architectures();
// Throws std::invalid_argument naming the architecture when no file implements it.
void check_architecture(const ModelConfig& config, const std::string& dir);
// What speculative decoding adds to a model's caches: the MTP layers' K/V (run as drafters), and a
// second recurrent-state slot per request, which holds its state before a verify step for rollback.
struct SpeculativeCacheNeeds {
  int32_t mtp_layers = 0;
  bool rollback_states = false;
};
// The cache groups a model of this config declares, known before any weight is read: paged KV of
// its attention layers (float32; the engine picks the element type), recurrent state of its
// Gated DeltaNet layers, and what speculative decoding adds to them.
CacheSpecs cache_specs_for(const ModelConfig& config, const SpeculativeCacheNeeds& speculative = {});

}  // namespace revolta
