#include "core/device_runtime.h"

#include "core/error.h"

namespace revolta {
namespace {
DeviceRuntime* g_runtimes[2] = {nullptr, nullptr};
}

void register_device_runtime(Device device, DeviceRuntime* runtime) { g_runtimes[int(device)] = runtime; }

bool has_device(Device device) { return g_runtimes[int(device)] != nullptr; }

DeviceRuntime& device_runtime(Device device) {
  RV_CHECK(g_runtimes[int(device)] != nullptr, "this build has no CUDA backend (build with REVOLTA_CUDA=ON)");
  return *g_runtimes[int(device)];
}

}  // namespace revolta
