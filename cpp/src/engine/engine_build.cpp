// Construction and sleep: the engine becomes what plan_engine decided (models loaded, then the
// serving parts); sleep frees the serving parts (level 2 the models too), wake_up builds them again
// with the same code.
#include <cstdio>
#include <filesystem>
#include <thread>
#if defined(__GLIBC__)  // (defined by the headers above)
#include <malloc.h>
#endif

#include "core/error.h"
#include "engine/engine_impl.h"
#include "engine/kv_calibration.h"
#include "engine/kv_offload.h"
#include "engine/plan.h"

namespace revolta {
namespace fs = std::filesystem;

namespace {

DeviceMemory measure_memory(Device device) {
  size_t free_b = 0, total_b = 0;
  device_runtime(device).memory_info(&free_b, &total_b);
  return {int64_t(total_b), int64_t(free_b)};
}

}  // namespace

Engine::Impl::Impl(const EngineConfig& c) : cfg(c), seed_source(c.seed) {
  cfg.validate();
  RV_CHECK_ARG(fs::is_directory(cfg.model), "model: '", cfg.model, "' is not a directory");
  const std::string cfg_path = (fs::path(cfg.model) / "config.json").string();
  RV_CHECK_ARG(fs::exists(cfg_path), "model: no config.json in '", cfg.model, "'");
  const ModelConfig read = ModelConfig::from_file(cfg_path);
  check_architecture(read, cfg.model);
  DeviceMemory memory;
  if (cfg.device == "cuda" && cfg.gpu_memory_utilization > 0.0f) memory = measure_memory(Device::kCUDA);
  EnginePlan p = plan_engine(cfg, read, memory, int(std::thread::hardware_concurrency()));
  cfg = p.cfg;
  model_cfg = p.model;
  RV_CHECK_ARG(p.world == 1 || p.device == Device::kCPU || has_gpu_communicators(), "tensor_parallel_size ", p.world,
               " on device 'cuda' needs NCCL, which this build did not find (install nvidia-nccl-cu12 or -cu13, or ",
               "set NCCL_ROOT, and rebuild)");
  dev = p.device, weight_dtype = p.weight_dtype, world = p.world, ep = p.expert_parallel, threads = p.threads;
  speculative = p.speculative, mtp = p.mtp;
  ropts = p.runner;
  load_models();
  info.quantization = p.quantization;
  RV_CHECK_ARG(!mtp || model->num_mtp_layers() == model_cfg.num_mtp_layers, "speculative_config: method 'mtp' needs ",
               "the checkpoint's multi-token-prediction layers, and ", cfg.model, " (", model_cfg.architecture,
               ") carries ", model->num_mtp_layers(), " of the ", model_cfg.num_mtp_layers,
               " its config names (no mtp.* tensors); use 'ngram'");
  if (speculative) make_speculation();
  CachePlan plan = p.caches;
  if (p.by_utilization) {  // what the weights really left
    const DeviceMemory after = measure_memory(dev);
    const int64_t budget = cache_budget_after_load(p, after);
    plan.shrink_to(budget);
    std::fprintf(stderr, "revolta: device memory %lld MiB, %lld MiB in use after loading %lld MiB of weights; %lld MiB "
                 "kept for activations, %lld MiB for the caches (gpu_memory_utilization %.2f)\n",
                 (long long)(after.total >> 20), (long long)((after.total - after.free) >> 20),
                 (long long)(model->weight_bytes() >> 20), (long long)(p.activation_bytes >> 20),
                 (long long)(std::max<int64_t>(0, budget) >> 20), double(cfg.gpu_memory_utilization));
  }
  kv_scales = model->kv_scales();
  if (cfg.calculate_kv_scales) {  // under TP each rank measures its KV heads; a layer takes the largest
    auto calibrate = [&](CausalLM& m) {
      return calibrate_kv_scales(m, p.groups, cfg.calibration_prompts, cfg.block_size, cfg.max_model_len);
    };
    if (!tp) {
      kv_scales = calibrate(*model);
    } else {
      auto ranks = std::vector<std::vector<std::pair<float, float>>>(size_t(world));
      tp->on_models([&](CausalLM& m, int rank) { ranks[size_t(rank)] = calibrate(m); }, *model);
      kv_scales = ranks[0];
      for (const auto& r : ranks)
        for (size_t l = 0; l < r.size(); ++l)
          kv_scales[l] = {std::max(kv_scales[l].first, r[l].first), std::max(kv_scales[l].second, r[l].second)};
    }
  }
  cache_plan = std::make_unique<CachePlan>(plan);
  cache_limits = std::make_unique<CacheLimits>(p.limits);
  if (const int32_t missing = build_serving(); missing > 0)
    info.warnings.push_back(str_cat("kv_cache_dtype ", cfg.kv_cache_dtype, ": ", cfg.model, " carries no k_scale / v_scale for ",
                                    missing, " of its ", serving->caches->kv().quant.size(),
                                    " attention layers; they scale by 1.0 (values past 448 saturate)"));
  async_scheduling = p.async_scheduling;
  if (tp) tp->keep_greedy_ids(async_scheduling);
  live.spec_accepted_per_position.assign(size_t(speculative ? cfg.num_speculative_tokens : 0), 0);
  pool = std::make_unique<ThreadPool>(std::max(1, threads / world));

  info.architecture = model_cfg.architecture;
  info.vocab_size = model_cfg.vocab_size;
  info.max_model_len = cfg.max_model_len;
  info.num_layers = model_cfg.num_layers;
  info.hidden_size = model_cfg.hidden_size;
  info.eos_token_ids = model_cfg.eos_token_ids;
  info.weight_dtype = dtype_name(model->weight_dtype());
  info.weight_bytes = model->weight_bytes() + (tp ? tp->worker_weight_bytes() : 0);  // every rank's
  info.kv_cache_bytes = serving->caches->nbytes() * world;  // every rank holds the same blocks
  info.tensor_parallel_size = world;
  info.device = dev == Device::kCPU ? "cpu" : device_runtime(dev).name();
  info.kv_cache_dtype = dtype_name(plan.kv.dtype);
  info.kv_cache_tokens = plan.num_blocks * cfg.block_size;
  info.cuda_graph_batch_sizes = serving->runner->recorded_batch_sizes();
  info.cuda_graph_bytes = serving->runner->graph_memory_bytes();
  info.takes_media = vision != nullptr;
  live.num_blocks_total = plan.num_blocks;
  live.num_blocks_free = plan.num_blocks;
  publish_stats();
}

void Engine::Impl::load_models() {
  auto load = [&](Communicator* comm) {
    return load_model(cfg.model, model_cfg, parse_dtype(weight_dtype), dev, cfg.load_format == "dummy",
                      cfg.load_format == "gguf", comm, ep);
  };
  if (world > 1) tp = std::make_unique<TensorParallelRanks>(world, dev, load, threads / world, cfg.block_activation_bits);
  model = load(tp ? tp->rank0() : nullptr);
  if (model_cfg.vision.depth > 0 && !vision) {
    if (cfg.language_model_only) {
      std::fprintf(stderr, "revolta: the checkpoint's vision tower is not loaded (language_model_only)\n");
    } else if (model->takes_media() && cfg.load_format != "gguf") {
      vision = std::make_unique<VisionEncoder>(WeightLoader(cfg.model, dev, cfg.load_format == "dummy"), model_cfg.vision,
                                               parse_dtype(weight_dtype), dev);
      encoder_cache = std::make_unique<EncoderCache>(int64_t(double(cfg.mm_encoder_cache_gb) * double(int64_t(1) << 30)));
      std::fprintf(stderr, "revolta: vision tower of %d blocks, %lld MiB (images and video)\n", model_cfg.vision.depth,
                   (long long)(vision->weight_bytes() >> 20));
    } else {
      std::fprintf(stderr, "revolta: the checkpoint's vision tower is not loaded (%s takes text only here)\n",
                   model_cfg.architecture.c_str());
    }
  }
}

int32_t Engine::Impl::build_serving() {
  ServingSpec spec;
  spec.cfg = &cfg, spec.plan = cache_plan.get(), spec.limits = cache_limits.get(), spec.runner = &ropts;
  spec.kv_scales = &kv_scales, spec.device = dev, spec.world = world;
  spec.kv_fingerprint = kv_fingerprint(cfg, model_cfg, weight_dtype, dtype_name(cache_plan->kv.dtype), kv_scales);
  serving = std::make_unique<Serving>(spec, *model, tp.get());
  if (vision)
    serving->scheduler->set_encoder(encoder_cache.get(), cfg.max_num_encoder_input_tokens > 0
                                                             ? cfg.max_num_encoder_input_tokens
                                                             : cfg.max_num_batched_tokens);
  return serving->layers_without_kv_scales;
}

void Engine::Impl::change_sleep(int level) {
  if (level > 0 && sleep_level == 0) {
    // Every request waits outside the scheduler, its KV given back: it is recomputed after wake_up.
    move_kv_blocks(true);
    if (serving->tiers) serving->tiers->flush();
    for (auto& r : serving->scheduler->take_all()) {
      r->tier_reads.reset();  // (the tiers go too)
      parked.push_back(std::move(r));
    }
    publish_stats();
    dropped = live;  // the counters of what goes now
    serving.reset();
  }
  if (level > 0 && tp) tp->drop(level == 2);  // (each rank gives its device's cached blocks back)
  if (level == 2) {
    model.reset();  // (before the ranks: rank 0's model holds their communicator)
    tp.reset();
  }
  if (level > 0 && dev != Device::kCPU) device_runtime(dev).release_cached();
#if defined(__GLIBC__)
  if (level > 0) malloc_trim(0);  // the host's freed pages back to the system, not kept by the allocator
#endif
  if (level == 0 && sleep_level > 0) {
    if (!model) load_models();
    build_serving();
    if (tp) tp->keep_greedy_ids(async_scheduling);
    for (auto& r : parked) {
      serving->caches->manager().prefetch(*r);
      serving->scheduler->add(std::move(r));
    }
    parked.clear();
  }
  publish_stats();  // (a caller of sleep / wake_up sees the stats of the new state)
  {
    std::lock_guard<std::mutex> lk(in_mu);
    sleep_level = level;
  }
  sleep_cv.notify_all();
}

}  // namespace revolta
