// The probes' log (core/probe.cuh): a header and a record array in device memory, allocated and
// bound into every instrumented translation unit by probe_enable(), read and emptied by probe_take().
#include <algorithm>
#include <mutex>
#include <vector>

#include "core/cuda_check.h"
#include "core/probe.cuh"

namespace revolta::cuda {
namespace {

constexpr unsigned kProbeCapacity = 1u << 22;  // records: 64 MB, a few decode steps at any size
std::mutex g_probe_mu;
ProbeLog* g_log = nullptr;
ProbeRecord* g_records = nullptr;

}  // namespace

std::vector<void (*)(ProbeLog*)>& binders() {
  static std::vector<void (*)(ProbeLog*)> list;
  return list;
}

bool probe_register(void (*bind)(ProbeLog* log)) {
  std::lock_guard<std::mutex> lock(g_probe_mu);
  binders().push_back(bind);
  return true;
}

void probe_enable() {
  std::lock_guard<std::mutex> lock(g_probe_mu);
  if (g_log) return;
  RV_CUDA_CHECK(cudaMalloc(&g_records, sizeof(ProbeRecord) * kProbeCapacity));
  RV_CUDA_CHECK(cudaMalloc(&g_log, sizeof(ProbeLog)));
  const ProbeLog header{0, kProbeCapacity, g_records};
  RV_CUDA_CHECK(cudaMemcpy(g_log, &header, sizeof(header), cudaMemcpyHostToDevice));
  for (auto bind : binders()) bind(g_log);
  RV_CUDA_CHECK(cudaGetLastError());
}

std::vector<ProbeRecord> probe_take() {
  std::lock_guard<std::mutex> lock(g_probe_mu);
  if (!g_log) return {};
  RV_CUDA_CHECK(cudaDeviceSynchronize());
  ProbeLog header{};
  RV_CUDA_CHECK(cudaMemcpy(&header, g_log, sizeof(header), cudaMemcpyDeviceToHost));
  std::vector<ProbeRecord> out(std::min(header.count, header.capacity));
  if (!out.empty())
    RV_CUDA_CHECK(cudaMemcpy(out.data(), g_records, sizeof(ProbeRecord) * out.size(), cudaMemcpyDeviceToHost));
  const unsigned zero = 0;
  RV_CUDA_CHECK(cudaMemcpy(&g_log->count, &zero, sizeof(zero), cudaMemcpyHostToDevice));
  return out;
}

}  // namespace revolta::cuda
