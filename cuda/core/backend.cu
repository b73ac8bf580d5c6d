// Device memory, the work stream, transfers, graphs and the registration of the CUDA op table.
//
// All work of a device goes to its one stream (one thread produces it: the engine thread, or a
// tensor-parallel rank's for its GPU), so a block freed on the host may be handed to the next
// allocation at once: later kernels are ordered after earlier ones.
// Freed blocks are cached by size (a forward pass allocates the same shapes every step); a graph
// records from a private pool whose blocks no one else receives while the graph lives.
#include <cuda_runtime.h>

#include <array>
#include <atomic>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <map>
#include <mutex>
#include <string>
#include <tuple>
#include <vector>

#include "core/arrival.cuh"
#include "core/cuda_check.h"
#include "core/device_runtime.h"
#include "core/launch.cuh"
#include "cuda_ops.h"

namespace revolta::cuda {
namespace {

struct GraphArena;

struct Pool {
  std::mutex mu;
  std::multimap<size_t, void*> free_blocks;
  size_t cached_bytes = 0;
  // A recording's pool: blocks come from the arena, the smallest free one that fits, and stay
  // the arena's (never freed here).
  std::shared_ptr<GraphArena> arena;
  void release() {
    std::lock_guard<std::mutex> lk(mu);
    if (!arena)
      for (auto& [bytes, p] : free_blocks) cudaFree(p);
    free_blocks.clear();
    cached_bytes = 0;
  }
  ~Pool() { release(); }
};

// Device memory that a runner's graphs share (DeviceRuntime::graph_memory).
struct GraphArena final : GraphMemory {
  std::mutex mu;
  std::vector<std::pair<size_t, void*>> blocks;
  size_t total = 0;
  size_t bytes() const override { return total; }
  ~GraphArena() override {
    for (auto& [n, p] : blocks) cudaFree(p);
  }
};

struct DeviceState;
DeviceState& device_state();
std::shared_ptr<Pool>& device_pool();
thread_local std::shared_ptr<Pool> t_capture_pool;  // set while a graph is being sized/recorded

struct PooledBuffer : Buffer {
  void* ptr = nullptr;
  size_t bytes = 0;
  std::shared_ptr<Pool> pool;
  ~PooledBuffer() override {
    std::lock_guard<std::mutex> lk(pool->mu);
    pool->free_blocks.emplace(bytes, ptr);
    pool->cached_bytes += bytes;
  }
};

size_t round_size(size_t bytes) {
  const size_t g = bytes < (size_t(1) << 20) ? 512 : (size_t(1) << 20);
  return (std::max<size_t>(bytes, 1) + g - 1) / g * g;
}

std::shared_ptr<Buffer> allocate(size_t bytes, bool zero, void** data) {
  auto buf = std::make_shared<PooledBuffer>();
  buf->pool = t_capture_pool ? t_capture_pool : device_pool();
  buf->bytes = round_size(bytes);
  {
    std::lock_guard<std::mutex> lk(buf->pool->mu);
    auto& free = buf->pool->free_blocks;
    auto it = buf->pool->arena ? free.lower_bound(buf->bytes) : free.find(buf->bytes);
    if (it != free.end()) {
      buf->bytes = it->first;
      buf->ptr = it->second;
      buf->pool->free_blocks.erase(it);
      buf->pool->cached_bytes -= buf->bytes;
    }
  }
  if (!buf->ptr) {
    cudaError_t err = cudaMalloc(&buf->ptr, buf->bytes);
    if (err != cudaSuccess) {  // give the cached blocks back and try once more
      cudaGetLastError();
      device_pool()->release();
      err = cudaMalloc(&buf->ptr, buf->bytes);
    }
    RV_CHECK(err == cudaSuccess, "CUDA out of memory allocating ", buf->bytes, " bytes: ", cudaGetErrorString(err));
    if (GraphArena* a = buf->pool->arena.get()) {
      std::lock_guard<std::mutex> lk(a->mu);
      a->blocks.emplace_back(buf->bytes, buf->ptr);
      a->total += buf->bytes;
    }
  }
  if (zero) RV_CUDA_CHECK(cudaMemsetAsync(buf->ptr, 0, bytes, stream()));
  *data = buf->ptr;
  return buf;
}

class Graph final : public DeviceGraph {
 public:
  Graph(cudaGraphExec_t exec, std::shared_ptr<Pool> pool) : exec_(exec), pool_(std::move(pool)) {}
  ~Graph() override { cudaGraphExecDestroy(exec_); }
  void replay() override { RV_CUDA_CHECK(cudaGraphLaunch(exec_, stream())); }

