// Flash-Next's n-gram PLE table, kept off the device whatever the model runs on: read into host
// memory at load (host), or left in the checkpoint's file mapping (disk: rows are read from the
// file when first touched and the page cache keeps the hot ones). Its bytes are never part of a
// device's plan. A step's rows are gathered on the host into float32.
#pragma once

#include <string>
#include <vector>

#include "model/weights.h"

namespace revolta {

class PleTable {
 public:
  PleTable() = default;
  // The table from `parts` (one tensor, or the shards it is split into by rows), `rows` x `dim` in
  // all; host: converted to `dtype` in host memory; disk: mapped as stored.
  PleTable(const WeightLoader& w, const std::vector<std::string>& parts, int64_t rows, int64_t dim, DType dtype, bool disk);
  // out [n, dim] = the rows `ids` name (each < rows).
  void gather(const int32_t* ids, int64_t n, float* out) const;
  int64_t rows() const { return rows_; }
  int64_t dim() const { return dim_; }
  bool on_disk() const { return disk_; }

 private:
  std::vector<Tensor> parts_;
  std::vector<int64_t> first_row_;  // of each part, then rows_
  int64_t rows_ = 0, dim_ = 0;
  bool disk_ = false;
};

}  // namespace revolta
