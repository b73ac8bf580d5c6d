#include "engine/kv_calibration.h"

#include <algorithm>
#include <cmath>
#include <memory>

#include "cache/cache_coordinator.h"
#include "core/error.h"
#include "runtime/model_runner.h"
#include "sched/scheduler.h"

namespace revolta {

namespace {

float largest_magnitude(const Tensor& cache) {
  const Tensor host = cache.device() == Device::kCPU ? cache : cache.to(Device::kCPU);
  std::vector<float> v(size_t(host.numel()));
  convert_to_f32(host.data(), host.dtype(), v.data(), v.size());
  float m = 0.0f;
  for (float x : v) m = std::max(m, std::fabs(x));
  return m;
}

}  // namespace

std::vector<std::pair<float, float>> calibrate_kv_scales(CausalLM& model, CacheSpecs groups,
                                                          const std::vector<std::vector<int32_t>>& prompts,
                                                          int32_t block_size, int32_t max_model_len) {
  RV_CHECK_ARG(!prompts.empty(), "calculate_kv_scales: no calibration prompts were given");
  const Device device = model.device();
  int32_t longest = 1;
  for (const auto& p : prompts) longest = std::max(longest, std::min(int32_t(p.size()), max_model_len - 1));
  for (CacheGroupSpec& g : groups)
    if (g.kind == CacheGroupSpec::Kind::kPagedKv) g.kv.dtype = device == Device::kCPU ? DType::kF32 : DType::kF16;
  const CacheLimits limits{block_size, 1, longest + 1, false};
  CacheCoordinator caches(plan_caches(groups, limits, plan_shape(groups, limits).min_bytes(), "calculate_kv_scales"),
                          limits, device);
  Scheduler scheduler(SchedulerConfig{1, longest, longest + 1}, caches.manager());
  RunnerOptions options;
  options.max_model_len = longest + 1;
  ModelRunner runner(model, caches.kv(), caches.states(), options);
  KvCache& kv = caches.kv();
  std::vector<std::pair<float, float>> largest(kv.k.size(), {0.0f, 0.0f});
  uint64_t id = 0;
  for (const auto& p : prompts) {
    if (p.empty()) continue;
    auto r = std::make_unique<Request>();
    r->id = ++id;
    r->tokens.assign(p.begin(), p.begin() + std::min<int64_t>(int64_t(p.size()), longest));
    r->num_prompt_tokens = int32_t(r->tokens.size());
    Request* req = r.get();
    scheduler.add(std::move(r));
    while (req->num_computed_tokens < req->num_prompt_tokens) {
      const SchedulerOutput step = scheduler.schedule();
      RV_CHECK(!step.empty(), "calculate_kv_scales: the calibration prompt was not scheduled");
      runner.execute(step, caches.prepare(step.scheduled));
      for (const ScheduledRequest& sr : step.scheduled) {
        sr.request->num_computed_tokens += sr.num_new_tokens;
        caches.commit(*sr.request);
      }
    }
    for (size_t l = 0; l < kv.k.size(); ++l)  // (blocks of earlier prompts hold values of those)
      largest[l] = {std::max(largest[l].first, largest_magnitude(kv.k[l])),
                    std::max(largest[l].second, largest_magnitude(kv.v[l]))};
    scheduler.remove(req->id);
  }
  std::vector<std::pair<float, float>> scales;
  for (const auto& [k, v] : largest) scales.push_back({k > 0.0f ? 2.0f * k / 448.0f : 1.0f, v > 0.0f ? 2.0f * v / 448.0f : 1.0f});
  return scales;
}

}  // namespace revolta
