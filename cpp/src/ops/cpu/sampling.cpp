// The threshold form of sampling (ops::sample): the reference the device kernel is checked
// against, token for token at the same uniform. Kept sets are found as value thresholds with
// boundary ties taken in index order, and the draw walks the kept tokens in index order.
#include <algorithm>
#include <cmath>
#include <numeric>

#include "ops/cpu/cpu_ops.h"

namespace revolta::ops::cpu {
namespace {

// Keeps the `count` best entries of w by (value desc, index asc) among those with keep[i].
void keep_top(const std::vector<float>& w, int64_t count, std::vector<char>& keep) {
  std::vector<int32_t> idx;
  for (size_t i = 0; i < w.size(); ++i)
    if (keep[i]) idx.push_back(int32_t(i));
  if (int64_t(idx.size()) <= count) return;
  std::nth_element(idx.begin(), idx.begin() + count, idx.end(), [&](int32_t a, int32_t b) {
    return w[size_t(a)] > w[size_t(b)] || (w[size_t(a)] == w[size_t(b)] && a < b);
  });
  for (size_t i = size_t(count); i < idx.size(); ++i) keep[size_t(idx[i])] = 0;
}

}  // namespace

std::vector<float> sample_weights(const float* raw, int64_t V, const SampleRow& p, const SampleAdjust* adjust) {
  std::vector<float> w(raw, raw + V);
  for (int32_t a = p.adjust_begin; a < p.adjust_end; ++a) {
    const SampleAdjust& e = adjust[a];
    float& x = w[size_t(e.token)];
    x += e.bias;
    if (e.masked) x = -INFINITY;
    if (e.seen && p.repetition_penalty != 1.0f) x = x > 0 ? x / p.repetition_penalty : x * p.repetition_penalty;
    if (e.out_count > 0) x -= p.frequency_penalty * float(e.out_count) + p.presence_penalty;
  }
  if (p.temperature <= 1e-5f) return w;
  for (auto& x : w) x /= p.temperature;
  std::vector<char> keep(size_t(V), 1);
  if (p.top_k > 0 && p.top_k < V) keep_top(w, p.top_k, keep);
  const float mx = *std::max_element(w.begin(), w.end());
  std::vector<float> prob(size_t(V), 0.0f);
  double sum = 0.0;
  for (int64_t i = 0; i < V; ++i)
    if (keep[size_t(i)]) sum += prob[size_t(i)] = std::exp(w[size_t(i)] - mx);
  if (p.top_p < 1.0f) {  // the fewest best tokens whose mass reaches top_p of the kept mass
    std::vector<int32_t> idx;
    for (int64_t i = 0; i < V; ++i)
      if (keep[size_t(i)]) idx.push_back(int32_t(i));
    const auto better = [&](int32_t a, int32_t b) {
      return w[size_t(a)] > w[size_t(b)] || (w[size_t(a)] == w[size_t(b)] && a < b);
    };
    // The nucleus is usually a few tokens: order a growing head of the candidates, not all of them
    // (a strict order, so the kept set is the one a full sort gives).
    const double target = double(p.top_p) * sum;
    size_t n = idx.size(), sorted = 0;
    double cum = 0.0;
    for (size_t head = std::min<size_t>(64, idx.size()); n == idx.size(); head = std::min(head * 8, idx.size())) {
      std::partial_sort(idx.begin() + sorted, idx.begin() + head, idx.end(), better);
      for (; sorted < head; ++sorted) {
        cum += prob[size_t(idx[sorted])];
        if (cum >= target) {
          n = sorted + 1;
          break;
        }
      }
      if (head == idx.size()) break;
    }
    for (size_t i = n; i < idx.size(); ++i) keep[size_t(idx[i])] = 0;
  }
  if (p.min_p > 0.0f)  // relative to the best token (probability 1 before normalising)
    for (int64_t i = 0; i < V; ++i)
      if (keep[size_t(i)] && prob[size_t(i)] < p.min_p && w[size_t(i)] != mx) keep[size_t(i)] = 0;
  for (int64_t i = 0; i < V; ++i)
    if (!keep[size_t(i)]) prob[size_t(i)] = 0.0f;
  return prob;
}

int32_t draw_index_order(const std::vector<float>& weights, double uniform) {
  double kept = 0.0;
  for (float x : weights) kept += x;
  const double target = uniform * kept;
  double acc = 0.0;
  int32_t token = -1;
  for (size_t i = 0; i < weights.size(); ++i) {
    if (weights[i] <= 0.0f) continue;
    token = int32_t(i);  // the last kept token if rounding leaves target unreached
    acc += weights[i];
    if (target < acc) break;
  }
  return token;
}

void sample(const Tensor& logits, const std::vector<SampleRow>& rows, const std::vector<SampleAdjust>& adjust,
            std::vector<SampleResult>& out) {
  const int64_t R = int64_t(rows.size()), V = logits.numel() / std::max<int64_t>(R, 1);
  out.assign(size_t(R), SampleResult{});
  for (int64_t r = 0; r < R; ++r) {
    const SampleRow& p = rows[size_t(r)];
    const float* raw = logits.ptr<float>() + r * V;
    const std::vector<float> w = cpu::sample_weights(raw, V, p, adjust.data());
    SampleResult& o = out[size_t(r)];
    if (p.temperature <= 1e-5f) o.token = int32_t(std::max_element(w.begin(), w.end()) - w.begin());
    else o.token = cpu::draw_index_order(w, double(p.uniform));
    if (p.num_logprobs >= 0) {
      const float mx = *std::max_element(raw, raw + V);
      double s = 0.0;
      for (int64_t i = 0; i < V; ++i) s += std::exp(double(raw[i] - mx));
      const float lse = mx + float(std::log(s));
      o.logprob = raw[o.token] - lse;
      std::vector<int32_t> idx(static_cast<size_t>(V));
      std::iota(idx.begin(), idx.end(), 0);
      const int32_t n = std::min<int32_t>({p.num_logprobs, kMaxTopLogprobs, int32_t(V)});
      std::partial_sort(idx.begin(), idx.begin() + n, idx.end(),
                        [&](int32_t a, int32_t b) { return raw[a] > raw[b] || (raw[a] == raw[b] && a < b); });
      for (int32_t i = 0; i < n; ++i) o.top_ids[i] = idx[size_t(i)], o.top_logprobs[i] = raw[idx[size_t(i)]] - lse;
    }
  }
}

}  // namespace revolta::ops::cpu
