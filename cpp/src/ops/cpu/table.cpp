#include "core/thread_pool.h"
#include "ops/cpu/cpu_ops.h"

namespace revolta::ops::cpu {

void parallel_range(int64_t n, int64_t grain, const std::function<void(int64_t, int64_t)>& fn) {
  if (ThreadPool* pool = cpu_thread_pool()) pool->parallel_range(n, grain, fn);
  else if (n > 0) fn(0, n);
}

void parallel_tasks(int64_t n, const std::function<void(int64_t)>& fn) {
  if (ThreadPool* pool = cpu_thread_pool()) pool->parallel_for(n, fn);
  else
    for (int64_t t = 0; t < n; ++t) fn(t);
}

const OpTable* table() {
  static const OpTable t = [] {
    OpTable o;
    o.embedding = &embedding;
    o.rms_norm = &rms_norm;
    o.add_rms_norm = &add_rms_norm;
    o.linear = &linear;
    o.rope = &rope;
    o.silu_mul = &silu_mul;
    o.kv_cache_write = &kv_cache_write;
    o.paged_attention = &paged_attention;
    o.gather_rows = &gather_rows;
    o.copy_columns = &copy_columns;
    o.transpose = &transpose;
    o.fill_uniform = &fill_uniform;
    o.argmax = &argmax;
    o.qkv_rope_cache = &qkv_rope_cache;
    o.qkv_rope_attention = &qkv_rope_attention;
    o.sample = &sample;
    o.linear_swiglu = &linear_swiglu;
    o.gated_delta_rule = &gated_delta_rule_seqs;
    o.causal_conv1d = &causal_conv1d_seqs;
    o.l2_norm = &l2_norm;
    o.gated_rms_norm = &gated_rms_norm;
    o.sigmoid_mul = &sigmoid_mul;
    o.gdn_gates = &gdn_gates;
    o.scatter_add_rows = &scatter_add_rows;
    o.add_gated_rows = &add_gated_rows;
    o.moe_topk = &moe_topk;
    o.moe_experts = &moe_experts;
    o.moe_route = &moe_route;
    o.moe_route_experts = &moe_route_experts;
    o.gdn_decode = &gdn_decode;
    o.linear_scaled = &linear_scaled;
    o.gdn_split_qkv = &gdn_split_qkv;
    return o;
  }();
  return &t;
}

}  // namespace revolta::ops::cpu
