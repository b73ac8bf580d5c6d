// Two forms of sampling draw from the same distribution: a sorted walk over the candidates
// (reference_sample, below) and the threshold form of ops::sample (index-order walk), which the
// engine uses on every device and which is the reference of the CUDA kernel. Kept sets must be
// equal and frequencies close.
#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <limits>
#include <map>
#include <numeric>
#include <unordered_map>
#include <random>
#include <set>
#include <vector>

#include "expect.h"
#include "ops/cpu/cpu_ops.h"
#include "sample/sampler.h"

using namespace revolta;

namespace {

// The sorted-walk form of the sampler, as the engine had it before ops::sample served every
// device: an independent second implementation of the same distribution.
int32_t reference_sample(const float* logits, int32_t V, const SamplingContext& ctx) {
  const SamplingParams& p = *ctx.params;
  const auto& toks = *ctx.tokens;
  std::vector<float> w(logits, logits + V);

  const int32_t n_out = int32_t(toks.size()) - ctx.num_prompt_tokens;
  if (n_out < p.min_tokens) {
    if (!p.ignore_eos)
      for (int32_t e : *ctx.eos_token_ids)
        if (e >= 0 && e < V) w[size_t(e)] = -std::numeric_limits<float>::infinity();
    for (int32_t s : p.stop_token_ids)
      if (s >= 0 && s < V) w[size_t(s)] = -std::numeric_limits<float>::infinity();
  }
  if (p.repetition_penalty != 1.0f) {
    std::vector<char> seen(size_t(V), 0);
    for (int32_t t : toks)
      if (t >= 0 && t < V && !seen[size_t(t)]) {
        seen[size_t(t)] = 1;
        float& x = w[size_t(t)];
        x = x > 0 ? x / p.repetition_penalty : x * p.repetition_penalty;
      }
  }
  if (p.presence_penalty != 0.0f || p.frequency_penalty != 0.0f) {
    std::unordered_map<int32_t, int32_t> counts;
    for (size_t i = size_t(ctx.num_prompt_tokens); i < toks.size(); ++i) ++counts[toks[i]];
    for (const auto& [t, c] : counts)
      if (t >= 0 && t < V) w[size_t(t)] -= p.frequency_penalty * float(c) + p.presence_penalty;
  }

  struct {
    int32_t token;
  } out{};
  if (p.temperature <= 1e-5f) {
    out.token = int32_t(std::max_element(w.begin(), w.end()) - w.begin());
  } else {
    for (auto& x : w) x /= p.temperature;
    // Candidates sorted by logit, best first; top-k cuts the list before any softmax.
    std::vector<int32_t> idx(static_cast<size_t>(V));
    std::iota(idx.begin(), idx.end(), 0);
    auto better = [&](int32_t a, int32_t b) { return w[size_t(a)] > w[size_t(b)] || (w[size_t(a)] == w[size_t(b)] && a < b); };
    int32_t k = (p.top_k > 0 && p.top_k < V) ? p.top_k : V;
    if (k < V) {
      std::nth_element(idx.begin(), idx.begin() + k, idx.end(), better);
      idx.resize(size_t(k));
    }
    std::sort(idx.begin(), idx.end(), better);
    const float mx = w[size_t(idx[0])];
    std::vector<double> prob(idx.size());
    double sum = 0.0;
    for (size_t i = 0; i < idx.size(); ++i) sum += prob[i] = std::exp(double(w[size_t(idx[i])] - mx));
    size_t keep = idx.size();
    if (p.top_p < 1.0f) {
      double cum = 0.0;
      for (size_t i = 0; i < idx.size(); ++i) {
        cum += prob[i] / sum;
        if (cum >= double(p.top_p)) {
          keep = i + 1;
          break;
        }
      }
    }
    if (p.min_p > 0.0f) {
      const double floor = double(p.min_p) * prob[0];  // prob[0] is the max
      size_t j = 0;
      while (j < keep && prob[j] >= floor) ++j;
      keep = std::max<size_t>(j, 1);
    }
    double kept = 0.0;
    for (size_t i = 0; i < keep; ++i) kept += prob[i];
    double u = ctx.rng->uniform() * kept, acc = 0.0;
    out.token = idx[keep - 1];
    for (size_t i = 0; i < keep; ++i) {
      acc += prob[i];
      if (u < acc) {
        out.token = idx[i];
        break;
      }
    }
  }
  return out.token;
}


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
    ++host[reference_sample(logits.ptr<float>(), V, ctx)];
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
