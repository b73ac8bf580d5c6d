// Fault injection for tests of the engine's error paths, read once from REVOLTA_FAULT_INJECT:
// "step:TOKEN" makes a step that schedules a request whose prompt holds TOKEN throw as a failing
// op would (only that step's requests fail); "device:TOKEN" throws a DeviceError (fatal);
// "accept-drafts" makes the speculative verifier keep every sampled draft (a wrong rule, which the
// distribution test must catch). Unset, as in production, it costs one comparison per step.
#pragma once

#include <cstdint>
#include <vector>

#include "sched/scheduler.h"

namespace revolta {

struct FaultInjection {
  enum class Kind { kNone, kStep, kDevice, kAcceptDrafts };
  Kind kind = Kind::kNone;
  int32_t token = -1;

  static FaultInjection from_env();
  void check(const std::vector<ScheduledRequest>& scheduled) const;
};

}  // namespace revolta
