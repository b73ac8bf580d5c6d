#include "core/safetensors.h"

#include <cstring>

#include "core/error.h"
#include "core/file_mapping.h"
#include "core/json.h"

namespace revolta {

SafetensorsFile::SafetensorsFile(const std::string& path) : path_(path) {
  auto map = map_file(path);
  RV_CHECK(map->size >= 8, "corrupt safetensors file ", path, ": shorter than its 8-byte header");
  const char* base = map->data;
  uint64_t header_len;
  std::memcpy(&header_len, base, 8);
  RV_CHECK(header_len <= map->size - 8, "corrupt safetensors file ", path, ": header length ",
           header_len, " exceeds the file size ", map->size);
  Json header;
  try {
    header = Json::parse(std::string(base + 8, header_len));
  } catch (const std::exception& e) {
    throw std::runtime_error(str_cat("corrupt safetensors file ", path, ": header: ", e.what()));
  }
  RV_CHECK(header.is_object(), "corrupt safetensors file ", path, ": header is not an object");
  const char* data = base + 8 + header_len;
  size_t data_size = map->size - 8 - header_len;
  for (const auto& [name, info] : header.as_object()) {
    if (name == "__metadata__") continue;
    try {
      SafetensorsEntry e;
      e.dtype = parse_dtype(info["dtype"].as_string());
      int64_t numel = 1;
      for (const auto& d : info["shape"].as_array()) {
        e.shape.push_back(d.as_int());
        numel *= e.shape.back();
      }
      const auto& offs = info["data_offsets"].as_array();
      RV_CHECK(offs.size() == 2, "data_offsets must have two entries");
      size_t b = size_t(offs[0].as_int()), en = size_t(offs[1].as_int());
      RV_CHECK(b <= en && en <= data_size, "data_offsets [", b, ", ", en,
               ") outside the data section of ", data_size, " bytes");
      e.nbytes = en - b;
      RV_CHECK(e.nbytes == size_t(numel) * dtype_size(e.dtype), "byte size ", e.nbytes,
               " does not match its shape and dtype");
      e.data = data + b;
      entries_[name] = std::move(e);
    } catch (const std::exception& ex) {
      throw std::runtime_error(
          str_cat("corrupt safetensors file ", path, ": tensor '", name, "': ", ex.what()));
    }
  }
  mapping_ = std::move(map);
}

Tensor SafetensorsFile::tensor(const std::string& name) const {
  auto it = entries_.find(name);
  RV_CHECK(it != entries_.end(), "tensor '", name, "' not found in ", path_);
  const auto& e = it->second;
  return Tensor::wrap(const_cast<void*>(e.data), e.shape, e.dtype, mapping_);
}

}  // namespace revolta
