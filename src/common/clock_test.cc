#include "src/common/clock.h"

#include <gtest/gtest.h>

#include <cstdlib>
#include <thread>
#include <vector>

namespace flare::common {
namespace {

constexpr int64_t kMs = 1'000'000;

TEST(ClockTest, SystemClocks) {
  int64_t a = monotonicNs();
  int64_t b = monotonicNs();
  EXPECT_GT(a, 0);
  EXPECT_LE(a, b);
  // After 2020-01-01 and before 2100-01-01.
  EXPECT_GT(realtimeNs(), 1'577'836'800LL * 1'000'000'000);
  EXPECT_LT(realtimeNs(), 4'102'444'800LL * 1'000'000'000);
  const Clock& c = systemClock();
  EXPECT_EQ(&c, &systemClock());
  int64_t n = c.nowNs();
  EXPECT_LE(b, n);
  EXPECT_LE(n, monotonicNs());
}

TEST(ClockTest, FakeClockMovesOnlyWhenTold) {
  FakeClock fake(1000);
  const Clock& c = fake;
  EXPECT_EQ(c.nowNs(), 1000);
  EXPECT_EQ(c.nowNs(), 1000);
  fake.advanceNs(500);
  EXPECT_EQ(c.nowNs(), 1500);
  fake.setNs(42);
  EXPECT_EQ(c.nowNs(), 42);
  EXPECT_EQ(FakeClock().nowNs(), 0);
}

TEST(ClockTest, FakeClockIsThreadSafe) {
  FakeClock fake;
  std::vector<std::thread> threads;
  threads.reserve(4);
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&fake] {
      for (int i = 0; i < 10000; ++i) fake.advanceNs(1);
    });
  }
  for (auto& t : threads) t.join();
  EXPECT_EQ(fake.nowNs(), 40000);
}

TEST(ClockMapTest, ConvertsBothWays) {
  ClockMap map(/*monotonic_ns=*/100, /*realtime_ns=*/1'000'000);
  EXPECT_EQ(map.fromMonotonic(100), 1'000'000);
  EXPECT_EQ(map.fromMonotonic(150), 1'000'050);
  EXPECT_EQ(map.fromMonotonic(50), 999'950);
  EXPECT_EQ(map.toMonotonic(1'000'050), 150);
  EXPECT_EQ(map.offsetNs(), 999'900);
  EXPECT_EQ(map.monotonicAnchorNs(), 100);
  EXPECT_EQ(map.realtimeAnchorNs(), 1'000'000);
  for (int64_t t : {0LL, 1LL, 123'456'789LL, 9'000'000'000'000LL}) {
    EXPECT_EQ(map.toMonotonic(map.fromMonotonic(t)), t);
  }
}

TEST(ClockMapTest, DefaultIsIdentity) {
  ClockMap map;
  EXPECT_EQ(map.fromMonotonic(12345), 12345);
  EXPECT_EQ(map.offsetNs(), 0);
}

TEST(ClockMapTest, RealisticTimestamps) {
  // A monotonic clock at ~3 days of uptime, a realtime clock in 2025: no overflow.
  const int64_t mono = 259'200LL * 1'000'000'000;
  const int64_t real = 1'750'000'000LL * 1'000'000'000;
  ClockMap map(mono, real);
  EXPECT_EQ(map.fromMonotonic(mono + 7 * kMs), real + 7 * kMs);
  EXPECT_EQ(map.fromMonotonic(mono - 7 * kMs), real - 7 * kMs);
}

TEST(ClockMapTest, SampleMatchesTheSystemClocks) {
  ClockMap map = ClockMap::sample();
  EXPECT_GE(map.uncertaintyNs(), 0);
  EXPECT_LT(map.uncertaintyNs(), 50 * kMs);
  // Converting "now" lands near the realtime clock read right after (NTP may slew it a little).
  int64_t mapped = map.fromMonotonic(monotonicNs());
  int64_t real = realtimeNs();
  EXPECT_LT(std::llabs(real - mapped), 100 * kMs);
  EXPECT_EQ(ClockMap::sample(0).uncertaintyNs() >= 0, true);
}

}  // namespace
}  // namespace flare::common
