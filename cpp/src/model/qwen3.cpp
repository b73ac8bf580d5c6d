// Qwen3ForCausalLM: the Llama decoder plus a per-head RMSNorm on q and k before RoPE.
#include "model/architectures.h"
#include "model/dense_decoder.h"

namespace revolta {

std::unique_ptr<CausalLM> make_qwen3(const WeightLoader& w, const ModelConfig& c, DType dt) {
  DenseDecoderOptions opts;
  opts.qk_norm = true;
  return make_dense_decoder(w, c, dt, opts);
}

}  // namespace revolta