 private:
  cudaGraphExec_t exec_;
  std::shared_ptr<Pool> pool_;
};

// Pinned staging buffers with their completion events: for copies to the host that the caller
// waits for later, and for small uploads (Runtime::copy_to_device). A buffer returns to the pool
// when its copy is waited for, dropped or queued, and is handed out again only once its event
// reports the copy done (a dropped or queued copy may still be in flight).
class Staging {
 public:
  struct Slot {
    void* pinned = nullptr;
    size_t bytes = 0;
    cudaEvent_t done = nullptr;
  };
  Slot take(size_t bytes) {
    {
      std::lock_guard<std::mutex> lk(mu_);
      for (size_t i = 0; i < free_.size(); ++i) {
        if (free_[i].bytes < bytes) continue;
        const cudaError_t state = cudaEventQuery(free_[i].done);
        if (state == cudaErrorNotReady) {
          cudaGetLastError();  // "not ready" is an answer, not a failure: keep it out of later checks
          continue;
        }
        RV_CUDA_CHECK(state);
        const Slot s = free_[i];
        free_.erase(free_.begin() + std::ptrdiff_t(i));
        return s;
      }
    }
    Slot s;
    s.bytes = std::max<size_t>(bytes, 4096);
    RV_CUDA_CHECK(cudaHostAlloc(&s.pinned, s.bytes, cudaHostAllocDefault));
    RV_CUDA_CHECK(cudaEventCreateWithFlags(&s.done, cudaEventDisableTiming));
    return s;
  }
  void give_back(const Slot& s) {
    std::lock_guard<std::mutex> lk(mu_);
    free_.push_back(s);
  }

 private:
  std::mutex mu_;
  std::vector<Slot> free_;
};

class StagedCopy final : public PendingCopy {
 public:
  StagedCopy(Staging& staging, void* dst, const void* src, size_t bytes)
      : staging_(staging), slot_(staging.take(bytes)), dst_(dst), bytes_(bytes) {
    try {
      RV_CUDA_CHECK(cudaMemcpyAsync(slot_.pinned, src, bytes, cudaMemcpyDeviceToHost, stream()));
      RV_CUDA_CHECK(cudaEventRecord(slot_.done, stream()));
    } catch (...) {
      staging_.give_back(slot_);  // no destructor runs for a constructor that throws
      throw;
    }
  }
  ~StagedCopy() override { staging_.give_back(slot_); }
  void wait() override {
    RV_CUDA_CHECK(cudaEventSynchronize(slot_.done));
    std::memcpy(dst_, slot_.pinned, bytes_);
  }

