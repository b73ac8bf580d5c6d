// The op harness's cases for speculative drafts' own ops: DFlash2's grouped dynamic causal conv
// against the CPU's, over blocks of several lengths (a tap must not cross into the previous block).
#include "harness.h"

namespace revolta::harness {
namespace {

void test_dynamic_conv(const std::vector<int32_t>& blocks, int64_t C, int64_t groups, int64_t K) {
  std::vector<int32_t> first;
  std::string tag;
  for (int32_t n : blocks) {
    const int32_t start = int32_t(first.size());
    for (int32_t i = 0; i < n; ++i) first.push_back(start);
    tag += " " + std::to_string(n);
  }
  const int64_t R = int64_t(first.size()), width = 2 * K * groups;
  Tensor x = random_tensor({R, C}), dynamic = random_tensor({R, width}), base = random_tensor({K, C});
  Tensor rows = Tensor::empty({R}, DType::kI32);
  std::copy(first.begin(), first.end(), rows.ptr<int32_t>());
  Tensor out = Tensor::empty({R, C}, DType::kF32), dout = Tensor::empty({R, C}, DType::kF32, Device::kCUDA);
  for (int64_t part = 0; part < 2; ++part) {  // before and after the block it wraps: the dynamic columns' halves
    ops::cpu::dynamic_conv(x, dynamic, part * K * groups, groups, base, rows, out);
    ops::dynamic_conv(cuda::to_device(x), cuda::to_device(dynamic), part * K * groups, groups, cuda::to_device(base),
                      cuda::to_device(rows), dout);
    report("dynamic_conv blocks" + tag + " C" + std::to_string(C) + " K" + std::to_string(K) + " part " +
               std::to_string(part),
           max_abs_diff(cuda::to_host(dout), out), 1e-5f);
  }
}

}  // namespace

void run_spec_cases() {
  test_dynamic_conv({16}, 2048, 128, 2);        // a DFlash2 block at a 2K hidden size, groups of 16
  test_dynamic_conv({1, 5, 8, 3}, 96, 6, 3);    // ragged blocks, a tap reaching past a block's start
}

}  // namespace revolta::harness
