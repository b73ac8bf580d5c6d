// The dense pre-norm decoder shared by Llama-family architectures: RMSNorm -> GQA attention with
// RoPE -> residual -> RMSNorm -> SwiGLU MLP -> residual. Architectures differ only in options.
#pragma once

#include <memory>

#include "model/model.h"
#include "model/weights.h"

namespace revolta {

struct DenseDecoderOptions {
  bool qk_norm = false;  // Qwen3: RMSNorm over each head of q and k before RoPE
};

std::unique_ptr<CausalLM> make_dense_decoder(const WeightLoader& weights, const ModelConfig& config,
                                             DType weight_dtype, const DenseDecoderOptions& opts);

}  // namespace revolta