 private:
  Staging& staging_;
  Staging::Slot slot_;
  void* dst_;
  size_t bytes_;
};

Staging& device_staging();

constexpr size_t kStagedUploadBytes = size_t(1) << 20;

// Batched copies of many small pieces (DeviceRuntime::upload_pieces / download_pieces). Pieces go in
// chunks of up to kPieceChunkBytes: a pinned slot holds the chunk's table of pieces and then their
// bytes (16-byte aligned), one copy moves it to (or from) a device buffer of the same layout, and
// move_pieces scatters (or gathers) the pieces there.
constexpr size_t kPieceChunkBytes = size_t(32) << 20;

size_t align16(size_t n) { return (n + 15) & ~size_t(15); }

struct PieceChunk {
  size_t first, end, table_bytes, bytes;
  Staging::Slot slot;
};

std::vector<PieceChunk> piece_chunks(const std::vector<CopyPiece>& pieces) {
  std::vector<PieceChunk> chunks;
  for (size_t first = 0; first < pieces.size();) {
    PieceChunk c{first, first, 0, 0, {}};
    for (size_t data = 0; c.end < pieces.size(); ++c.end) {
      const size_t table = align16((c.end + 1 - first) * sizeof(PieceRef));
      const size_t grown = data + align16(pieces[c.end].bytes);
      if (c.end > first && table + grown > kPieceChunkBytes) break;
      data = grown;
      c.table_bytes = table;
      c.bytes = table + grown;
    }
    chunks.push_back(c);
    first = c.end;
  }
  return chunks;
}

// Stages and queues one chunk; a download's bytes land in the slot after its table.
void move_chunk(const std::vector<CopyPiece>& pieces, PieceChunk& c, bool to_device) {
  Staging& staging = device_staging();
  c.slot = staging.take(c.bytes);
  try {
    auto* pinned = static_cast<uint8_t*>(c.slot.pinned);
    auto* refs = reinterpret_cast<PieceRef*>(pinned);
    size_t at = c.table_bytes;
    for (size_t i = c.first; i < c.end; ++i) {
      refs[i - c.first] = {at, reinterpret_cast<uint64_t>(pieces[i].device), pieces[i].bytes};
      if (to_device) std::memcpy(pinned + at, pieces[i].host, pieces[i].bytes);
      at += align16(pieces[i].bytes);
    }
    void* scratch = nullptr;
    const std::shared_ptr<Buffer> buf = allocate(c.bytes, false, &scratch);  // stream-ordered reuse
    auto* dev = static_cast<uint8_t*>(scratch);
    const size_t up = to_device ? c.bytes : c.table_bytes;
    RV_CUDA_CHECK(cudaMemcpyAsync(dev, pinned, up, cudaMemcpyHostToDevice, stream()));
    move_pieces(reinterpret_cast<const PieceRef*>(dev), int64_t(c.end - c.first), dev, to_device);
    if (!to_device)
      RV_CUDA_CHECK(cudaMemcpyAsync(pinned + c.table_bytes, dev + c.table_bytes, c.bytes - c.table_bytes,
                                    cudaMemcpyDeviceToHost, stream()));
    RV_CUDA_CHECK(cudaEventRecord(c.slot.done, stream()));
  } catch (...) {
    staging.give_back(c.slot);
    c.slot = {};
    throw;
  }
}

class PiecesDownload final : public PendingCopy {
 public:
  explicit PiecesDownload(std::vector<CopyPiece> pieces) : pieces_(std::move(pieces)), chunks_(piece_chunks(pieces_)) {
    for (PieceChunk& c : chunks_) move_chunk(pieces_, c, false);
  }
  ~PiecesDownload() override {
    for (const PieceChunk& c : chunks_)
      if (c.slot.pinned) device_staging().give_back(c.slot);
  }
  void wait() override {
    for (const PieceChunk& c : chunks_) {
      RV_CUDA_CHECK(cudaEventSynchronize(c.slot.done));
      const auto* pinned = static_cast<const uint8_t*>(c.slot.pinned);
      size_t at = c.table_bytes;
      for (size_t i = c.first; i < c.end; ++i) {
        std::memcpy(pieces_[i].host, pinned + at, pieces_[i].bytes);
        at += align16(pieces_[i].bytes);
      }
    }
  }

