// The two forms of sampling draw from the same distribution: the host sampler (sorted walk,
// sample/sampler.cpp) and the threshold form of ops::sample (index-order walk; the reference
// of the device kernel). Kept sets must be equal and frequencies close.
#include <cmath>
#include <cstdlib>
#include <map>
#include <random>
#include <set>
#include <vector>

#include "expect.h"
#include "ops/cpu/cpu_ops.h"
#include "sample/sampler.h"

using namespace revolta;

namespace {

struct Case {
  float temperature, top_p, min_p, repetition, presence, frequency;
  int32_t top_k;
};

void check_case(const Case& c, uint64_t seed) {
  const int32_t V = 300, n = 20000;
  std::mt19937 gen{static_cast<uint32_t>(seed)};
  std::normal_distribution<float> nd(0.0f, 1.5f);
  Tensor logits = Tensor::empty({1, V}, DType::kF32);
  for (int32_t i = 0; i < V; ++i) logits.ptr<float>()[i] = nd(gen);
  logits.ptr<float>()[7] = logits.ptr<float>()[8] = 3.0f;  // a tie near the top
  // prompt [5, 9], output [9, 11, 11]: penalties touch 5, 9, 11; EOS 2 is not masked (min_tokens 0)
  std::vector<int32_t> tokens = {5, 9, 9, 11, 11};
  SamplingParams p;
  p.temperature = c.temperature, p.top_p = c.top_p, p.min_p = c.min_p, p.top_k = c.top_k;
  p.repetition_penalty = c.repetition, p.presence_penalty = c.presence, p.frequency_penalty = c.frequency;
  std::vector<int32_t> eos = {2};

  std::map<int32_t, int> host;
  for (int i = 0; i < n; ++i) {
    Rng rng(seed * 1000003ull + uint64_t(i));
    SamplingContext ctx{&p, &tokens, 2, &eos, &rng};
    ++host[sample_token(logits.ptr<float>(), V, ctx).token];
  }
  ops::SampleRow row;
  row.temperature = c.temperature, row.top_p = c.top_p, row.min_p = c.min_p, row.top_k = c.top_k;
  row.repetition_penalty = c.repetition, row.presence_penalty = c.presence, row.frequency_penalty = c.frequency;
  std::vector<ops::SampleAdjust> adjust = {{5, 0, 1, 0}, {9, 0, 1, 1}, {11, 0, 1, 2}};
  row.adjust_end = 3;
  std::map<int32_t, int> thr;
  std::vector<ops::SampleRow> rows(1, row);
  std::vector<ops::SampleResult> out;
  for (int i = 0; i < n; ++i) {  // stratified uniforms: frequencies follow the kept probabilities
    rows[0].uniform = (float(i) + 0.5f) / float(n);
    ops::cpu::sample(logits, rows, adjust, out);
    ++thr[out[0].token];
  }
  std::set<int32_t> a, b;
  double tv = 0.0;
  for (auto& [t, k] : host) a.insert(t);
  for (auto& [t, k] : thr) b.insert(t);
  for (int32_t t = 0; t < V; ++t) tv += std::fabs(double(host[t]) - double(thr[t])) / n;
  // Tokens of tiny probability may be missed by either side's draws: compare the likely ones.
  for (int32_t t : b) EXPECT(thr[t] < n / 500 || a.count(t) == 1);
  for (int32_t t : a) EXPECT(host[t] < n / 500 || b.count(t) == 1);
  // The stratified side is near exact; the host side is multinomial, whose expected total
  // variation is about 0.5 * sum sqrt(2 p (1 - p) / (pi n)). Allow twice that.
  double noise = 0.0;
  for (int32_t t = 0; t < V; ++t) {
    const double q = double(thr[t]) / n;
    noise += 0.5 * std::sqrt(2.0 * q * (1.0 - q) / (M_PI * n));
  }
  EXPECT(tv / 2 < 2.0 * noise + 0.005);
  if (std::getenv("REVOLTA_DEBUG_SAMPLING")) {
    std::printf("case seed %llu tv %.4f (noise %.4f)\n", (unsigned long long)seed, tv / 2, noise);
    for (int32_t t = 0; t < V; ++t)
      if (host[t] || thr[t]) std::printf("  %d host %d thr %d\n", t, host[t], thr[t]);
  }
}

}  // namespace

void run_sampling_tests() {
  check_case({1.0f, 1.0f, 0.0f, 1.0f, 0.0f, 0.0f, 0}, 1);
  check_case({0.7f, 1.0f, 0.0f, 1.0f, 0.0f, 0.0f, 10}, 2);
  check_case({1.3f, 0.8f, 0.0f, 1.3f, 0.0f, 0.0f, 0}, 3);
  check_case({1.0f, 1.0f, 0.1f, 1.0f, 0.5f, 0.3f, 0}, 4);
  check_case({0.9f, 0.9f, 0.05f, 1.2f, 0.2f, 0.1f, 40}, 5);
}
