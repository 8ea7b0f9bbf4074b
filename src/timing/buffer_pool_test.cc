#include "src/timing/buffer_pool.h"

#include <gtest/gtest.h>

#include <atomic>
#include <set>
#include <thread>
#include <vector>

namespace flare::timing {
namespace {

TEST(BufferPool, HandsOutDistinctAlignedBuffersUpToItsBound) {
  BufferPool pool(4, 1000);
  EXPECT_EQ(pool.bufferBytes(), 1000u);  // already a multiple of 8
  std::set<uint8_t*> seen;
  for (int i = 0; i < 4; ++i) {
    uint8_t* b = pool.acquire();
    ASSERT_NE(b, nullptr);
    EXPECT_EQ(reinterpret_cast<uintptr_t>(b) % BufferPool::kAlignment, 0u);
    seen.insert(b);
  }
  EXPECT_EQ(seen.size(), 4u);
  // Buffers do not overlap: consecutive starts are at least bufferBytes() apart.
  uint8_t* prev = nullptr;
  for (uint8_t* b : seen) {
    if (prev) {
      EXPECT_GE(static_cast<size_t>(b - prev), pool.bufferBytes());
    }
    prev = b;
  }
  EXPECT_EQ(pool.inUse(), 4u);
  EXPECT_EQ(pool.acquire(), nullptr);  // exhausted: never grows
  EXPECT_EQ(pool.acquire(), nullptr);
  EXPECT_EQ(pool.exhausted(), 2u);
}

TEST(BufferPool, RecyclesReleasedBuffers) {
  BufferPool pool(2, 64);
  uint8_t* a = pool.acquire();
  uint8_t* b = pool.acquire();
  ASSERT_TRUE(a && b);
  EXPECT_EQ(pool.acquire(), nullptr);
  EXPECT_TRUE(pool.release(a));
  EXPECT_EQ(pool.acquire(), a);  // the same memory again
  EXPECT_TRUE(pool.release(a));
  EXPECT_TRUE(pool.release(b));
  EXPECT_EQ(pool.inUse(), 0u);
  EXPECT_EQ(pool.acquired(), 3u);
}

TEST(BufferPool, RefusesForeignAndDoubleReleases) {
  BufferPool pool(2, 64);
  uint8_t* a = pool.acquire();
  ASSERT_NE(a, nullptr);
  uint8_t other[64];
  EXPECT_FALSE(pool.release(other));  // not from the pool
  EXPECT_FALSE(pool.release(a + 8));  // inside a buffer, not its start
  EXPECT_TRUE(pool.release(a));
  EXPECT_FALSE(pool.release(a));  // already free
  EXPECT_EQ(pool.badReleases(), 3u);
  EXPECT_EQ(pool.inUse(), 0u);
}

TEST(BufferPool, RoundsSizesUpToTheAlignment) {
  BufferPool pool(1, 13);
  EXPECT_EQ(pool.bufferBytes(), 16u);
  BufferPool tiny(0, 0);  // clamped to one buffer of one alignment unit
  EXPECT_EQ(tiny.count(), 1u);
  EXPECT_EQ(tiny.bufferBytes(), BufferPool::kAlignment);
}

TEST(BufferPool, ConcurrentAcquireReleaseNeverHandsOutABufferTwice) {
  BufferPool pool(8, 256);
  std::atomic<int> overlaps{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&, t] {
      for (int i = 0; i < 2000; ++i) {
        uint8_t* b = pool.acquire();
        if (!b) continue;
        // Stamp the buffer; if another thread held it at the same time the stamp changes.
        b[0] = static_cast<uint8_t>(t + 1);
        for (int spin = 0; spin < 10; ++spin) {
          if (b[0] != t + 1) overlaps++;
        }
        pool.release(b);
      }
    });
  }
  for (auto& th : threads) th.join();
  EXPECT_EQ(overlaps.load(), 0);
  EXPECT_EQ(pool.inUse(), 0u);
  EXPECT_EQ(pool.badReleases(), 0u);
}

}  // namespace
}  // namespace flare::timing