 private:
  std::vector<CopyPiece> pieces_;
  std::vector<PieceChunk> chunks_;
};

class Runtime final : public DeviceRuntime {
 public:
  std::string name() const override { return device_name(); }
  // Small uploads (a step's metadata) go through pinned staging: from pageable memory the driver
  // may wait for the stream to drain before it stages a copy, which holds the host back until the
  // step queued before has run, so async scheduling's early queueing of the next step is lost. The
  // slot returns to the pool at once; the pool hands it out again only after its copy is done.
  // Large copies (weights at load) and copies being captured into a graph (which would keep the
  // slot's address) stay direct.
  void copy_to_device(void* dst, const void* src, size_t n) override {
    cudaStreamCaptureStatus capture = cudaStreamCaptureStatusNone;
    RV_CUDA_CHECK(cudaStreamIsCapturing(stream(), &capture));
    if (n > kStagedUploadBytes || capture != cudaStreamCaptureStatusNone) {
      RV_CUDA_CHECK(cudaMemcpyAsync(dst, src, n, cudaMemcpyHostToDevice, stream()));
      return;
    }
    Staging& staging = device_staging();
    const Staging::Slot slot = staging.take(n);
    try {
      std::memcpy(slot.pinned, src, n);
      RV_CUDA_CHECK(cudaMemcpyAsync(dst, slot.pinned, n, cudaMemcpyHostToDevice, stream()));
      RV_CUDA_CHECK(cudaEventRecord(slot.done, stream()));
    } catch (...) {
      staging.give_back(slot);
      throw;
    }
    staging.give_back(slot);
  }
  void copy_to_host(void* dst, const void* src, size_t n) override {
    RV_CUDA_CHECK(cudaMemcpyAsync(dst, src, n, cudaMemcpyDeviceToHost, stream()));
    RV_CUDA_CHECK(cudaStreamSynchronize(stream()));
  }
  void copy_on_device(void* dst, const void* src, size_t n) override {
    RV_CUDA_CHECK(cudaMemcpyAsync(dst, src, n, cudaMemcpyDeviceToDevice, stream()));
  }
  std::unique_ptr<PendingCopy> copy_to_host_later(void* dst, const void* src, size_t n) override {
    return std::make_unique<StagedCopy>(device_staging(), dst, src, n);
  }
  void upload_pieces(const std::vector<CopyPiece>& pieces) override {
    for (PieceChunk& c : piece_chunks(pieces)) {
      move_chunk(pieces, c, true);
      device_staging().give_back(c.slot);  // handed out again once its event reports the copy done
    }
  }
  std::unique_ptr<PendingCopy> download_pieces(const std::vector<CopyPiece>& pieces) override {
    return std::make_unique<PiecesDownload>(pieces);
  }
  void fill_zero(void* dst, size_t n) override { RV_CUDA_CHECK(cudaMemsetAsync(dst, 0, n, stream())); }
  void synchronize() override { cuda::synchronize(); }
  void memory_info(size_t* free_bytes, size_t* total_bytes) override {
    RV_CUDA_CHECK(cudaMemGetInfo(free_bytes, total_bytes));
    std::shared_ptr<Pool>& pool = device_pool();
    std::lock_guard<std::mutex> lk(pool->mu);
    *free_bytes += pool->cached_bytes;
  }
  void release_cached() override {
    RV_CUDA_CHECK(cudaStreamSynchronize(stream()));
    device_pool()->release();
  }
  std::shared_ptr<GraphMemory> graph_memory() override { return std::make_shared<GraphArena>(); }
  std::unique_ptr<DeviceGraph> capture(const std::function<void()>& work,
                                       const std::shared_ptr<GraphMemory>& shared) override {
    auto pool = std::make_shared<Pool>();
    if (shared) {  // every block of the arena is free to this recording
      pool->arena = std::static_pointer_cast<GraphArena>(shared);
      std::lock_guard<std::mutex> lk(pool->arena->mu);
      for (auto& [n, p] : pool->arena->blocks) pool->free_blocks.emplace(n, p);
    }
    struct Scope {  // routes allocations of this thread to the graph's pool
      explicit Scope(std::shared_ptr<Pool> p) { t_capture_pool = std::move(p); }
      ~Scope() { t_capture_pool.reset(); }
    } scope(pool);
    work();  // sizes the pool: the recorded run then allocates nothing new
    RV_CUDA_CHECK(cudaStreamSynchronize(stream()));
    cudaGraph_t graph = nullptr;
    RV_CUDA_CHECK(cudaStreamBeginCapture(stream(), cudaStreamCaptureModeThreadLocal));
    try {
      work();
    } catch (...) {
      cudaStreamEndCapture(stream(), &graph);
      if (graph) cudaGraphDestroy(graph);
      throw;
    }
    RV_CUDA_CHECK(cudaStreamEndCapture(stream(), &graph));
    cudaGraphExec_t exec = nullptr;
    const cudaError_t err = cudaGraphInstantiate(&exec, graph, 0);
    cudaGraphDestroy(graph);
    RV_CUDA_CHECK(err);
    return std::make_unique<Graph>(exec, pool);
  }
  std::shared_ptr<void> pinned_host(size_t bytes) override {
    void* p = nullptr;
    RV_CUDA_CHECK(cudaHostAlloc(&p, std::max<size_t>(bytes, 1), cudaHostAllocDefault));
    return std::shared_ptr<void>(p, [](void* q) { cudaFreeHost(q); });
  }
  void host_stage(const void* src, void* in, size_t in_bytes, void (*fn)(void*), void* arg, const void* out, void* dst,
                  size_t out_bytes) override {
    RV_CUDA_CHECK(cudaMemcpyAsync(in, src, in_bytes, cudaMemcpyDeviceToHost, stream()));
    RV_CUDA_CHECK(cudaLaunchHostFunc(stream(), fn, arg));
    RV_CUDA_CHECK(cudaMemcpyAsync(dst, out, out_bytes, cudaMemcpyHostToDevice, stream()));
  }
  int device_count() override {
    int n = 0;
    RV_CUDA_CHECK(cudaGetDeviceCount(&n));
    return n;
  }
  void use_device(int index) override { cuda::use_device(index); }
};

struct Registration {
  Registration() {
    register_device_allocator(Device::kCUDA, &allocate);
    ops::register_backend(Device::kCUDA, table());
    static Runtime runtime;
    register_device_runtime(Device::kCUDA, &runtime);
  }
} registration;

}  // namespace

namespace {

constexpr int kMaxDevices = 64;
thread_local int t_device = -1;

// What the backend keeps per device, made on the device's first use and kept for the process.
struct DeviceState {
  cudaStream_t stream = nullptr;
  std::shared_ptr<Pool> pool = std::make_shared<Pool>();
  Staging staging;
  int* arrivals = nullptr;
};

DeviceState& device_state() {
  static std::array<std::atomic<DeviceState*>, kMaxDevices> states{};
  static std::mutex mu;
  const int d = current_device();
  if (DeviceState* s = states[size_t(d)].load(std::memory_order_acquire)) return *s;
  std::lock_guard<std::mutex> lk(mu);
  if (DeviceState* s = states[size_t(d)].load()) return *s;
  auto* s = new DeviceState;
  RV_CUDA_CHECK(cudaStreamCreateWithFlags(&s->stream, cudaStreamNonBlocking));
  // Arrival counters are allocated outside the memory pools (a graph's private pool would take them
  // away with it) and zeroed on the work stream, ahead of every kernel that counts on them (a
  // cudaMemset goes on the legacy stream, which the non-blocking work stream does not wait for).
  RV_CUDA_CHECK(cudaMalloc(&s->arrivals, kArrivalCounters * sizeof(int)));
  RV_CUDA_CHECK(cudaMemsetAsync(s->arrivals, 0, kArrivalCounters * sizeof(int), s->stream));
  states[size_t(d)].store(s, std::memory_order_release);
  return *s;
}

std::shared_ptr<Pool>& device_pool() { return device_state().pool; }
Staging& device_staging() { return device_state().staging; }

}  // namespace

void cuda_call_failed(const char* expr, const char* file, int line, cudaError_t err) {
  std::string where = file;
  where = where.substr(where.rfind('/') + 1);
  std::string memory;
  if (err == cudaErrorMemoryAllocation) {
    cudaGetLastError();
    size_t free = 0, total = 0;
    cudaMemGetInfo(&free, &total);
    size_t cached = 0;
    {
      std::lock_guard<std::mutex> lk(device_pool()->mu);
      cached = device_pool()->cached_bytes;
    }
    memory = str_cat(" (device: ", free >> 20, " MiB free of ", total >> 20, " MiB; the engine's pool caches ",
                     cached >> 20, " MiB of it)");
  }
  throw DeviceError(str_cat(expr, " failed at ", where, ":", line, ": ", cudaGetErrorString(err), memory));
}

int current_device() {
  if (t_device < 0) RV_CUDA_CHECK(cudaGetDevice(&t_device));
  return t_device;
}

void use_device(int device) {
  RV_CHECK(device >= 0 && device < kMaxDevices, "CUDA device ", device, " is beyond the backend's ", kMaxDevices);
  RV_CUDA_CHECK(cudaSetDevice(device));
  t_device = device;
}

cudaStream_t stream() { return device_state().stream; }

int* arrival_counters() { return device_state().arrivals; }

Tensor to_device(const Tensor& host) { return host.to(Device::kCUDA); }
Tensor to_host(const Tensor& dev) { return dev.to(Device::kCPU); }

void synchronize() { RV_CUDA_CHECK(cudaStreamSynchronize(stream())); }

float stream_ms(const std::function<void()>& run, int reps) {
  cudaEvent_t start, stop;
  cudaEventCreate(&start);
  cudaEventCreate(&stop);
  cudaEventRecord(start, stream());
  for (int i = 0; i < reps; ++i) run();
  cudaEventRecord(stop, stream());
  cudaEventSynchronize(stop);
  float ms = 0.0f;
  cudaEventElapsedTime(&ms, start, stop);
  cudaEventDestroy(start);
  cudaEventDestroy(stop);
  return ms;
}

double measure_copy_bandwidth(size_t bytes) {
  void *a = nullptr, *b = nullptr;
  RV_CUDA_CHECK(cudaMalloc(&a, bytes));
  RV_CUDA_CHECK(cudaMalloc(&b, bytes));
  auto run = [&] { cudaMemcpyAsync(b, a, bytes, cudaMemcpyDeviceToDevice, stream()); };
  run();
  const int reps = 10;
  const float ms = stream_ms(run, reps);
  cudaFree(a);
  cudaFree(b);
  return 2.0 * double(bytes) * reps / (double(ms) / 1e3);
}

namespace {
__global__ void read_kernel(const float4* __restrict__ p, size_t n, float* __restrict__ sink) {
  float acc = 0.0f;
  for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < n; i += size_t(gridDim.x) * blockDim.x) {
    const float4 v = __ldg(p + i);
    acc += v.x + v.y + v.z + v.w;
  }
  if (acc == 12345.678f) *sink = acc;  // keeps the loads; never true for a zeroed buffer
}
}  // namespace

