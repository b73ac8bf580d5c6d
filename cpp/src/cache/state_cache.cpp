#include "cache/state_cache.h"

#include <cstring>

#include "core/device_runtime.h"

namespace revolta {

StateCache::StateCache(const StateSpec& s, int32_t n, Device d) : num_slots(n), device(d) {
  for (int32_t l = 0; l < s.num_layers; ++l) {
    conv.push_back(Tensor::empty({n, s.conv_dim, s.conv_history}, DType::kF32, d));
    ssm.push_back(Tensor::empty({n, s.num_heads, s.k_dim, s.v_dim}, DType::kF32, d));
  }
  for (const auto& shape : s.buffers) {
    std::vector<int64_t> full{n};
    full.insert(full.end(), shape.begin(), shape.end());
    buffers.push_back(Tensor::empty(full, DType::kF32, d));
  }
}

namespace {
void zero_bytes(Device d, void* p, size_t n) {
  if (d == Device::kCPU) std::memset(p, 0, n);
  else device_runtime(d).fill_zero(p, n);
}
void copy_bytes(Device d, void* dst, const void* src, size_t n) {
  if (d == Device::kCPU) std::memcpy(dst, src, n);
  else device_runtime(d).copy_on_device(dst, src, n);
}
}  // namespace

Tensor StateCache::conv_slot(size_t layer, int32_t slot) const {
  const Tensor& t = conv[layer];
  return t.slice_rows(slot, slot + 1).view({t.size(1), t.size(2)});
}

Tensor StateCache::ssm_slot(size_t layer, int32_t slot) const {
  const Tensor& t = ssm[layer];
  return t.slice_rows(slot, slot + 1).view({t.size(1), t.size(2), t.size(3)});
}

Tensor StateCache::buffer_slot(size_t buffer, int32_t slot) const {
  const Tensor& t = buffers[buffer];
  std::vector<int64_t> shape(t.shape().begin() + 1, t.shape().end());
  return t.slice_rows(slot, slot + 1).view(shape);
}

void StateCache::zero(int32_t slot) {
  for (size_t l = 0; l < conv.size(); ++l) {
    Tensor c = conv_slot(l, slot), s = ssm_slot(l, slot);
    zero_bytes(device, c.data(), c.nbytes());
    zero_bytes(device, s.data(), s.nbytes());
  }
  for (size_t b = 0; b < buffers.size(); ++b) {
    Tensor t = buffer_slot(b, slot);
    zero_bytes(device, t.data(), t.nbytes());
  }
}

void StateCache::copy(int32_t from, int32_t to) {
  for (size_t l = 0; l < conv.size(); ++l) {
    copy_bytes(device, conv_slot(l, to).data(), conv_slot(l, from).data(), conv_slot(l, from).nbytes());
    copy_bytes(device, ssm_slot(l, to).data(), ssm_slot(l, from).data(), ssm_slot(l, from).nbytes());
  }
  for (size_t b = 0; b < buffers.size(); ++b)
    copy_bytes(device, buffer_slot(b, to).data(), buffer_slot(b, from).data(), buffer_slot(b, from).nbytes());
}

void StateCache::apply(const std::vector<StateAction>& actions) {
  for (const StateAction& a : actions) {
    if (a.from < 0) zero(a.to);
    else copy(a.from, a.to);
  }
}

int64_t StateCache::nbytes() const {
  int64_t n = 0;
  for (size_t l = 0; l < conv.size(); ++l) n += int64_t(conv[l].nbytes() + ssm[l].nbytes());
  for (const Tensor& t : buffers) n += int64_t(t.nbytes());
  return n;
}

}  // namespace revolta
