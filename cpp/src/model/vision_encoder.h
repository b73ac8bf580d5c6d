// The vision tower of Qwen3.5 / Qwen3-VL checkpoints (HF `model.visual.*`): pixels cut into
// (temporal, height, width) patches become tokens through
//   patch embedding (a Conv3d whose stride is its kernel: one linear layer over a flattened patch)
//   + the learned position table resampled bilinearly to the image's grid,
//   ViT blocks: LayerNorm, attention with 2-D rotary positions (height on the first quarter of the
//   frequencies, width on the second), bidirectional within one frame, and a GELU MLP,
//   the merger: spatial_merge_size^2 neighbouring patches (consecutive rows: the preprocessor
//   emits patches in merge-block order) concatenated and projected to the decoder's width.
// Qwen3-VL's deepstack layers also pass their patch rows through mergers of their own (normalised
// after the shuffle), whose outputs the decoder adds to its first layers' media rows.
// A frame of a video is encoded exactly as an image of its grid would be, so a video is a list of
// one-frame items. The tower is not sharded: under tensor parallelism rank 0 runs it.
#pragma once

#include <vector>

#include "model/model_config.h"
#include "model/weights.h"
#include "ops/ops.h"

namespace revolta {

// One image or video frame group: grid_t x grid_h x grid_w patches of patch_dim values each, in the
// preprocessor's order (HF processors' pixel_values rows).
struct VisionItem {
  const float* pixels = nullptr;
  int32_t grid_t = 1, grid_h = 0, grid_w = 0;
  int64_t patches() const { return int64_t(grid_t) * grid_h * grid_w; }
};

class VisionEncoder {
 public:
  // Reads the tower under "model.visual." (or "visual.") onto `device`.
  VisionEncoder(const WeightLoader& w, const VisionConfig& c, DType dt, Device device);
  // The items' tokens, one after another: f32 [sum of patches / merge_unit, out_hidden_size * (1 +
  // deepstack layers)] on the host: the merger's output, then each deepstack layer's features.
  Tensor encode(const std::vector<VisionItem>& items);
  int64_t weight_bytes() const { return bytes_; }
  const VisionConfig& config() const { return cfg_; }

 private:
  struct Linear {
    Tensor weight, bias;
  };
  struct Norm {
    Tensor weight, bias;
  };
  struct Block {
    Norm norm1, norm2;
    Linear qkv, proj, fc1, fc2;
  };
  Linear linear(const WeightLoader& w, const std::string& name, int64_t out, int64_t in);
  Norm norm(const WeightLoader& w, const std::string& name, int64_t n);
  Tensor apply(const Linear& l, const Tensor& x);
  // The resampled position table rows of every patch, and its (height, width) rotary positions.
  void positions(const std::vector<VisionItem>& items, Tensor& table_rows, Tensor& rotary) const;
  void grow_rope(int32_t side);  // rotary tables that cover positions [0, side)

  VisionConfig cfg_;
  DType dtype_;
  Device device_;
  std::string prefix_;
  Linear patch_;
  Tensor pos_table_;  // [num_position_embeddings, hidden] f32
  std::vector<Block> blocks_;
  struct Merger {
    Norm norm;  // over one patch (hidden) or, after the shuffle, the merged row (deepstack)
    Linear fc1, fc2;
  };
  Merger merger(const WeightLoader& w, const std::string& name, bool postshuffle);
  // The merger over patch rows x [N, hidden]: f32 [N / merge_unit, out_hidden_size].
  Tensor merge(const Merger& m, const Tensor& x);
  Merger merger_;
  std::vector<Merger> deepstack_;  // by deepstack layer (Qwen3-VL), in config order
  ops::RopeTables rope_;
  int64_t bytes_ = 0;
};

}  // namespace revolta