double measure_read_bandwidth(size_t bytes) {
  Tensor buf = Tensor::empty({int64_t(bytes / 4)}, DType::kF32, Device::kCUDA);
  Tensor sink = Tensor::empty({1}, DType::kF32, Device::kCUDA);
  const size_t n = bytes / 16;
  auto run = [&] { read_kernel<<<unsigned(sm_count() * 8), 512, 0, stream()>>>(buf.ptr<float4>(), n, sink.ptr<float>()); };
  run();
  const int reps = 10;
  const float ms = stream_ms(run, reps);
  return double(n * 16) * reps / (double(ms) / 1e3);
}

std::string device_name() {
  cudaDeviceProp prop{};
  RV_CUDA_CHECK(cudaGetDeviceProperties(&prop, 0));
  return prop.name + std::string(" (compute capability ") + std::to_string(prop.major) + "." +
         std::to_string(prop.minor) + ")";
}

namespace {
__global__ void build_probe_kernel() {}
std::atomic<bool> g_dependent_launch_allowed{true};
}  // namespace

// The probe kernel was compiled like every other: its PTX version says whether the code a device
// runs carries the dependent-launch instructions (a build for sm_90+, not older PTX JIT-compiled).
bool dependent_launch_enabled() {
  static const bool supported = [] {
    int major = 0;
    RV_CUDA_CHECK(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, 0));
    cudaFuncAttributes attributes{};
    RV_CUDA_CHECK(cudaFuncGetAttributes(&attributes, build_probe_kernel));
    // REVOLTA_DEPENDENT_LAUNCH=0 turns it off for a process (profiles of kernels one at a time).
    const char* env = std::getenv("REVOLTA_DEPENDENT_LAUNCH");
    return major >= 9 && attributes.ptxVersion >= 90 && !(env && std::string(env) == "0");
  }();
  return supported && g_dependent_launch_allowed.load(std::memory_order_relaxed);
}

