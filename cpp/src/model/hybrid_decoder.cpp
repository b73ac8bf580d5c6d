// Factories of the hybrid decoder's architectures (the class: hybrid_decoder_lm.h).
#include "model/hybrid_decoder_lm.h"

namespace revolta {

using hybrid::HybridDecoderLM;

std::unique_ptr<CausalLM> make_hybrid_decoder(const WeightLoader& w, const ModelConfig& c, DType dt,
                                              const HybridOptions& o) {
  return std::make_unique<HybridDecoderLM>(w, c, dt, o);
}

std::unique_ptr<CausalLM> make_qwen3_moe(const WeightLoader& w, const ModelConfig& c, DType dt) {
  return make_hybrid_decoder(w, c, dt, HybridOptions{});
}

std::unique_ptr<CausalLM> make_qwen3_next(const WeightLoader& w, const ModelConfig& c, DType dt) {
  return make_hybrid_decoder(w, c, dt, HybridOptions{/*gated_attention=*/true, /*one_plus_norm=*/true});
}

std::unique_ptr<CausalLM> make_qwen3_5(const WeightLoader& w, const ModelConfig& c, DType dt) {
  return make_hybrid_decoder(w, c, dt, HybridOptions{/*gated_attention=*/true, /*one_plus_norm=*/true});
}

}  // namespace revolta
