// The op harness's cases for batched host <-> device piece copies (DeviceRuntime::upload_pieces /
// download_pieces, what the KV offload tiers move blocks with): pieces of odd and aligned sizes at
// odd and aligned addresses, over several staging chunks and one piece larger than a chunk.
#include "core/device_runtime.h"
#include "harness.h"

namespace revolta::harness {
namespace {

struct Layout {
  std::vector<size_t> offset, bytes;  // each piece's place in the device buffer and in host memory
  size_t total = 0;
};

// Pieces laid end to end with gaps (what lies in a gap must stay untouched).
Layout random_layout(int count, size_t big) {
  Layout l;
  std::uniform_int_distribution<int> kind(0, 3), odd(1, 3000), gap(0, 40);
  for (int i = 0; i < count; ++i) {
    const int k = kind(g_rng);
    const size_t n = k == 0 ? size_t(odd(g_rng)) : k == 1 ? 16384 : k == 2 ? 4096 + 4 * size_t(odd(g_rng)) : 2048;
    l.total += size_t(gap(g_rng)) * (k == 1 ? 16 : 1);
    l.offset.push_back(l.total), l.bytes.push_back(n);
    l.total += n;
  }
  if (big) l.offset.push_back(l.total), l.bytes.push_back(big), l.total += big;
  return l;
}

void test_pieces(int count, size_t big) {
  const Layout l = random_layout(count, big);
  std::vector<uint8_t> host(l.total), device_before(l.total), back(l.total, 0);
  std::uniform_int_distribution<int> byte(0, 255);
  for (auto& b : host) b = uint8_t(byte(g_rng));
  for (auto& b : device_before) b = uint8_t(byte(g_rng));
  Tensor dev = Tensor::empty({int64_t(l.total)}, DType::kU8, Device::kCUDA);
  DeviceRuntime& rt = device_runtime(Device::kCUDA);
  rt.copy_to_device(dev.data(), device_before.data(), l.total);
  std::vector<CopyPiece> pieces;
  for (size_t i = 0; i < l.bytes.size(); ++i)
    pieces.push_back({host.data() + l.offset[i], static_cast<uint8_t*>(dev.data()) + l.offset[i], l.bytes[i]});
  rt.upload_pieces(pieces);
  std::vector<uint8_t> seen(l.total);
  rt.copy_to_host(seen.data(), dev.data(), l.total);
  // Expected device bytes: the pieces from host, the gaps as they were.
  std::vector<uint8_t> expect = device_before;
  for (size_t i = 0; i < l.bytes.size(); ++i) std::memcpy(&expect[l.offset[i]], &host[l.offset[i]], l.bytes[i]);
  int64_t wrong = 0;
  for (size_t i = 0; i < l.total; ++i) wrong += seen[i] != expect[i];
  const std::string tag = std::to_string(l.bytes.size()) + " pieces, " + std::to_string(l.total >> 20) + " MiB";
  report("upload_pieces " + tag + " (wrong bytes)", float(wrong), 0.0f);
  for (auto& p : pieces) p.host = back.data() + (static_cast<uint8_t*>(p.host) - host.data());
  rt.download_pieces(pieces)->wait();
  wrong = 0;
  for (size_t i = 0; i < l.bytes.size(); ++i)
    for (size_t j = 0; j < l.bytes[i]; ++j) wrong += back[l.offset[i] + j] != expect[l.offset[i] + j];
  report("download_pieces " + tag + " (wrong bytes)", float(wrong), 0.0f);
}

// A KV block's 16 pieces of 16 KiB (Llama-8B shape, 8 layers, block of 16), 2,048 blocks: batched
// against one copy per piece.
void time_block_pieces() {
  const size_t piece = 16384, n = 2048 * 16;
  Tensor dev = Tensor::empty({int64_t(piece * n)}, DType::kU8, Device::kCUDA);
  std::vector<uint8_t> host(piece * n, 7);
  std::vector<CopyPiece> pieces;
  for (size_t i = 0; i < n; ++i)
    pieces.push_back({host.data() + i * piece, static_cast<uint8_t*>(dev.data()) + i * piece, piece});
  DeviceRuntime& rt = device_runtime(Device::kCUDA);
  auto seconds = [&](const std::function<void()>& f) {
    cuda::synchronize();
    const auto t0 = std::chrono::steady_clock::now();
    f();
    cuda::synchronize();
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  };
  seconds([&] { rt.upload_pieces(pieces); });  // pinned slots made once
  rt.download_pieces(pieces)->wait();
  const double up = seconds([&] { rt.upload_pieces(pieces); });
  const double down = seconds([&] { rt.download_pieces(pieces)->wait(); });
  const double up1 = seconds([&] { for (const CopyPiece& p : pieces) rt.copy_to_device(p.device, p.host, p.bytes); });
  const double down1 = seconds([&] { for (const CopyPiece& p : pieces) rt.copy_to_host(p.host, p.device, p.bytes); });
  std::printf("time 32768 pieces of 16 KiB: upload %.1f ms batched, %.1f ms a copy each; download %.1f ms batched, "
              "%.1f ms a copy each\n", up * 1e3, up1 * 1e3, down * 1e3, down1 * 1e3);
}

}  // namespace

void run_transfer_cases() {
  test_pieces(1, 0);
  test_pieces(300, 0);
  test_pieces(6000, 0);                     // several chunks
  test_pieces(50, size_t(40) << 20);        // one piece over a chunk's size
  time_block_pieces();
}

}  // namespace revolta::harness
