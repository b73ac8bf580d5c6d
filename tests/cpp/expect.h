// The unit tests' one assertion: counts and reports, never aborts.
#pragma once

#include <cstdio>

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
