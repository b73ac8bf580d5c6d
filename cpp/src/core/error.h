// Error helpers: every failure says what was wrong and where, in one line.
#pragma once

#include <sstream>
#include <stdexcept>
#include <string>

namespace revolta {

template <typename... Args>
std::string str_cat(const Args&... args) {
  std::ostringstream os;
  (os << ... << args);
  return os.str();
}

// A failure of the device itself (a CUDA error is sticky: every later call on the context fails
// too). The engine treats it as fatal; any other exception in a step fails only that step's requests.
struct DeviceError : std::runtime_error {
  using std::runtime_error::runtime_error;
};

#define RV_CHECK(cond, ...)                                                      \
  do {                                                                           \
    if (!(cond)) throw std::runtime_error(::revolta::str_cat(__VA_ARGS__));      \
  } while (0)

#define RV_CHECK_ARG(cond, ...)                                                  \
  do {                                                                           \
    if (!(cond)) throw std::invalid_argument(::revolta::str_cat(__VA_ARGS__));   \
  } while (0)

}  // namespace revolta
