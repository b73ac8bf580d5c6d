// Finds named tensors across the safetensors shards of a model directory, converts them to the
// storage dtype the engine runs with and places them on the engine's device. In dummy mode
// (load_format=dummy) no file is read: every tensor asked for is made up, filled on the device
// with uniform random values (1-D tensors, the norms, with values around 1), so benchmarks can run
// at real model shapes from a config.json alone. In GGUF mode (load_format=gguf) the tensors come
// from the GGUF file that gguf_weights.json in dir names (HF name -> GGUF name, and the heads of
// Q / K rows stored in llama.cpp's rotary order), and matrices stored in quantized blocks stay in
// them, whatever element type is asked for; stacked parts must then share their block type. AWQ
// linear weights (X.qweight / X.qzeros / X.scales, asked for as X.weight) become 4-bit group
// blocks the same way, FP8 ones (X.weight in F8_E4M3 with X.weight_scale[_inv]) FP8 blocks, and
// NVFP4 ones (X.weight packed E2M1, X.weight_scale E4M3, X.weight_scale_2) NVFP4 blocks.
#pragma once

#include <map>
#include <memory>
#include <string>
#include <vector>

#include "core/safetensors.h"
#include "dist/communicator.h"
#include "ops/ops.h"
#include "quant/gguf_file.h"

namespace revolta {

// A tensor-parallel rank's part of a 2-D tensor: rows [begin, end) (dim 0, a column-parallel
// linear's output rows), columns [begin, end) (dim 1, a row-parallel linear's inputs), or both
// (dim 2: rows [begin, end) and columns [col_begin, col_end), an expert's block of a fused 3-D
// expert tensor read as 2-D); dim -1: the whole tensor. Columns of a matrix in quantized blocks
// must cut at whole blocks.
struct Slice {
  int dim = -1;
  int64_t begin = 0, end = 0, col_begin = 0, col_end = 0;
  static Slice rows(int64_t b, int64_t e) { return {0, b, e}; }
  static Slice cols(int64_t b, int64_t e) { return {1, b, e}; }
  static Slice block(int64_t r0, int64_t r1, int64_t c0, int64_t c1) { return {2, r0, r1, c0, c1}; }
};

class WeightLoader {
 public:
  // Opens model.safetensors.index.json when present, otherwise every *.safetensors in dir.
  explicit WeightLoader(const std::string& dir, Device device = Device::kCPU, bool dummy = false, bool gguf = false);
  bool has(const std::string& name) const;
  // The tensor converted to dtype, with its shape checked, on the loader's device or on `on`
  // (host copies for weights a model rearranges before placing them). Throws naming the tensor
  // when it is missing or shaped differently.
  Tensor get(const std::string& name, const std::vector<int64_t>& shape, DType dtype) const;
  Tensor get(const std::string& name, const std::vector<int64_t>& shape, DType dtype, Device on) const;
  // Several [rows_i, cols] tensors stacked along rows into one (fused projections).
  Tensor get_stacked(const std::vector<std::string>& names,
                     const std::vector<std::vector<int64_t>>& shapes, DType dtype) const;
  Tensor get_stacked(const std::vector<std::string>& names, const std::vector<std::vector<int64_t>>& shapes,
                     DType dtype, Device on) const;
  // The tensor as its safetensors file stores it (its element type; shape checked), a view into the
  // file's mapping: nothing is read until its pages are touched. Elsewhere (made-up weights, GGUF)
  // the same as get() into host memory.
  Tensor mapped(const std::string& name, const std::vector<int64_t>& shape, DType fallback) const;
  // A linear layer's weights, which may stay in quantized blocks (the op table's linear takes
  // them): AWQ checkpoints, and with load_format dummy the block type set_dummy_blocks names.
  Tensor get_linear(const std::string& name, const std::vector<int64_t>& shape, DType dtype) const;
  Tensor get_stacked_linear(const std::vector<std::string>& names, const std::vector<std::vector<int64_t>>& shapes,
                            DType dtype) const;
  // The same with each part (`shapes` are the whole tensors', as stored, or a 3-D tensor's as 2-D:
  // its leading dimensions merged) cut to its slice: only the slice's bytes are read; stacked parts
  // must all cut rows, or all the same columns.
  Tensor get_sliced(const std::vector<std::string>& names, const std::vector<std::vector<int64_t>>& shapes,
                    const std::vector<Slice>& slices, DType dtype, bool linear) const;
  Tensor get_sliced(const std::vector<std::string>& names, const std::vector<std::vector<int64_t>>& shapes,
                    const std::vector<Slice>& slices, DType dtype, bool linear, Device on) const;
  void set_dummy_blocks(DType t) { dummy_blocks_ = t; }
  // The tensor-parallel group the loading rank belongs to (null: none); sharded models take their
  // slices by its rank and sum their partial outputs through it.
  // expert_parallel: MoE models give each rank whole experts rather than a share of every one.
  void set_tensor_parallel(Communicator* tp, bool expert_parallel = false) { tp_ = tp, expert_parallel_ = expert_parallel; }
  Communicator* tensor_parallel() const { return tp_; }
  bool expert_parallel() const { return tp_ && expert_parallel_; }
  // Made-up weights in a quantized format: a model reads its experts per expert, as quantized
  // checkpoints hold them (a fused [E, ...] tensor is not a linear layer's).
  bool dummy_quantized() const { return dummy_ && is_block_dtype(dummy_blocks_); }
  std::vector<std::string> names() const;
  std::vector<int64_t> shape(const std::string& name) const;
  const std::string& dir() const { return dir_; }
  Device device() const { return device_; }
  bool dummy() const { return dummy_; }

