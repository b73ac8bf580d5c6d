#include "model/weights.h"

#include <algorithm>
#include <cmath>
#include <functional>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <set>
#include <sstream>

#include "core/error.h"
#include "core/json.h"
#include "ops/ops.h"
#include "quant/fp8_blocks.h"
#include "quant/gguf_blocks.h"
#include "quant/int4_groups.h"

namespace revolta {
namespace fs = std::filesystem;

WeightLoader::WeightLoader(const std::string& dir, Device device, bool dummy, bool gguf)
    : dir_(dir), device_(device), dummy_(dummy) {
  if (dummy_) return;
  if (gguf) {
    const fs::path map_path = fs::path(dir) / "gguf_weights.json";
    RV_CHECK(fs::exists(map_path), "load_format 'gguf': no gguf_weights.json in ", dir,
             " (pass the .gguf file as the model; it is prepared on first use)");
    std::ifstream f(map_path);
    std::stringstream ss;
    ss << f.rdbuf();
    const Json j = Json::parse(ss.str());
    gguf_ = std::make_unique<GgufFile>(j["file"].as_string());
    for (const auto& [hf, v] : j["tensors"].as_object()) {
      const std::string& name = v.as_array().at(0).as_string();
      const GgufTensor* t = gguf_->find(name);
      RV_CHECK(t, "GGUF file ", gguf_->path(), " has no tensor '", name, "' (named for ", hf, ")");
      gguf_entries_[hf] = {SafetensorsEntry{dtype_of_gguf(t->type), t->shape, t->data, size_t(t->nbytes)},
                           int32_t(v.as_array().at(1).as_int())};
    }
    return;
  }
  std::vector<std::string> shard_names;
  fs::path index = fs::path(dir) / "model.safetensors.index.json";
  if (fs::exists(index)) {
    std::ifstream f(index);
    std::stringstream ss;
    ss << f.rdbuf();
    Json j = Json::parse(ss.str());
    std::set<std::string> uniq;
    for (const auto& [name, file] : j["weight_map"].as_object()) uniq.insert(file.as_string());
    shard_names.assign(uniq.begin(), uniq.end());
  } else {
    for (const auto& e : fs::directory_iterator(dir))
      if (e.path().extension() == ".safetensors") shard_names.push_back(e.path().filename());
    std::sort(shard_names.begin(), shard_names.end());
  }
  RV_CHECK(!shard_names.empty(), "no *.safetensors weights found in ", dir);
  for (const auto& name : shard_names) {
    fs::path p = fs::path(dir) / name;
    RV_CHECK(fs::exists(p), "weight shard ", p.string(), " listed in the index does not exist");
    files_.push_back(std::make_unique<SafetensorsFile>(p.string()));
    for (const auto& [tname, entry] : files_.back()->entries()) where_[tname] = files_.back().get();
  }
}

bool WeightLoader::has(const std::string& name) const {
  return dummy_ || where_.count(name) > 0 || gguf_entries_.count(name) > 0 || !awq_base(name).empty();
}
int32_t WeightLoader::rope_heads(const std::string& name) const {
  const auto it = gguf_entries_.find(name);
  return it == gguf_entries_.end() ? 0 : it->second.second;
}

std::vector<std::string> WeightLoader::names() const {
  std::vector<std::string> out;
  for (const auto& [n, f] : where_) out.push_back(n);
  for (const auto& [n, e] : gguf_entries_) out.push_back(n);
  return out;
}

std::vector<int64_t> WeightLoader::shape(const std::string& name) const {
  if (!nvfp4_base(name).empty()) return {entry(name).shape.at(0), entry(name).shape.at(1) * 2};
  if (const std::string base = awq_base(name); !base.empty() && !where_.count(name)) {
    const auto& qw = where_.at(base + ".qweight")->entries().at(base + ".qweight");
    return {qw.shape.size() == 2 ? qw.shape[1] * 8 : 0, qw.shape.empty() ? 0 : qw.shape[0]};
  }
  return entry(name).shape;
}

const SafetensorsEntry& WeightLoader::entry(const std::string& name) const {
  if (const auto g = gguf_entries_.find(name); g != gguf_entries_.end()) return g->second.first;
  auto it = where_.find(name);
  RV_CHECK(it != where_.end(), "model ", dir_, ": missing tensor '", name, "'");
  return it->second->entries().at(name);
}

Tensor WeightLoader::get(const std::string& name, const std::vector<int64_t>& shape,
                         DType dtype) const {
  return get(name, shape, dtype, device_);
}

Tensor WeightLoader::get(const std::string& name, const std::vector<int64_t>& shape, DType dtype, Device on) const {
  return get_stacked({name}, {shape}, dtype, on).view(shape);
}

Tensor WeightLoader::mapped(const std::string& name, const std::vector<int64_t>& shape, DType fallback) const {
  const auto it = where_.find(name);
  if (dummy_ || it == where_.end()) return get(name, shape, fallback, Device::kCPU);
  Tensor t = it->second->tensor(name);
  RV_CHECK(t.shape() == shape, "model ", dir_, ": tensor '", name, "' is ", t.shape_str(), ", expected ",
           shape_text(shape));
  return t;
}

Tensor WeightLoader::make_dummy(const std::string& name, std::vector<int64_t> shape, DType dtype, Device on) const {
  Tensor t = Tensor::uninitialized(shape, dtype, on);
  fill_dummy(t, name, shape, {});
  return t;
}

void WeightLoader::fill_dummy(Tensor& t, const std::string& name, const std::vector<int64_t>& whole,
                              const ops::FillWindow& at) const {
  const uint64_t seed = std::hash<std::string>{}(name);
  if (whole.size() == 1) {
    ops::fill_uniform(t, seed, 0.9f, 1.1f, at);  // norm weights
  } else {
    const float a = 1.0f / std::sqrt(float(whole.back()));  // keeps activations O(1) through the layers
    ops::fill_uniform(t, seed, -a, a, at);
  }
}

Tensor WeightLoader::get_stacked(const std::vector<std::string>& names,
                                 const std::vector<std::vector<int64_t>>& shapes,
                                 DType dtype) const {
  return get_stacked(names, shapes, dtype, device_);
}

Tensor WeightLoader::get_stacked(const std::vector<std::string>& names,
                                 const std::vector<std::vector<int64_t>>& shapes, DType dtype, Device on) const {
  return load(names, shapes, dtype, on, false);
}

Tensor WeightLoader::get_linear(const std::string& name, const std::vector<int64_t>& shape, DType dtype) const {
  return load({name}, {shape}, dtype, device_, true).view(shape);
}

Tensor WeightLoader::get_stacked_linear(const std::vector<std::string>& names,
                                        const std::vector<std::vector<int64_t>>& shapes, DType dtype) const {
  return load(names, shapes, dtype, device_, true);
}

Tensor WeightLoader::get_sliced(const std::vector<std::string>& names, const std::vector<std::vector<int64_t>>& shapes,
                                const std::vector<Slice>& slices, DType dtype, bool linear) const {
  return get_sliced(names, shapes, slices, dtype, linear, device_);
}

Tensor WeightLoader::get_sliced(const std::vector<std::string>& names, const std::vector<std::vector<int64_t>>& shapes,
                                const std::vector<Slice>& slices, DType dtype, bool linear, Device on) const {
  RV_CHECK(slices.size() == names.size(), "get_sliced: a slice per tensor");
  bool whole = true;  // slices of everything (one rank) load as the plain tensors do
  for (size_t i = 0; i < slices.size(); ++i) {
    const Slice& s = slices[i];
    int64_t extent = 1;
    if (s.dim == 0 && !shapes[i].empty()) extent = shapes[i][0];
    for (size_t d = 1; s.dim == 1 && d < shapes[i].size(); ++d) extent *= shapes[i][d];
    whole = whole && (s.dim < 0 || (s.dim < 2 && s.begin == 0 && s.end == extent));
  }
  return load(names, shapes, dtype, on, linear, whole ? std::vector<Slice>{} : slices);
}

namespace {

// The part of a [rows, cols] tensor a slice keeps: its first row and column and its extent.
struct Cut {
  int64_t row0, rows, col0, cols;
};

Cut cut_of(const Slice& s, int64_t rows, int64_t cols, const std::string& name) {
  if (s.dim < 0) return {0, rows, 0, cols};
  if (s.dim == 2) {
    const Cut r = cut_of(Slice::rows(s.begin, s.end), rows, cols, name), c = cut_of(Slice::cols(s.col_begin, s.col_end), rows, cols, name);
    return {r.row0, r.rows, c.col0, c.cols};
  }
  const int64_t extent = s.dim == 0 ? rows : cols;
  RV_CHECK(s.dim <= 1 && 0 <= s.begin && s.begin < s.end && s.end <= extent, "tensor '", name, "': slice [", s.begin,
           ", ", s.end, ") of dim ", s.dim, " is outside its ", extent);
  return s.dim == 0 ? Cut{s.begin, s.end - s.begin, 0, cols} : Cut{0, rows, s.begin, s.end - s.begin};
}

}  // namespace

Tensor WeightLoader::load(const std::vector<std::string>& names, const std::vector<std::vector<int64_t>>& shapes,
                          DType dtype, Device on, bool linear, const std::vector<Slice>& slices) const {
  auto slice_of = [&](size_t i) { return slices.empty() ? Slice{} : slices[i]; };
  auto cols_of = [](const std::vector<int64_t>& shape) {
    int64_t c = 1;
    for (size_t d = 1; d < shape.size(); ++d) c *= shape[d];
    return c;
  };
  if (dummy_) {
    std::vector<int64_t> shape = shapes[0];  // of the stacked whole, and its values' key
    std::string key;
    for (size_t i = 0; i < names.size(); ++i) {
      key += names[i] + ";";
      if (i > 0 && !shape.empty()) shape[0] += shapes[i].empty() ? 1 : shapes[i][0];
    }
    const bool blocks = linear && is_block_dtype(dummy_blocks_) && shape.size() == 2 &&
                        shape[1] % dtype_block_values(dummy_blocks_) == 0;
    if (!slices.empty() && !blocks) {  // each part drawn where it sits in the stacked whole, on `on`
      const int64_t cols = cols_of(shapes[0]);
      std::vector<Cut> cuts;
      int64_t rows = 0;
      for (size_t i = 0; i < names.size(); ++i) {
        cuts.push_back(cut_of(slice_of(i), shapes[i].empty() ? 1 : shapes[i][0], cols, names[i]));
        rows += cuts.back().rows;
      }
      Tensor out = Tensor::uninitialized({rows, cuts[0].cols}, dtype, on);
      int64_t first = 0, at = 0;
      for (size_t i = 0; i < names.size(); ++i) {
        Tensor part = out.slice_rows(at, at + cuts[i].rows);
        fill_dummy(part, key, shape, ops::FillWindow{first + cuts[i].row0, cuts[i].col0, cols});
        first += shapes[i].empty() ? 1 : shapes[i][0];
        at += cuts[i].rows;
      }
      return out;
    }
    if (!slices.empty()) {  // blocks: made up whole (stacked as unsliced), then cut
      const Tensor stacked = load(names, shapes, dtype, Device::kCPU, linear);
      int64_t total = 0;
      for (const auto& shape : shapes) total += shape.empty() ? 1 : shape[0];
      const Tensor whole = stacked.view({total, cols_of(shapes[0])});
      std::vector<Tensor> parts;
      int64_t rows = 0, first = 0;
      for (size_t i = 0; i < names.size(); ++i) {
        const int64_t part_rows = shapes[i].empty() ? 1 : shapes[i][0];
        const Cut c = cut_of(slice_of(i), part_rows, whole.size(1), names[i]);
        Tensor part = Tensor::empty({c.rows, c.cols}, whole.dtype());
        const int64_t src_row = dtype_bytes(whole.dtype(), whole.size(1)), bytes = dtype_bytes(whole.dtype(), c.cols);
        for (int64_t r = 0; r < c.rows; ++r)
          std::memcpy(static_cast<char*>(part.data()) + r * bytes,
                      static_cast<const char*>(whole.data()) + (first + c.row0 + r) * src_row +
                          dtype_bytes(whole.dtype(), c.col0),
                      size_t(bytes));
        first += part_rows;
        rows += c.rows;
        parts.push_back(std::move(part));
      }
      Tensor out = Tensor::empty({rows, parts[0].size(1)}, parts[0].dtype());
      char* dst = static_cast<char*>(out.data());
      for (const Tensor& p : parts) std::memcpy(dst, p.data(), p.nbytes()), dst += p.nbytes();
      return out.to(on);
    }
    if (blocks) {
      Tensor t = Tensor::empty(shape, dummy_blocks_);
      const float bound = 1.0f / std::sqrt(float(shape[1]));
      const uint64_t seed = std::hash<std::string>{}(key);
      if (dummy_blocks_ == DType::kF8G128) fill_f8_dummy(shape[0], shape[1], bound, seed, static_cast<uint8_t*>(t.data()));
      else if (dummy_blocks_ == DType::kNVFP4) fill_nvfp4_dummy(shape[0], shape[1], bound, seed, static_cast<uint8_t*>(t.data()));
      else fill_int4_dummy(dummy_blocks_, shape[0], shape[1], bound, seed, static_cast<uint8_t*>(t.data()));
      return t.to(on);
    }
    return make_dummy(key, shape, dtype, on);
  }
  // AWQ matrices are repacked into blocks first (storage holds them until they are copied).
  std::vector<std::vector<uint8_t>> storage(names.size());
  std::vector<SafetensorsEntry> entries;
  for (size_t i = 0; i < names.size(); ++i) {
    const std::string base = where_.count(names[i]) ? std::string() : awq_base(names[i]);
    if (!base.empty()) entries.push_back(awq_entry(base, storage[i]));
    else if (const std::string fp4 = nvfp4_base(names[i]); !fp4.empty())
      entries.push_back(nvfp4_entry(fp4, entry(names[i]), linear, storage[i]));
    else if (entry(names[i]).dtype == DType::kF8E4M3) entries.push_back(fp8_entry(names[i], entry(names[i]), linear, storage[i]));
    else entries.push_back(entry(names[i]));
  }
  int64_t rows = 0, cols = -1;
  std::vector<Cut> cuts;
  for (size_t i = 0; i < names.size(); ++i) {
    auto& e = entries[i];
    // A 3-D tensor may be asked for as 2-D, its leading dimensions merged (fused experts' rows).
    if (e.shape.size() == 3 && shapes[i].size() == 2 && e.shape[0] * e.shape[1] == shapes[i][0] && e.shape[2] == shapes[i][1])
      e.shape = shapes[i];
    RV_CHECK(e.shape == shapes[i], "model ", dir_, ": tensor '", names[i], "' has shape ",
             shape_text(e.shape), ", expected ", shape_text(shapes[i]));
    cuts.push_back(cut_of(slice_of(i), e.shape.empty() ? 1 : e.shape[0], cols_of(e.shape), names[i]));
    const Cut& c = cuts.back();
    RV_CHECK(cols < 0 || c.cols == cols, "cannot stack '", names[i], "': row width differs");
    RV_CHECK(c.col0 % dtype_block_values(e.dtype) == 0 && (c.col0 + c.cols) % dtype_block_values(e.dtype) == 0,
             "tensor '", names[i], "': columns [", c.col0, ", ", c.col0 + c.cols, ") cut its blocks of ",
             dtype_block_values(e.dtype), " values");
    cols = c.cols;
    rows += c.rows;
  }
  // Matrices in quantized blocks stay in them when every stacked part shares the block type: GGUF's
  // wherever asked for (CPU), AWQ's, FP8's and NVFP4's where the model takes a linear layer's weights.
  const DType first = entries[0].dtype;
  bool keep = is_block_dtype(first) && (gguf_ || linear);
  for (const auto& e : entries) keep = keep && e.dtype == first && e.shape.size() == 2;
  const DType out_dtype = keep ? first : dtype;
  Tensor out = Tensor::empty({rows, cols}, out_dtype);
  char* dst = static_cast<char*>(out.data());
  const int64_t dst_row = dtype_bytes(out_dtype, cols);
  std::vector<float> row;
  for (size_t i = 0; i < names.size(); ++i) {
    const std::string& name = names[i];
    const auto& e = entries[i];
    const Cut& c = cuts[i];
    const int64_t r = e.shape.empty() ? 1 : e.shape[0], src_row = dtype_bytes(e.dtype, cols_of(e.shape));
    // Row o of the tensor is stored row src(o): llama.cpp interleaves each head's two rotary halves.
    const int32_t heads = rope_heads(name);
    auto src = [&](int64_t o) {
      if (heads <= 0) return o;
      const int64_t per = r / heads, half = per / 2, h = o / per, i = (o % per) / half, k = o % half;
      return h * per + k * 2 + i;
    };
    for (int64_t o = 0; o < c.rows; ++o, dst += dst_row) {
      const char* from = static_cast<const char*>(e.data) + src(c.row0 + o) * src_row + dtype_bytes(e.dtype, c.col0);
      if (keep || e.dtype == out_dtype) {
        std::memcpy(dst, from, size_t(dst_row));
        continue;
      }
      row.resize(size_t(cols));
      if (is_block_dtype(e.dtype)) dequantize(e.dtype, from, row.data(), cols);
      else convert_to_f32(from, e.dtype, row.data(), size_t(cols));
      if (out_dtype == DType::kF16) {  // bf16/f32 checkpoints on a device without bf16: values must fit
        for (float v : row)
          RV_CHECK(!(std::fabs(v) > 65504.0f), "model ", dir_, ": tensor '", name, "' holds ", v,
                   ", outside the float16 range (|x| <= 65504); run it in float32 or bfloat16 on the CPU");
      }
      convert_from_f32(row.data(), dst, out_dtype, size_t(cols));
    }
  }
  return out.to(on);
}

}  // namespace revolta
