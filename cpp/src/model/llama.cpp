// LlamaForCausalLM: the plain dense decoder.
#include "model/architectures.h"
#include "model/dense_decoder.h"

namespace revolta {

std::unique_ptr<CausalLM> make_llama(const WeightLoader& w, const ModelConfig& c, DType dt) {
  return make_dense_decoder(w, c, dt, DenseDecoderOptions{});
}

}  // namespace revolta
