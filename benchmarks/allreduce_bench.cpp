// All-reduce latency and bus bandwidth by message size over the GPUs of this machine, through the
// engine's GPU communicators, ranks as threads bound to their GPUs as the engine runs them: the
// custom one-shot all-reduce (messages up to 512 KB, GPUs with peer access) against NCCL alone:
//
//   revolta_allreduce_bench [--ranks 1,2,4] [--sizes 4K,64K,1M,16M,256M] [--reps 50]
//
// Sizes are bytes of float32 (a decode step's all-reduce is hidden_size x batch x 4: 16 KB for
// Qwen3-Next at one sequence). Prints one line per (ranks, size): microseconds per all-reduce
// (rank 0's stream, between events) with the engine's choice and with NCCL alone, and the bus
// bandwidth of each, 2 (N - 1) / N x bytes / time.
#include <barrier>
#include <cstdio>
#include <string>
#include <thread>
#include <vector>

#include "core/device_runtime.h"
#include "cuda_ops.h"
#include "dist/communicator.h"

using namespace revolta;

namespace {

std::vector<int64_t> parse(const std::string& text) {
  std::vector<int64_t> out;
  size_t at = 0;
  while (at < text.size()) {
    size_t end = text.find(',', at);
    if (end == std::string::npos) end = text.size();
    std::string item = text.substr(at, end - at);
    int64_t scale = 1;
    if (!item.empty() && (item.back() == 'K' || item.back() == 'M'))
      scale = item.back() == 'K' ? 1024 : 1024 * 1024, item.pop_back();
    out.push_back(std::stoll(item) * scale);
    at = end + 1;
  }
  return out;
}

}  // namespace

int main(int argc, char** argv) {
  int gpus = device_runtime(Device::kCUDA).device_count();
  std::vector<int64_t> ranks, sizes = parse("4K,16K,64K,256K,1M,4M,16M,64M,256M");
  int reps = 50;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    const std::string v = i + 1 < argc ? argv[i + 1] : "";
    if (a == "--ranks") ranks = parse(v), ++i;
    else if (a == "--sizes") sizes = parse(v), ++i;
    else if (a == "--reps") reps = std::stoi(v), ++i;
    else return std::fprintf(stderr, "unknown argument %s\n", a.c_str()), 2;
  }
  if (ranks.empty())
    for (int n = 1; n <= gpus; n *= 2) ranks.push_back(n);
  std::printf("%d GPU(s): %s\n%6s %12s %12s %12s %14s %14s\n", gpus, cuda::device_name().c_str(), "ranks", "bytes",
              "engine us", "NCCL us", "engine GB/s", "NCCL GB/s");
  for (int64_t n : ranks) {
    if (n > gpus) {
      std::printf("%6lld ranks: this machine has %d GPU(s)\n", (long long)n, gpus);
      continue;
    }
    std::vector<float> ms[2];
    for (int nccl_only = 0; nccl_only < 2; ++nccl_only) {
      GpuCommunicators comms = make_gpu_communicators(int(n), nccl_only == 0);
      std::barrier sync(static_cast<std::ptrdiff_t>(n));
      ms[nccl_only].assign(sizes.size(), 0.0f);
      std::vector<std::thread> threads;
      for (int r = 0; r < n; ++r)
        threads.emplace_back([&, r] {
          cuda::use_device(r);
          for (size_t s = 0; s < sizes.size(); ++s) {
            Tensor x = Tensor::empty({sizes[s] / 4}, DType::kF32, Device::kCUDA);
            for (int w = 0; w < 5; ++w) comms[size_t(r)]->all_reduce_sum(x);
            cuda::synchronize();
            sync.arrive_and_wait();
            const float t = cuda::stream_ms([&] { comms[size_t(r)]->all_reduce_sum(x); }, reps);
            if (r == 0) ms[nccl_only][s] = t / float(reps);
            sync.arrive_and_wait();
          }
        });
      for (auto& t : threads) t.join();
    }
    for (size_t s = 0; s < sizes.size(); ++s) {
      auto bus = [&](float m) { return n > 1 ? 2.0 * double(n - 1) / double(n) * double(sizes[s]) / (m / 1e3) / 1e9 : 0.0; };
      std::printf("%6lld %12lld %12.1f %12.1f %14.1f %14.1f\n", (long long)n, (long long)sizes[s], ms[0][s] * 1e3,
                  ms[1][s] * 1e3, bus(ms[0][s]), bus(ms[1][s]));
    }
  }
  return 0;
}
