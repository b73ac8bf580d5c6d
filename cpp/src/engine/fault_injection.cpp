#include "engine/fault_injection.h"

#include <algorithm>
#include <cstdlib>
#include <string>
#include <thread>
#include <chrono>

#include "core/error.h"

namespace revolta {

FaultInjection FaultInjection::from_env() {
  FaultInjection f;
  const char* env = std::getenv("REVOLTA_FAULT_INJECT");
  if (!env || !*env) return f;
  const std::string spec(env);
  if (spec == "accept-drafts") {
    f.kind = Kind::kAcceptDrafts;
    return f;
  }
  if (spec.rfind("accept-drafts:", 0) == 0) {
    f.kind = Kind::kAcceptDrafts;
    f.accept_rate = std::stod(spec.substr(14));
    RV_CHECK_ARG(f.accept_rate >= 0.0, "REVOLTA_FAULT_INJECT accept-drafts:R needs R >= 0, got '", spec, "'");
    return f;
  }
  if (spec.rfind("hang:", 0) == 0) {
    const size_t second = spec.find(':', 5);
    RV_CHECK_ARG(second != std::string::npos, "REVOLTA_FAULT_INJECT hang needs 'hang:TOKEN:SECONDS', got '", spec, "'");
    f.kind = Kind::kHang;
    f.token = std::stoi(spec.substr(5, second - 5));
    f.hang_s = std::stod(spec.substr(second + 1));
    return f;
  }
  const size_t colon = spec.find(':');
  const std::string kind = spec.substr(0, colon);
  RV_CHECK_ARG(colon != std::string::npos && (kind == "step" || kind == "device"),
               "REVOLTA_FAULT_INJECT must be 'step:TOKEN', 'device:TOKEN' or 'accept-drafts[:R]', got '", spec, "'");
  f.kind = kind == "step" ? Kind::kStep : Kind::kDevice;
  f.token = std::stoi(spec.substr(colon + 1));
  return f;
}

int32_t FaultInjection::forced_accepts(int32_t k) {
  ++verify_steps;
  const int32_t a = std::min<int32_t>(k, int32_t(accept_rate * double(verify_steps) - accepted_so_far + 0.5));
  accepted_so_far += std::max(0, a);
  return std::max(0, a);
}

void FaultInjection::check(const std::vector<ScheduledRequest>& scheduled) const {
  if (kind == Kind::kNone || kind == Kind::kAcceptDrafts) return;
  for (const ScheduledRequest& s : scheduled) {
    const auto& t = s.request->tokens;
    if (std::find(t.begin(), t.begin() + s.request->num_prompt_tokens, token) == t.begin() + s.request->num_prompt_tokens)
      continue;
    if (kind == Kind::kHang) {
      std::this_thread::sleep_for(std::chrono::duration<double>(hang_s));
      return;
    }
    if (kind == Kind::kDevice) throw DeviceError(str_cat("injected device fault (token ", token, ")"));
    throw std::runtime_error(str_cat("injected step fault (token ", token, ")"));
  }
}

}  // namespace revolta
