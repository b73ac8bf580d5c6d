// A small, fully specified generator (splitmix64) so that seeded sampling gives the same tokens
// on every platform and standard library.
#pragma once

#include <cstdint>

namespace revolta {

class Rng {
 public:
  explicit Rng(uint64_t seed = 0) : state_(seed) {}
  uint64_t next() {
    uint64_t z = (state_ += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
  }
  // Uniform in [0, 1).
  double uniform() { return double(next() >> 11) * 0x1.0p-53; }

 private:
  uint64_t state_;
};

}  // namespace revolta
