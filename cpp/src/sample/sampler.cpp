#include "sample/sampler.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>
#include <unordered_map>

namespace revolta {
namespace {

constexpr float kNegInf = -std::numeric_limits<float>::infinity();

void fill_logprobs(const float* logits, int32_t V, int32_t n_top, int32_t chosen, TokenOutput& out) {
  float mx = *std::max_element(logits, logits + V);
  double sum = 0.0;
  for (int32_t i = 0; i < V; ++i) sum += std::exp(double(logits[i] - mx));
  const float lse = mx + float(std::log(sum));
  out.logprob = logits[chosen] - lse;
  if (n_top <= 0) return;
  std::vector<int32_t> idx(static_cast<size_t>(V));
  std::iota(idx.begin(), idx.end(), 0);
  int32_t k = std::min(n_top, V);
  std::partial_sort(idx.begin(), idx.begin() + k, idx.end(), [&](int32_t a, int32_t b) {
    return logits[a] > logits[b] || (logits[a] == logits[b] && a < b);
  });
  for (int32_t i = 0; i < k; ++i) out.top_logprobs.push_back({idx[size_t(i)], logits[idx[size_t(i)]] - lse});
}

int32_t argmax(const std::vector<float>& v) {
  return int32_t(std::max_element(v.begin(), v.end()) - v.begin());  // first max wins ties
}

}  // namespace

TokenOutput sample_token(const float* logits, int32_t V, const SamplingContext& ctx) {
  const SamplingParams& p = *ctx.params;
  const auto& toks = *ctx.tokens;
  std::vector<float> w(logits, logits + V);

  const int32_t n_out = int32_t(toks.size()) - ctx.num_prompt_tokens;
  if (n_out < p.min_tokens) {
    if (!p.ignore_eos)
      for (int32_t e : *ctx.eos_token_ids)
        if (e >= 0 && e < V) w[size_t(e)] = kNegInf;
    for (int32_t s : p.stop_token_ids)
      if (s >= 0 && s < V) w[size_t(s)] = kNegInf;
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

  TokenOutput out;
  if (p.temperature <= 1e-5f) {
    out.token = argmax(w);
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
  if (p.logprobs >= 0) fill_logprobs(logits, V, p.logprobs, out.token, out);
  if (p.return_generation_logits) out.logits.assign(logits, logits + V);
  return out;
}

}  // namespace revolta
