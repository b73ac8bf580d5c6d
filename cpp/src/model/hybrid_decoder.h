// The Qwen3 MoE / hybrid decoder (see hybrid_decoder.cpp); architectures differ only in options.
#pragma once

#include <memory>

#include "model/model.h"
#include "model/weights.h"

namespace revolta {

struct HybridOptions {
  bool gated_attention = false;  // q_proj also yields a per-head sigmoid output gate
  bool one_plus_norm = false;    // RMSNorm weights are stored as offsets from 1
  bool hyper_connections = false;  // no per-layer or final norms: an extension (Flash-Next) mixes the streams
};

std::unique_ptr<CausalLM> make_hybrid_decoder(const WeightLoader& w, const ModelConfig& c, DType dt,
                                              const HybridOptions& o);

}  // namespace revolta
