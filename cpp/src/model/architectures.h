// One factory per architecture file; registry.cpp maps HF architecture names onto them.
#pragma once

#include <memory>

#include "model/model.h"
#include "model/weights.h"

namespace revolta {

std::unique_ptr<CausalLM> make_llama(const WeightLoader& w, const ModelConfig& c, DType dt);
std::unique_ptr<CausalLM> make_qwen3(const WeightLoader& w, const ModelConfig& c, DType dt);
std::unique_ptr<CausalLM> make_qwen3_moe(const WeightLoader& w, const ModelConfig& c, DType dt);
std::unique_ptr<CausalLM> make_qwen3_next(const WeightLoader& w, const ModelConfig& c, DType dt);
std::unique_ptr<CausalLM> make_qwen3_5(const WeightLoader& w, const ModelConfig& c, DType dt);
std::unique_ptr<CausalLM> make_flash_next(const WeightLoader& w, const ModelConfig& c, DType dt);

}  // namespace revolta
