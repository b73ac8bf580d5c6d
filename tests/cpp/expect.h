// The unit tests' one assertion: counts and reports, never aborts.
#pragma once

#include <cstdio>
#include <exception>
#include <functional>
#include <string>

extern int g_passed, g_failed;
#define EXPECT(cond)                                                    \
  do {                                                                  \
    if (cond) {                                                         \
      ++g_passed;                                                       \
    } else {                                                            \
      ++g_failed;                                                       \
      std::printf("FAILED %s:%d: %s\n", __FILE__, __LINE__, #cond);     \
    }                                                                   \
  } while (0)

// f throws, with `words` in its message (the unit tests' check of an error naming its cause).
inline bool throws_naming(const std::function<void()>& f, const std::string& words) {
  try {
    f();
  } catch (const std::exception& e) {
    return std::string(e.what()).find(words) != std::string::npos;
  }
  return false;
}
