#include "model/vision_encoder.h"

#include <algorithm>
#include <cmath>
#include <cstring>

#include "core/error.h"

namespace revolta {

VisionEncoder::VisionEncoder(const WeightLoader& w, const VisionConfig& c, DType dt, Device device)
    : cfg_(c), dtype_(dt), device_(device) {
  prefix_ = w.has("model.visual.patch_embed.proj.weight") ? "model.visual." : "visual.";
  const int64_t H = c.hidden_size, I = c.intermediate_size, P = c.patch_dim();
  {
    const std::string name = prefix_ + "patch_embed.proj.weight";
    Tensor conv = w.get(name, {H, c.in_channels, c.temporal_patch_size, c.patch_size, c.patch_size}, dt, device);
    patch_.weight = conv.view({H, P});
    patch_.bias = w.get(prefix_ + "patch_embed.proj.bias", {H}, DType::kF32, device);
  }
  pos_table_ = w.get(prefix_ + "pos_embed.weight", {c.num_position_embeddings, H}, DType::kF32, device);
  bytes_ += int64_t(pos_table_.nbytes());
  for (int32_t b = 0; b < c.depth; ++b) {
    const std::string p = prefix_ + "blocks." + std::to_string(b) + ".";
    Block blk;
    blk.norm1 = norm(w, p + "norm1", H);
    blk.norm2 = norm(w, p + "norm2", H);
    blk.qkv = linear(w, p + "attn.qkv", 3 * H, H);
    blk.proj = linear(w, p + "attn.proj", H, H);
    blk.fc1 = linear(w, p + "mlp.linear_fc1", I, H);
    blk.fc2 = linear(w, p + "mlp.linear_fc2", H, I);
    blocks_.push_back(std::move(blk));
  }
  merger_ = merger(w, prefix_ + "merger", false);
  for (size_t k = 0; k < c.deepstack_layers.size(); ++k) {
    RV_CHECK(c.deepstack_layers[k] >= 0 && c.deepstack_layers[k] < c.depth, prefix_, ": deepstack layer ",
             c.deepstack_layers[k], " is not a block of the tower's ", c.depth);
    deepstack_.push_back(merger(w, prefix_ + "deepstack_merger_list." + std::to_string(k), true));
  }
  grow_rope(64);
}

VisionEncoder::Merger VisionEncoder::merger(const WeightLoader& w, const std::string& name, bool postshuffle) {
  const int64_t H = cfg_.hidden_size, M = H * cfg_.merge_unit();
  return {norm(w, name + ".norm", postshuffle ? M : H), linear(w, name + ".linear_fc1", M, M),
          linear(w, name + ".linear_fc2", cfg_.out_hidden_size, M)};
}

Tensor VisionEncoder::merge(const Merger& m, const Tensor& x) {
  const int64_t M = int64_t(cfg_.hidden_size) * cfg_.merge_unit(), rows = x.numel() / M;
  Tensor normed = Tensor::uninitialized(x.shape(), DType::kF32, device_);
  ops::layer_norm(x, m.norm.weight, m.norm.bias, 1e-6f, normed);  // per patch, or per merged row (postshuffle)
  Tensor merged = apply(m.fc1, normed.view({rows, M}));
  ops::gelu(merged, false);
  return apply(m.fc2, merged);
}

VisionEncoder::Linear VisionEncoder::linear(const WeightLoader& w, const std::string& name, int64_t out, int64_t in) {
  Linear l{w.get(name + ".weight", {out, in}, dtype_, device_), w.get(name + ".bias", {out}, DType::kF32, device_)};
  bytes_ += int64_t(l.weight.nbytes() + l.bias.nbytes());
  return l;
}

VisionEncoder::Norm VisionEncoder::norm(const WeightLoader& w, const std::string& name, int64_t n) {
  return {w.get(name + ".weight", {n}, DType::kF32, device_), w.get(name + ".bias", {n}, DType::kF32, device_)};
}

Tensor VisionEncoder::apply(const Linear& l, const Tensor& x) {
  Tensor out = Tensor::uninitialized({x.size(0), l.weight.size(0)}, DType::kF32, device_);
  ops::linear(x, l.weight, &l.bias, out);
  return out;
}

void VisionEncoder::grow_rope(int32_t side) {
  if (rope_.cos.defined() && rope_.cos.size(0) >= side) return;
  // HF's axial rotary: inv_freq over a quarter of the head; frequency i < D/4 turns by the height,
  // i in [D/4, D/2) by the width, each with inv_freq[i mod D/4].
  const int32_t D = cfg_.hidden_size / cfg_.num_heads, half = D / 2, quarter = D / 4;
  Tensor cos = Tensor::empty({side, half}, DType::kF32), sin = Tensor::empty({side, half}, DType::kF32);
  for (int32_t p = 0; p < side; ++p)
    for (int32_t i = 0; i < half; ++i) {
      const float inv = 1.0f / std::pow(float(cfg_.rope_theta), float(2 * (i % quarter)) / float(half));
      const float angle = float(p) * inv;
      cos.ptr<float>()[int64_t(p) * half + i] = std::cos(angle);
      sin.ptr<float>()[int64_t(p) * half + i] = std::sin(angle);
    }
  Tensor axes = Tensor::empty({half}, DType::kI32);
  for (int32_t i = 0; i < half; ++i) axes.ptr<int32_t>()[i] = i < quarter ? 0 : 1;
  rope_.rotary_dim = D;
  rope_.cos = cos.to(device_);
  rope_.sin = sin.to(device_);
  rope_.axes = axes.to(device_);
}

void VisionEncoder::positions(const std::vector<VisionItem>& items, Tensor& table_rows, Tensor& rotary) const {
  const int64_t H = cfg_.hidden_size, m = cfg_.spatial_merge_size;
  const int64_t side = int64_t(std::llround(std::sqrt(double(cfg_.num_position_embeddings))));
  int64_t N = 0;
  for (const auto& it : items) N += it.patches();
  // Each patch's row is four taps of the table; the host picks them, the device mixes the rows.
  Tensor tap_rows = Tensor::empty({4, N}, DType::kI32), tap_weights = Tensor::empty({4, N}, DType::kF32);
  rotary = Tensor::empty({N, 2}, DType::kI32);
  // align_corners bilinear taps along one axis of `size` cells onto the table's `side` cells
  auto taps = [&](int64_t index, int64_t size, int64_t (&at)[2], float (&wt)[2]) {
    const float src = float(index) * float(side - 1) / float(std::max<int64_t>(size - 1, 1));
    const float f = std::floor(src);
    for (int k = 0; k < 2; ++k) {
      at[k] = std::clamp<int64_t>(int64_t(f) + k, 0, side - 1);
      wt[k] = std::max(0.0f, 1.0f - std::fabs(src - f - float(k)));
    }
  };
  int64_t row = 0;
  for (const auto& it : items) {
    const int64_t h = it.grid_h, w = it.grid_w, blocks_w = w / m;
    for (int64_t t = 0; t < it.grid_t; ++t)
      for (int64_t i = 0; i < h * w; ++i, ++row) {  // merge-block order: (block row, block col, row, col)
        const int64_t r = (i / (m * m * blocks_w)) * m + (i / m) % m, c = ((i / (m * m)) % blocks_w) * m + i % m;
        rotary.ptr<int32_t>()[row * 2] = int32_t(r);
        rotary.ptr<int32_t>()[row * 2 + 1] = int32_t(c);
        int64_t hr[2], wc[2];
        float hw[2], ww[2];
        taps(r, h, hr, hw);
        taps(c, w, wc, ww);
        for (int a = 0; a < 2; ++a)
          for (int b = 0; b < 2; ++b) {
            tap_rows.ptr<int32_t>()[(2 * a + b) * N + row] = int32_t(hr[a] * side + wc[b]);
            tap_weights.ptr<float>()[(2 * a + b) * N + row] = hw[a] * ww[b];
          }
      }
  }
  tap_rows = tap_rows.to(device_), tap_weights = tap_weights.to(device_);
  Tensor identity = Tensor::empty({N}, DType::kI32);
  for (int64_t i = 0; i < N; ++i) identity.ptr<int32_t>()[i] = int32_t(i);
  identity = identity.to(device_);
  table_rows = Tensor::empty({N, H}, DType::kF32, device_);
  Tensor tap = Tensor::uninitialized({N, H}, DType::kF32, device_);
  for (int64_t k = 0; k < 4; ++k) {
    ops::gather_rows(pos_table_, tap_rows.slice_rows(k, k + 1).view({N}), tap);
    ops::scatter_add_rows(table_rows, identity, tap_weights.slice_rows(k, k + 1).view({N}), tap);
  }
}

Tensor VisionEncoder::encode(const std::vector<VisionItem>& items) {
  const int64_t H = cfg_.hidden_size, P = cfg_.patch_dim(), heads = cfg_.num_heads, D = H / heads;
  const int64_t unit = cfg_.merge_unit();
  int64_t N = 0;
  int32_t side = 1, longest = 1;
  std::vector<int32_t> starts{0};
  for (const auto& it : items) {
    RV_CHECK(it.grid_t >= 1 && it.grid_h > 0 && it.grid_w > 0 && it.grid_h % cfg_.spatial_merge_size == 0 &&
                 it.grid_w % cfg_.spatial_merge_size == 0,
             "vision encoder: a grid of ", it.grid_t, " x ", it.grid_h, " x ", it.grid_w,
             " patches (height and width multiples of ", cfg_.spatial_merge_size, ")");
    for (int32_t t = 0; t < it.grid_t; ++t) starts.push_back(starts.back() + it.grid_h * it.grid_w);
    N += it.patches();
    side = std::max({side, it.grid_h, it.grid_w});
    longest = std::max(longest, it.grid_h * it.grid_w);
  }
  if (N == 0) return Tensor::empty({0, cfg_.out_hidden_size}, DType::kF32);
  grow_rope(side);
  Tensor pixels = Tensor::empty({N, P}, DType::kF32);
  int64_t at = 0;
  for (const auto& it : items) {
    std::memcpy(pixels.ptr<float>() + at * P, it.pixels, size_t(it.patches() * P) * sizeof(float));
    at += it.patches();
  }
  Tensor table_rows, rotary;
  positions(items, table_rows, rotary);
  Tensor seq_starts = Tensor::empty({int64_t(starts.size())}, DType::kI32);
  std::copy(starts.begin(), starts.end(), seq_starts.ptr<int32_t>());
  pixels = pixels.to(device_), rotary = rotary.to(device_);
  seq_starts = seq_starts.to(device_);

  Tensor x = apply(patch_, pixels);
  ops::accumulate(x, table_rows);
  Tensor y = Tensor::uninitialized({N, H}, DType::kF32, device_);
  auto heads_shaped = [&] { return Tensor::uninitialized({N, heads, D}, DType::kF32, device_); };
  Tensor q = heads_shaped(), k = heads_shaped(), v = heads_shaped(), attn = heads_shaped();
  const bool tanh = cfg_.hidden_act == "gelu_pytorch_tanh";
  std::vector<Tensor> features(deepstack_.size());
  for (size_t l = 0; l < blocks_.size(); ++l) {
    const Block& b = blocks_[l];
    ops::layer_norm(x, b.norm1.weight, b.norm1.bias, 1e-6f, y);
    Tensor qkv = apply(b.qkv, y);
    Tensor q2 = q.view({N, H}), k2 = k.view({N, H}), v2 = v.view({N, H});
    ops::copy_columns(qkv, 0, q2);
    ops::copy_columns(qkv, H, k2);
    ops::copy_columns(qkv, 2 * H, v2);
    ops::rope(q, rotary, rope_);
    ops::rope(k, rotary, rope_);
    ops::varlen_attention(q, k, v, seq_starts, longest, 1.0f / std::sqrt(float(D)), attn);
    ops::accumulate(x, apply(b.proj, attn.view({N, H})));
    ops::layer_norm(x, b.norm2.weight, b.norm2.bias, 1e-6f, y);
    Tensor hidden = apply(b.fc1, y);
    ops::gelu(hidden, tanh);
    ops::accumulate(x, apply(b.fc2, hidden));
    for (size_t k = 0; k < deepstack_.size(); ++k)
      if (cfg_.deepstack_layers[k] == int32_t(l)) features[k] = merge(deepstack_[k], x);
  }
  Tensor main = merge(merger_, x);
  if (deepstack_.empty()) return main.to(Device::kCPU);
  // [main | deepstack 0 | deepstack 1 ...] per token row
  const int64_t O = cfg_.out_hidden_size, rows = N / unit, parts = 1 + int64_t(features.size());
  Tensor out = Tensor::empty({rows, O * parts}, DType::kF32);
  for (int64_t k = 0; k < parts; ++k) {
    const Tensor part = (k == 0 ? main : features[size_t(k - 1)]).to(Device::kCPU);
    for (int64_t r = 0; r < rows; ++r) std::copy_n(part.ptr<float>() + r * O, O, out.ptr<float>() + (r * parts + k) * O);
  }
  return out;
}

}  // namespace revolta
