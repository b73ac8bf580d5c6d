// What Flash-Next's PLE table costs a decode step off the device: the rows of `batch` tokens x
// `heads` n-gram heads gathered into float32 from host memory (ple_offload host) and from the
// checkpoint's file mapping (disk) with the page cache warm and cold, against one memcpy of as
// many contiguous bytes (the peer: what the same bytes cost without the random access).
//
//   revolta_ple_gather_bench [--rows N] [--dim D] [--heads H] [--batches 1,8,64] [--dir DIR]
//
// It writes a table of N x D bfloat16 values as a safetensors file in DIR (default: the temporary
// directory), as a checkpoint stores it. Host: the table read into host memory as float32 (what
// the CPU engine keeps) or float16 (a CUDA engine). Cold: before each step the mapping's pages are
// unmapped (madvise DONTNEED) and dropped from the page cache (posix_fadvise DONTNEED), so every
// row is read from the file again.
#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "model/ple_table.h"

using namespace revolta;
using Clock = std::chrono::steady_clock;

namespace {

std::vector<int> parse_list(const std::string& s) {
  std::vector<int> out;
  std::stringstream ss(s);
  for (std::string item; std::getline(ss, item, ',');)
    if (!item.empty()) out.push_back(std::stoi(item));
  return out;
}

// A safetensors file holding one bfloat16 tensor `name` [rows, dim] of varied values.
void write_table(const std::string& path, const std::string& name, int64_t rows, int64_t dim) {
  const std::string header = "{\"" + name + "\": {\"dtype\": \"BF16\", \"shape\": [" + std::to_string(rows) + ", " +
                             std::to_string(dim) + "], \"data_offsets\": [0, " + std::to_string(rows * dim * 2) + "]}}";
  std::ofstream f(path, std::ios::binary);
  const uint64_t n = header.size();
  f.write(reinterpret_cast<const char*>(&n), 8);
  f.write(header.data(), std::streamsize(n));
  std::vector<uint16_t> chunk(size_t(dim) * 4096);
  for (int64_t r = 0; r < rows; r += 4096) {
    const int64_t k = std::min<int64_t>(4096, rows - r);
    for (int64_t i = 0; i < k * dim; ++i) chunk[size_t(i)] = uint16_t(0x3c00 + ((r * dim + i) * 2654435761u >> 20) % 512);
    f.write(reinterpret_cast<const char*>(chunk.data()), std::streamsize(k * dim * 2));
  }
}

void drop_pages(const std::string& path, const Tensor& mapped) {
  const uintptr_t page = uintptr_t(sysconf(_SC_PAGESIZE)), at = reinterpret_cast<uintptr_t>(mapped.data());
  const uintptr_t begin = at / page * page, end = (at + mapped.nbytes() + page - 1) / page * page;
  madvise(reinterpret_cast<void*>(begin), end - begin, MADV_DONTNEED);
  const int fd = open(path.c_str(), O_RDONLY);
  if (fd < 0) return;
  fdatasync(fd);
  posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED);
  close(fd);
}

// Microseconds a step: ids of `n` random rows gathered into out, over `steps` steps (before
// each, `before` runs outside the timing).
template <typename Before>
double per_step_us(const PleTable& t, int64_t n, int steps, std::mt19937& rng, Before before) {
  std::uniform_int_distribution<int32_t> row(0, int32_t(t.rows() - 1));
  std::vector<int32_t> ids(static_cast<size_t>(n));
  std::vector<float> out(static_cast<size_t>(n * t.dim()));
  double total = 0;
  for (int s = 0; s < steps; ++s) {
    for (auto& id : ids) id = row(rng);
    before();
    const auto t0 = Clock::now();
    t.gather(ids.data(), n, out.data());
    total += std::chrono::duration<double, std::micro>(Clock::now() - t0).count();
  }
  return total / steps;
}

}  // namespace

int main(int argc, char** argv) {
  int64_t rows = int64_t(1) << 23, dim = 128;
  int heads = 16;
  std::vector<int> batches{1, 8, 64};
  std::string dir = std::filesystem::temp_directory_path().string();
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string a = argv[i], v = argv[i + 1];
    if (a == "--rows") rows = std::stoll(v);
    else if (a == "--dim") dim = std::stoll(v);
    else if (a == "--heads") heads = std::stoi(v);
    else if (a == "--batches") batches = parse_list(v);
    else if (a == "--dir") dir = v;
    else return std::fprintf(stderr, "unknown option %s\n", a.c_str()), 2;
  }
  const std::string model = dir + "/revolta-ple-bench", path = model + "/model.safetensors", name = "ple.weight";
  std::filesystem::create_directories(model);
  write_table(path, name, rows, dim);
  const WeightLoader w(model);
  const PleTable host32(w, {name}, rows, dim, DType::kF32, false), host16(w, {name}, rows, dim, DType::kF16, false);
  const PleTable disk(w, {name}, rows, dim, DType::kF16, true);
  const Tensor mapped = w.mapped(name, {rows, dim}, DType::kF16);  // (the mapping disk reads: dropped when cold)
  std::printf("PLE table %lld x %lld bf16 (%.2f GiB), %d heads a token; us per step (ratio to one memcpy of the same bytes)\n",
              static_cast<long long>(rows), static_cast<long long>(dim), double(rows * dim * 2) / (1 << 30), heads);
  std::printf("| batch | rows | memcpy | host f32 | host f16 | disk, warm | disk, cold |\n|---|---|---|---|---|---|---|\n");
  // Warm: every page of the mapping touched (in the page cache and mapped).
  const auto touch_all = [&] {
    std::vector<int32_t> ids(65536);
    std::vector<float> out(ids.size() * static_cast<size_t>(dim));
    for (int64_t r = 0; r < rows; r += int64_t(ids.size())) {
      const int64_t k = std::min<int64_t>(int64_t(ids.size()), rows - r);
      for (int64_t i = 0; i < k; ++i) ids[size_t(i)] = int32_t(r + i);
      disk.gather(ids.data(), k, out.data());
    }
  };
  std::mt19937 rng(7);
  for (int batch : batches) {
    const int64_t n = int64_t(batch) * heads;
    std::vector<char> src(static_cast<size_t>(n * dim * 4)), dst(src.size());
    const auto t0 = Clock::now();
    for (int s = 0; s < 200; ++s) std::memcpy(dst.data(), src.data(), src.size());
    const double copy = std::chrono::duration<double, std::micro>(Clock::now() - t0).count() / 200;
    const double h32 = per_step_us(host32, n, 200, rng, [] {}), h16 = per_step_us(host16, n, 200, rng, [] {});
    touch_all();
    const double warm = per_step_us(disk, n, 200, rng, [] {});
    const double cold = per_step_us(disk, n, 20, rng, [&] { drop_pages(path, mapped); });
    std::printf("| %d | %lld | %.1f | %.1f (%.0fx) | %.1f (%.0fx) | %.1f (%.0fx) | %.1f (%.0fx) |\n", batch,
                static_cast<long long>(n), copy, h32, h32 / copy, h16, h16 / copy, warm, warm / copy, cold, cold / copy);
  }
  std::filesystem::remove_all(model);
  return 0;
}
