#include "engine/plan.h"

#include <algorithm>

#include "core/error.h"
#include "model/memory_estimate.h"
#include "ops/ops.h"
#include "quant/formats.h"

namespace revolta {
namespace {

}  // namespace

std::vector<int32_t> graph_batch_sizes(const EngineConfig& cfg) {
  std::vector<int32_t> sizes;
  if (cfg.cuda_graph_batch_sizes.empty()) {
    for (int32_t b = 1; b <= 512; b = b < 8 ? (b == 4 ? 8 : 2 * b) : b + (b < 256 ? 8 : 16)) sizes.push_back(b);
    if (cfg.max_num_seqs <= 1024) sizes.push_back(cfg.max_num_seqs);
  } else {
    sizes = cfg.cuda_graph_batch_sizes;
  }
  std::vector<int32_t> kept;
  for (int32_t b : sizes)
    if (b <= cfg.max_num_seqs && std::find(kept.begin(), kept.end(), b) == kept.end()) kept.push_back(b);
  return kept;
}

namespace {

// The KV cache's element type: auto is float32 on the CPU and float16 on CUDA.
DType kv_cache_dtype_of(const std::string& name, Device device) {
  if (name == "fp8" || name == "fp8_e4m3") return DType::kF8E4M3;
  if (name == "int8") return DType::kI8;
  if (name == "float16" || name == "fp16" || (name == "auto" && device == Device::kCUDA)) return DType::kF16;
  return DType::kF32;
}

std::string quantization_label(const EngineConfig& cfg, const WeightQuantization& q) {
  if (cfg.load_format == "gguf") return str_cat("gguf blocks, ", cfg.block_activation_bits, "-bit activations");
  return q.method.empty() ? "" : weight_format_label(q.method, q.group_size);
}

}  // namespace

EnginePlan plan_engine(const EngineConfig& config, const ModelConfig& model_config, const DeviceMemory& memory,
                       int hardware_threads) {
  EnginePlan p;
  p.cfg = config;
  p.model = model_config;
  EngineConfig& cfg = p.cfg;
  ModelConfig& mc = p.model;
  if (cfg.quantization != "auto" && mc.quantization.method != cfg.quantization) {
    RV_CHECK_ARG(cfg.load_format == "dummy", "quantization '", cfg.quantization, "': ", cfg.model, " has no ",
                 cfg.quantization, " quantization_config in its config.json (",
                 cfg.quantization == "awq" ? "make one with `revolta quantize --awq`, or " : "",
                 "use load_format dummy for made-up weights)");
    mc.quantization = {cfg.quantization, weight_format(cfg.quantization, "quantization").default_group};
  }
  p.device = cfg.device == "cuda" ? Device::kCUDA : Device::kCPU;
  if (!mc.quantization.method.empty()) {
    const DType blocks = weight_format(mc.quantization.method, "quantization").blocks(mc.quantization.group_size);
    RV_CHECK_ARG(ops::supports_op(p.device, ops::Op::kLinear, ops::OpShape{blocks, 0, 0}), "quantization '",
                 mc.quantization.method, "': device '", cfg.device, "' has no linear kernel for ", dtype_name(blocks),
                 " weights");
  }
  if (cfg.max_model_len == 0) cfg.max_model_len = mc.max_position_embeddings;
  RV_CHECK_ARG(cfg.max_model_len <= mc.max_position_embeddings, "max_model_len (", cfg.max_model_len,
               ") exceeds the model's max_position_embeddings (", mc.max_position_embeddings, ")");
  mc.max_positions = std::max(mc.max_position_embeddings, cfg.max_model_len);
  check_device_limits(mc, p.device);

  p.weight_dtype = cfg.dtype;
  if (p.weight_dtype == "auto") {
    p.weight_dtype = mc.torch_dtype;
    if (p.weight_dtype != "float16" && p.weight_dtype != "bfloat16") p.weight_dtype = "float32";
    if (p.device == Device::kCUDA) p.weight_dtype = "float16";  // bf16 checkpoints are converted with a range check
  }

  // The model declares its cache groups (with what speculation adds); the engine picks the KV
  // element type and the budget, cache/ splits it. Each rank caches its own KV heads and DeltaNet
  // states in blocks of the same numbering: the budget is a rank's.
  p.world = cfg.tensor_parallel_size;
  p.expert_parallel = p.world > 1 && cfg.enable_expert_parallel;
  p.speculative = !cfg.speculative_method.empty();
  p.mtp = cfg.speculative_method == "mtp";
  RV_CHECK_ARG(!p.mtp || mc.num_mtp_layers > 0, "speculative_config: method 'mtp' needs multi-token-prediction ",
               "layers, and ", cfg.model, "/config.json names none (mtp_num_hidden_layers); use 'ngram'");
  const DType kv_dtype = kv_cache_dtype_of(cfg.kv_cache_dtype, p.device);
  RV_CHECK_ARG(ops::supports_op(p.device, ops::Op::kQkvRopeAttention, ops::OpShape{kv_dtype, 0, 0}), "kv_cache_dtype '",
               cfg.kv_cache_dtype, "': device '", cfg.device, "' has no attention kernels for a ", dtype_name(kv_dtype),
               " KV cache yet (use auto or float16)");
  mc.flash.ple_on_disk = cfg.ple_offload == "disk";
  p.groups = cache_specs_for(rank_config(mc, p.world, p.expert_parallel),
                             SpeculativeCacheNeeds{p.mtp ? mc.num_mtp_layers : 0, p.speculative});
  for (CacheGroupSpec& g : p.groups)
    if (g.kind == CacheGroupSpec::Kind::kPagedKv) g.kv.dtype = kv_dtype;
  p.limits = CacheLimits{cfg.block_size, cfg.max_num_seqs, cfg.max_model_len, cfg.enable_prefix_caching};

  // On CUDA with gpu_memory_utilization the budget is what the weights and activations leave
  // under it, checked from the config before any weight is read (a rank's GPU is measured as
  // rank 0's: the ranks' GPUs are taken to be alike).
  p.by_utilization = p.device == Device::kCUDA && cfg.gpu_memory_utilization > 0.0f;
  int64_t budget = cfg.kv_cache_memory_bytes;
  if (p.by_utilization) {
    p.activation_bytes = estimate_activation_bytes(mc, cfg);
    ModelConfig share = rank_config(mc, p.world, p.expert_parallel);
    if (p.expert_parallel) share.num_experts /= p.world;  // (a rank's experts; the router is whole, a rounding error here)
    const int64_t weights = estimate_weight_bytes(share, dtype_size(parse_dtype(p.weight_dtype)));
    budget = int64_t(double(memory.total) * cfg.gpu_memory_utilization) - (memory.total - memory.free) - weights -
             p.activation_bytes;
    const int64_t need = plan_shape(p.groups, p.limits).min_bytes();
    RV_CHECK_ARG(budget >= need, "gpu_memory_utilization (", cfg.gpu_memory_utilization, ") of ", memory.total >> 20,
                 " MiB (", memory.free >> 20, " MiB free) leaves ", std::max<int64_t>(0, budget) >> 20,
                 " MiB for the KV cache after ", weights >> 20, " MiB of weights and ", p.activation_bytes >> 20,
                 " MiB of activations; one request of max_model_len (", cfg.max_model_len, ") needs ", need >> 20,
                 " MiB: raise gpu_memory_utilization or lower max_model_len / max_num_seqs");
  }
  p.caches = plan_caches(p.groups, p.limits, budget, p.by_utilization ? "gpu_memory_utilization" : "kv_cache_memory_bytes");

  p.threads = cfg.num_threads > 0 ? cfg.num_threads : std::max(1, hardware_threads);
  p.runner.max_model_len = cfg.max_model_len;
  if (p.mtp) p.runner.hidden = HiddenRows::kEvery;  // the MTP layer reads the hidden state of every computed position
  if (p.device == Device::kCUDA && !cfg.enforce_eager) p.runner.graph_batch_sizes = graph_batch_sizes(cfg);
  p.runner.keep_verify_rows = p.speculative && !p.caches.state.empty();  // rollback by replaying the recurrences
  // A step queued ahead is one token of each request: it cannot carry drafts.
  p.async_scheduling =
      !p.speculative && (cfg.async_scheduling == "on" || (cfg.async_scheduling == "auto" && p.device != Device::kCPU));
  p.quantization = quantization_label(cfg, mc.quantization);
  return p;
}

int64_t cache_budget_after_load(const EnginePlan& plan, const DeviceMemory& measured) {
  return int64_t(double(measured.total) * plan.cfg.gpu_memory_utilization) - (measured.total - measured.free) -
         plan.activation_bytes;
}

}  // namespace revolta
