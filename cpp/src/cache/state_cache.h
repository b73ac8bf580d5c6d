// Recurrent state of the linear-attention (Gated DeltaNet) layers: per layer a conv state
// [slots, conv_dim, kernel - 1] and a delta-rule state [slots, heads, k_dim, v_dim], float32.
// A request owns one slot while it runs; prefix-cache snapshots live in further slots.
#pragma once

#include <vector>

#include "core/tensor.h"

namespace revolta {

struct StateSpec {
  int32_t num_layers = 0;  // recurrent layers; 0: the model has none
  int32_t conv_dim = 0, conv_history = 0;
  int32_t num_heads = 0, k_dim = 0, v_dim = 0;
  // Further float32 state per slot, one buffer of each shape (Flash-Next's PLE n-gram window and
  // conv history): zeroed, copied, snapshotted and offloaded with the slot.
  std::vector<std::vector<int64_t>> buffers;
  int64_t bytes_per_slot() const {
    int64_t n = int64_t(num_layers) * (int64_t(conv_dim) * conv_history + int64_t(num_heads) * k_dim * v_dim) * 4;
    for (const auto& shape : buffers) {
      int64_t e = 4;
      for (int64_t d : shape) e *= d;
      n += e;
    }
    return n;
  }
  bool empty() const { return num_layers == 0 && buffers.empty(); }
};

// Before a forward: zero slot `to` (from < 0), or copy slot `from` into it (a prefix hit).
struct StateAction {
  int32_t from = -1, to = -1;
};

struct StateCache {
  StateCache(const StateSpec& spec, int32_t num_slots, Device device = Device::kCPU);
  std::vector<Tensor> conv, ssm;  // one per recurrent layer
  std::vector<Tensor> buffers;    // StateSpec::buffers, [slots, shape...] each
  Tensor buffer_slot(size_t buffer, int32_t slot) const;
  int32_t num_slots;
  Device device;
  Tensor conv_slot(size_t layer, int32_t slot) const;
  Tensor ssm_slot(size_t layer, int32_t slot) const;
  void zero(int32_t slot);
  void copy(int32_t from, int32_t to);
  void apply(const std::vector<StateAction>& actions);  // in order, on the device's stream
  int64_t nbytes() const;
};

}  // namespace revolta
