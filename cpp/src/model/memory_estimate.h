// Sizes known from the config alone, so a GPU config that cannot fit fails before any weight is
// read. Model knowledge (which architectures gate their attention), so it lives in model/.
#pragma once

#include <cstdint>

#include "model/model_config.h"
#include "revolta/engine.h"

namespace revolta {

// Bytes of the weights at `bytes_per_element` (norms, router and biases counted as float32), for
// dense, MoE and hybrid (Gated DeltaNet) layers.
int64_t estimate_weight_bytes(const ModelConfig& c, size_t bytes_per_element);
// Peak bytes of one forward's activations (max_num_batched_tokens rows, logits of max_num_seqs
// rows), doubled: the decode graphs share one such forward's memory (their largest batch is at most
// max_num_seqs rows), and the allocator rounds.
int64_t estimate_activation_bytes(const ModelConfig& c, const EngineConfig& e);

}  // namespace revolta
