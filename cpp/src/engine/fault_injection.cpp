#include "engine/fault_injection.h"

#include <algorithm>
#include <cstdlib>
#include <string>

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
  const size_t colon = spec.find(':');
  const std::string kind = spec.substr(0, colon);
  RV_CHECK_ARG(colon != std::string::npos && (kind == "step" || kind == "device"),
               "REVOLTA_FAULT_INJECT must be 'step:TOKEN', 'device:TOKEN' or 'accept-drafts', got '", spec, "'");
  f.kind = kind == "step" ? Kind::kStep : Kind::kDevice;
  f.token = std::stoi(spec.substr(colon + 1));
  return f;
}

void FaultInjection::check(const std::vector<ScheduledRequest>& scheduled) const {
  if (kind == Kind::kNone || kind == Kind::kAcceptDrafts) return;
  for (const ScheduledRequest& s : scheduled) {
    const auto& t = s.request->tokens;
    if (std::find(t.begin(), t.begin() + s.request->num_prompt_tokens, token) == t.begin() + s.request->num_prompt_tokens)
      continue;
    if (kind == Kind::kDevice) throw DeviceError(str_cat("injected device fault (token ", token, ")"));
    throw std::runtime_error(str_cat("injected step fault (token ", token, ")"));
  }
}

}  // namespace revolta
