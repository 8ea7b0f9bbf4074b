#include "src/timing/spsc_ring.h"

#include <gtest/gtest.h>

#include <cstdint>
#include <thread>
#include <vector>

namespace flare::timing {
namespace {

struct Record {
  uint64_t value;
  uint64_t check;
};

TEST(SpscRingTest, CapacityIsAPowerOfTwo) {
  EXPECT_EQ(SpscRing<Record>(0).capacity(), 2u);
  EXPECT_EQ(SpscRing<Record>(4).capacity(), 4u);
  EXPECT_EQ(SpscRing<Record>(4096).capacity(), 4096u);
  EXPECT_EQ(SpscRing<Record>(5000).capacity(), 8192u);
}

TEST(SpscRingTest, FullRingRefusesAndDrainFreesInOrder) {
  SpscRing<Record> ring(4);
  for (uint64_t i = 0; i < 4; ++i) EXPECT_TRUE(ring.tryPush({i, i}));
  EXPECT_FALSE(ring.tryPush({99, 99}));
  EXPECT_EQ(ring.size(), 4u);
  std::vector<uint64_t> got;
  EXPECT_EQ(ring.drain([&](const Record& r) { got.push_back(r.value); }), 4u);
  EXPECT_EQ(got, (std::vector<uint64_t>{0, 1, 2, 3}));
  for (uint64_t i = 4; i < 7; ++i) EXPECT_TRUE(ring.tryPush({i, i}));  // wraps around
  got.clear();
  ring.drain([&](const Record& r) { got.push_back(r.value); });
  EXPECT_EQ(got, (std::vector<uint64_t>{4, 5, 6}));
  EXPECT_EQ(ring.size(), 0u);
}

TEST(SpscRingTest, ProducerAndConsumerThreadsSeeEveryRecordOnceInOrder) {
  constexpr uint64_t kCount = 1'000'000;
  SpscRing<Record> ring(256);
  std::thread producer([&] {
    for (uint64_t i = 0; i < kCount;) {
      if (ring.tryPush({i, ~i})) ++i;
    }
  });
  uint64_t next = 0;
  bool torn = false;
  while (next < kCount) {
    ring.drain([&](const Record& r) {
      if (r.value != next || r.check != ~r.value) torn = true;
      ++next;
    });
  }
  producer.join();
  EXPECT_FALSE(torn);
  EXPECT_EQ(next, kCount);
}

}  // namespace
}  // namespace flare::timing