void set_dependent_launch(bool allowed) { g_dependent_launch_allowed.store(allowed); }

int sm_count() {
  static const int n = [] {
    int v = 0;
    RV_CUDA_CHECK(cudaDeviceGetAttribute(&v, cudaDevAttrMultiProcessorCount, 0));
    return v;
  }();
  return n;
}

int blocks_per_sm(const void* kernel, int threads, size_t smem) {
  static std::mutex mu;
  static std::map<std::tuple<const void*, int, size_t>, int> known;
  std::lock_guard<std::mutex> lock(mu);
  const auto key = std::make_tuple(kernel, threads, smem);
  auto it = known.find(key);
  if (it != known.end()) return it->second;
  int n = 0;
  RV_CUDA_CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&n, kernel, threads, smem));
  known[key] = n;
  return n;
}

namespace {

// The expert kernels (moe/) read fp16 weights in 8-element vectors of both dimensions; linear takes
// f32, f16 and 4-bit group weights (no GGUF blocks); attention, float32, float16, E4M3 and int8 KV
// caches.
bool takes(ops::Op op, const ops::OpShape& s) {
  switch (op) {
    case ops::Op::kLinear:
      return s.weight == DType::kF32 || s.weight == DType::kF16 || s.weight == DType::kI4G32 || s.weight == DType::kI4G128;
    case ops::Op::kMoeExperts:
    case ops::Op::kMoeRouteExperts:  // 4-bit experts: rows of whole blocks (hidden for gate / up, inter for down)
      if (s.weight == DType::kI4G32 || s.weight == DType::kI4G128)
        return s.rows % dtype_block_values(s.weight) == 0 && s.cols % dtype_block_values(s.weight) == 0 &&
               s.rows <= 12288;  // the gate / up kernel stages x in shared memory
      return s.weight == DType::kF16 && s.rows % 8 == 0 && s.cols % 8 == 0;
    case ops::Op::kKvCacheWrite:  // the KV cache's element type
    case ops::Op::kPagedAttention:
    case ops::Op::kQkvRopeCache:
    case ops::Op::kQkvRopeAttention:
      return s.weight == DType::kF32 || s.weight == DType::kF16 || s.weight == DType::kF8E4M3 || s.weight == DType::kI8;
    default:
      return true;
  }
}

}  // namespace

const ops::OpTable* table() {
  static const ops::OpTable t = [] {
    ops::OpTable table;
    REVOLTA_OPS(REVOLTA_TABLE_ENTRY)
    table.takes = &takes;
    return table;
  }();
  return &t;
}

}  // namespace revolta::cuda
