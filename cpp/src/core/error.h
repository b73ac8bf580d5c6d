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

#define RV_CHECK(cond, ...)                                                      \
  do {                                                                           \
    if (!(cond)) throw std::runtime_error(::revolta::str_cat(__VA_ARGS__));      \
  } while (0)

#define RV_CHECK_ARG(cond, ...)                                                  \
  do {                                                                           \
    if (!(cond)) throw std::invalid_argument(::revolta::str_cat(__VA_ARGS__));   \
  } while (0)

}  // namespace revolta
