// The local group's collectives (ranks as threads): every rank gets the same bits, equal to the
// serial sum in rank order; gathers keep rank order; broadcasts from every root; sizes that do not
// split evenly; many collectives back to back (a barrier missing would let a rank read a slot or
// the scratch another rank has moved on from); abort wakes a rank that waits for one that failed.
#include <atomic>
#include <random>
#include <stdexcept>
#include <thread>
#include <vector>

#include "dist/communicator.h"
#include "expect.h"

using namespace revolta;

namespace {

// Runs fn(rank, communicator) on `world` threads of one group.
template <typename Fn>
void on_ranks(int world, Fn fn) {
  LocalGroup group(world);
  std::vector<std::thread> threads;
  for (int r = 0; r < world; ++r)
    threads.emplace_back([&, r] {
      auto comm = group.communicator(r);
      fn(r, *comm);
    });
  for (auto& t : threads) t.join();
}

std::vector<float> values(int rank, int step, int64_t n) {
  std::mt19937 rng(uint32_t(1000 * step + rank));
  std::uniform_real_distribution<float> d(-1.0f, 1.0f);
  std::vector<float> v(static_cast<size_t>(n));
  for (auto& x : v) x = d(rng) * float(1 + rank);
  return v;
}

void test_all_reduce(int world) {
  constexpr int kSteps = 200;
  std::vector<std::vector<std::vector<float>>> got(static_cast<size_t>(world));  // [rank][step]
  on_ranks(world, [&](int r, Communicator& c) {
    EXPECT(c.rank() == r && c.world_size() == world && c.kind() == "local");
    for (int step = 0; step < kSteps; ++step) {
      const int64_t n = 1 + (step * 37) % 1500;  // sizes that do not split evenly, and n < world
      std::vector<float> v = values(r, step, n);
      Tensor t = Tensor::wrap(v.data(), {n}, DType::kF32, nullptr);
      c.all_reduce_sum(t);
      got[size_t(r)].push_back(v);
    }
  });
  bool same = true, exact = true;
  for (int step = 0; step < kSteps; ++step) {
    const int64_t n = 1 + (step * 37) % 1500;
    std::vector<float> want(size_t(n), 0.0f);
    for (int r = 0; r < world; ++r) {
      const std::vector<float> v = values(r, step, n);
      for (int64_t i = 0; i < n; ++i) want[size_t(i)] += v[size_t(i)];
    }
    for (int r = 0; r < world; ++r) {
      same = same && got[size_t(r)][size_t(step)] == got[0][size_t(step)];
      exact = exact && got[size_t(r)][size_t(step)] == want;
    }
  }
  EXPECT(same);
  EXPECT(exact);
}

void test_gather_and_broadcast(int world) {
  std::atomic<int> bad{0};
  on_ranks(world, [&](int r, Communicator& c) {
    for (int step = 0; step < 50; ++step) {
      const int64_t n = 3 + step % 5;
      std::vector<int32_t> mine(static_cast<size_t>(2 * n));
      for (int64_t i = 0; i < 2 * n; ++i) mine[size_t(i)] = int32_t(1000 * r + 10 * step + i);
      std::vector<int32_t> all(size_t(2 * n * world), -1);
      Tensor x = Tensor::wrap(mine.data(), {2, n}, DType::kI32, nullptr);
      Tensor out = Tensor::wrap(all.data(), {2 * world, n}, DType::kI32, nullptr);
      c.all_gather(x, out);
      for (int q = 0; q < world; ++q)
        for (int64_t i = 0; i < 2 * n; ++i)
          if (all[size_t(q * 2 * n + i)] != int32_t(1000 * q + 10 * step + i)) ++bad;
      const int root = step % world;
      std::vector<float> b(static_cast<size_t>(n), float(r));
      Tensor bt = Tensor::wrap(b.data(), {n}, DType::kF32, nullptr);
      c.broadcast(bt, root);
      for (float v : b)
        if (v != float(root)) ++bad;
    }
  });
  EXPECT(bad == 0);
}

void test_single_rank() {
  auto c = make_single_rank_communicator();
  std::vector<float> v = {1.0f, -2.0f}, out(2, 0.0f);
  Tensor t = Tensor::wrap(v.data(), {2}, DType::kF32, nullptr), o = Tensor::wrap(out.data(), {2}, DType::kF32, nullptr);
  c->all_reduce_sum(t);
  c->all_gather(t, o);
  EXPECT(c->world_size() == 1 && v == std::vector<float>({1.0f, -2.0f}) && out == v);
}

// Rank 1 fails before its collective; the group is aborted, and rank 0, waiting, throws.
void test_abort_wakes_waiters() {
  LocalGroup group(2);
  std::atomic<bool> threw{false};
  std::thread waiter([&] {
    auto c = group.communicator(0);
    std::vector<float> v(4, 1.0f);
    Tensor t = Tensor::wrap(v.data(), {4}, DType::kF32, nullptr);
    try {
      c->all_reduce_sum(t);
    } catch (const std::runtime_error& e) {
      threw = std::string(e.what()).find("rank 1 failed") != std::string::npos;
    }
  });
  std::this_thread::sleep_for(std::chrono::milliseconds(20));
  group.abort("rank 1 failed");
  waiter.join();
  EXPECT(threw);
  bool later = false;  // and a later collective too
  try {
    auto c = group.communicator(1);
    std::vector<float> v(1, 0.0f);
    Tensor t = Tensor::wrap(v.data(), {1}, DType::kF32, nullptr);
    c->broadcast(t, 0);
  } catch (const std::runtime_error&) {
    later = true;
  }
  EXPECT(later);
}

}  // namespace

void run_communicator_tests() {
  for (int world : {1, 2, 3, 4}) {
    test_all_reduce(world);
    test_gather_and_broadcast(world);
  }
  test_single_rank();
  test_abort_wakes_waiters();
}
