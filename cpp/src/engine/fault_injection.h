// Fault injection for tests of the engine's error paths, read once from REVOLTA_FAULT_INJECT:
// "step:TOKEN" makes a step that schedules a request whose prompt holds TOKEN throw as a failing
// op would (only that step's requests fail); "device:TOKEN" throws a DeviceError (fatal);
// "accept-drafts" makes the speculative verifier keep every sampled draft (a wrong rule, which the
// distribution test must catch); "accept-drafts:R" makes it keep R drafts a verify step on average
// (whole counts around R, greedy and sampled alike), to measure speculation at a stated acceptance
// where drafts cannot be right (dummy weights); "hang:TOKEN:SECONDS" makes a step that schedules
// such a request stall that long (the watchdog's test). Unset, as in production, it costs one comparison per step.
#pragma once

#include <cstdint>
#include <vector>

#include "sched/scheduler.h"

namespace revolta {

struct FaultInjection {
  enum class Kind { kNone, kStep, kDevice, kAcceptDrafts, kHang };
  Kind kind = Kind::kNone;
  int32_t token = -1;
  double accept_rate = -1.0;  // accept-drafts:R
  double hang_s = 0.0;        // hang:TOKEN:SECONDS
  double accepted_so_far = 0.0;
  int64_t verify_steps = 0;

  // accept-drafts:R: how many of a step's k drafts are kept, so that the running mean stays at R.
  int32_t forced_accepts(int32_t k);

  static FaultInjection from_env();
  void check(const std::vector<ScheduledRequest>& scheduled) const;
};

}  // namespace revolta
