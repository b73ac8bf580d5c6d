#include "model/ple_table.h"

#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>

#include "core/error.h"

namespace revolta {

PleTable::PleTable(const WeightLoader& w, const std::vector<std::string>& parts, int64_t rows, int64_t dim, DType dtype,
                   bool disk)
    : rows_(rows), dim_(dim), disk_(disk) {
  int64_t first = 0;
  for (const std::string& name : parts) {
    // (made-up weights have no file: equal parts)
    const int64_t n = w.dummy() ? rows / int64_t(parts.size()) : w.shape(name).at(0);
    first_row_.push_back(first);
    parts_.push_back(disk ? w.mapped(name, {n, dim}, dtype) : w.get(name, {n, dim}, dtype, Device::kCPU));
    if (disk) {  // rows are read at random: no readahead around each fault
      const uintptr_t page = uintptr_t(sysconf(_SC_PAGESIZE)), at = reinterpret_cast<uintptr_t>(parts_.back().data());
      const uintptr_t begin = at / page * page, end = at + parts_.back().nbytes();
      madvise(reinterpret_cast<void*>(begin), end - begin, MADV_RANDOM);
    }
    first += n;
  }
  RV_CHECK(first == rows, "PLE table: its parts hold ", first, " rows, the config's n-gram heads ", rows);
  first_row_.push_back(rows);
}

void PleTable::gather(const int32_t* ids, int64_t n, float* out) const {
  for (int64_t i = 0; i < n; ++i) {
    const int64_t id = ids[i];
    RV_CHECK(id >= 0 && id < rows_, "PLE table: row ", id, " outside its ", rows_, " rows");
    const size_t part = size_t(std::upper_bound(first_row_.begin(), first_row_.end(), id) - first_row_.begin() - 1);
    const Tensor& t = parts_[part];
    const size_t row_bytes = size_t(dim_) * dtype_size(t.dtype());
    convert_to_f32(static_cast<const char*>(t.data()) + size_t(id - first_row_[part]) * row_bytes, t.dtype(), out + i * dim_,
                   size_t(dim_));
  }
}

}  // namespace revolta