 private:
  const SafetensorsEntry& entry(const std::string& name) const;
  // AWQ: the prefix of `name` (".weight" dropped) when the model holds it as qweight / qzeros /
  // scales, else empty; awq_entry repacks those into blocks held by storage (quant/int4_groups.h).
  std::string awq_base(const std::string& name) const;
  SafetensorsEntry awq_entry(const std::string& base, std::vector<uint8_t>& storage) const;
  // FP8: an F8_E4M3 matrix with its scales applied, as blocks (a linear layer's, K a multiple of
  // 128) or as float32 (quant/fp8_blocks.h).
  SafetensorsEntry fp8_entry(const std::string& name, const SafetensorsEntry& e, bool blocks,
                             std::vector<uint8_t>& storage) const;
  // NVFP4 (ModelOpt): the prefix of `name` when it holds packed E2M1 values with weight_scale and
  // weight_scale_2 beside them, else empty; nvfp4_entry makes blocks or float32 of them.
  std::string nvfp4_base(const std::string& name) const;
  SafetensorsEntry nvfp4_entry(const std::string& base, const SafetensorsEntry& e, bool blocks,
                               std::vector<uint8_t>& storage) const;
  // GGUF mode: rows of a Q / K matrix regrouped from llama.cpp's rotary order (0: as stored).
  int32_t rope_heads(const std::string& name) const;
  Tensor load(const std::vector<std::string>& names, const std::vector<std::vector<int64_t>>& shapes, DType dtype,
             Device on, bool linear, const std::vector<Slice>& slices = {}) const;
  Tensor make_dummy(const std::string& name, std::vector<int64_t> shape, DType dtype, Device on) const;
  // t: the made-up values of `name` (a tensor of shape `whole`), or of its part at `at`.
  void fill_dummy(Tensor& t, const std::string& name, const std::vector<int64_t>& whole, const ops::FillWindow& at) const;
  std::string dir_;
  Device device_ = Device::kCPU;
  bool dummy_ = false;
  DType dummy_blocks_ = DType::kF32;  // kF32: dummy linear weights in the model's dtype
  Communicator* tp_ = nullptr;
  bool expert_parallel_ = false;
  std::vector<std::unique_ptr<SafetensorsFile>> files_;
  std::map<std::string, const SafetensorsFile*> where_;
  std::unique_ptr<GgufFile> gguf_;
  std::map<std::string, std::pair<SafetensorsEntry, int32_t>> gguf_entries_;  // HF name -> tensor, rope heads
};

}  // namespace revolta
