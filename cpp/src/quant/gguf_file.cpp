#include "quant/gguf_file.h"

#include <cstring>

#include "core/error.h"
#include "quant/gguf_blocks.h"

namespace revolta {
namespace {

// A cursor over the mapped bytes that throws, naming the file, instead of reading past its end.
class Reader {
 public:
  Reader(const char* data, size_t size, const std::string& path) : p_(data), end_(data + size), base_(data), path_(path) {}
  template <typename T>
  T pod() {
    need(sizeof(T));
    T v;
    std::memcpy(&v, p_, sizeof(T));
    p_ += sizeof(T);
    return v;
  }
  std::string str() {
    const uint64_t n = pod<uint64_t>();
    need(n);
    std::string s(p_, size_t(n));
    p_ += n;
    return s;
  }
  size_t offset() const { return size_t(p_ - base_); }
  [[noreturn]] void fail(const std::string& what) const {
    throw std::runtime_error(str_cat("corrupt GGUF file ", path_, ": ", what));
  }
  void need(uint64_t n) const {
    if (n > uint64_t(end_ - p_)) fail(str_cat("truncated at byte ", offset(), " (", n, " more bytes needed)"));
  }

 private:
  const char* p_;
  const char* end_;
  const char* base_;
  const std::string& path_;
};

GgufValue read_value(Reader& r, uint32_t type, int depth) {
  GgufValue v;
  switch (type) {
    case 0: v.i = r.pod<uint8_t>(); break;
    case 1: v.i = r.pod<int8_t>(); break;
    case 2: v.i = r.pod<uint16_t>(); break;
    case 3: v.i = r.pod<int16_t>(); break;
    case 4: v.i = r.pod<uint32_t>(); break;
    case 5: v.i = r.pod<int32_t>(); break;
    case 10: v.i = int64_t(r.pod<uint64_t>()); break;
    case 11: v.i = r.pod<int64_t>(); break;
    case 6: v.kind = GgufValue::Kind::kFloat, v.f = r.pod<float>(); break;
    case 12: v.kind = GgufValue::Kind::kFloat, v.f = r.pod<double>(); break;
    case 7: v.kind = GgufValue::Kind::kBool, v.i = r.pod<uint8_t>() != 0; break;
    case 8: v.kind = GgufValue::Kind::kString, v.s = r.str(); break;
    case 9: {
      if (depth > 4) r.fail("arrays nested too deeply");
      v.kind = GgufValue::Kind::kArray;
      const uint32_t elem = r.pod<uint32_t>();
      const uint64_t n = r.pod<uint64_t>();
      r.need(n);  // every element takes at least one byte
      v.array.reserve(size_t(n));
      for (uint64_t k = 0; k < n; ++k) v.array.push_back(read_value(r, elem, depth + 1));
      break;
    }
    default: r.fail(str_cat("unknown metadata value type ", type));
  }
  return v;
}

}  // namespace

GgufFile::GgufFile(const std::string& path) : path_(path), map_(map_file(path)) {
  Reader r(map_->data, map_->size, path_);
  if (r.pod<uint32_t>() != 0x46554747u) r.fail("no GGUF magic at the start");
  version_ = r.pod<uint32_t>();
  if (version_ != 2 && version_ != 3) r.fail(str_cat("version ", version_, " (2 and 3 are read)"));
  const uint64_t num_tensors = r.pod<uint64_t>(), num_kv = r.pod<uint64_t>();
  r.need(num_kv);
  for (uint64_t k = 0; k < num_kv; ++k) {
    std::string key = r.str();
    const uint32_t type = r.pod<uint32_t>();
    metadata_[key] = read_value(r, type, 0);
  }
  r.need(num_tensors);
  struct Info {
    uint64_t offset;
  };
  std::vector<Info> offsets;
  for (uint64_t k = 0; k < num_tensors; ++k) {
    GgufTensor t;
    t.name = r.str();
    const uint32_t dims = r.pod<uint32_t>();
    if (dims == 0 || dims > 4) r.fail(str_cat("tensor '", t.name, "' has ", dims, " dimensions"));
    int64_t n = 1;
    for (uint32_t d = 0; d < dims; ++d) {
      const uint64_t ne = r.pod<uint64_t>();
      if (ne == 0 || ne > (uint64_t(1) << 40) || n > (int64_t(1) << 42) / int64_t(ne))
        r.fail(str_cat("tensor '", t.name, "' has dimension ", ne));
      t.shape.insert(t.shape.begin(), int64_t(ne));
      n *= int64_t(ne);
    }
    t.type = r.pod<uint32_t>();
    try {
      t.nbytes = dtype_bytes(dtype_of_gguf(t.type), n);
    } catch (const std::exception& e) {
      r.fail(str_cat("tensor '", t.name, "': ", e.what()));
    }
    offsets.push_back({r.pod<uint64_t>()});
    tensors_.push_back(std::move(t));
  }
  uint64_t alignment = 32;
  if (auto it = metadata_.find("general.alignment"); it != metadata_.end()) alignment = uint64_t(it->second.i);
  if (alignment == 0 || (alignment & (alignment - 1))) r.fail(str_cat("general.alignment ", alignment));
  const uint64_t data_start = (r.offset() + alignment - 1) / alignment * alignment;
  for (size_t k = 0; k < tensors_.size(); ++k) {
    GgufTensor& t = tensors_[k];
    const uint64_t at = data_start + offsets[k].offset;
    if (offsets[k].offset > map_->size || at > map_->size || uint64_t(t.nbytes) > map_->size - at)
      r.fail(str_cat("tensor '", t.name, "' (", t.nbytes, " bytes at ", at, ") ends past the file's ", map_->size,
                     " bytes: truncated"));
    t.data = map_->data + at;
    if (!index_.emplace(t.name, k).second) r.fail(str_cat("tensor '", t.name, "' appears twice"));
  }
}

const GgufTensor* GgufFile::find(const std::string& name) const {
  const auto it = index_.find(name);
  return it == index_.end() ? nullptr : &tensors_[it->second];
}

}  // namespace revolta
