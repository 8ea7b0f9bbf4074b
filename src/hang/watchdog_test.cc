#include "src/hang/watchdog.h"

#include <gtest/gtest.h>

namespace flare::hang {
namespace {

constexpr int64_t kS = 1'000'000'000;

HeadOp op(uint64_t id, int64_t since_s, bool collective = false, int64_t expected_s = 0) {
  HeadOp h;
  h.op_id = id;
  h.name = collective ? "ncclAllReduce" : "gemm";
  h.collective = collective;
  h.expected_ns = expected_s * kS;
  h.since_ns = since_s * kS;
  return h;
}

TEST(HangWatchdog, ReportsOnceAfterTheTimeout) {
  HangWatchdog w;  // 300 s
  w.setHead(7, op(1, 10, true));
  EXPECT_FALSE(w.poll(309 * kS));
  auto s = w.poll(311 * kS);
  ASSERT_TRUE(s);
  EXPECT_EQ(s->first.stream, 7u);
  EXPECT_EQ(s->first.op.op_id, 1u);
  EXPECT_EQ(s->first.waited_ns, 301 * kS);
  EXPECT_FALSE(w.poll(400 * kS));  // same episode
  EXPECT_FALSE(w.poll(4000 * kS));
  EXPECT_EQ(w.episodes(), 1u);
}

TEST(HangWatchdog, LongCollectiveIsNotAHang) {
  HangWatchdog w;
  w.setHead(1, op(1, 0, true, /*expected*/ 200));  // threshold 4 x 200 s = 800 s
  EXPECT_FALSE(w.poll(500 * kS));
  EXPECT_FALSE(w.poll(799 * kS));
  EXPECT_TRUE(w.poll(801 * kS));
}

TEST(HangWatchdog, ChainOfLongOpsNeverRaises) {
  HangWatchdog w;
  for (int i = 0; i < 20; ++i) {  // 20 ops of 250 s each: 5,000 s of steady progress
    w.setHead(1, op(uint64_t(i), 250 * i));
    EXPECT_FALSE(w.poll((250 * i + 249) * kS)) << i;
  }
  EXPECT_EQ(w.episodes(), 0u);
}

TEST(HangWatchdog, ProgressEndsTheEpisodeAndANewStallRaisesAgain) {
  HangWatchdog w;
  w.setHead(1, op(1, 0));
  ASSERT_TRUE(w.poll(301 * kS));
  w.setHead(1, op(1, 0));  // same op re-announced: still the same episode
  EXPECT_TRUE(w.inEpisode());
  w.setHead(1, op(2, 310));  // progress
  EXPECT_FALSE(w.inEpisode());
  EXPECT_FALSE(w.poll(320 * kS));
  auto s = w.poll(611 * kS);
  ASSERT_TRUE(s);
  EXPECT_EQ(s->first.op.op_id, 2u);
  EXPECT_EQ(w.episodes(), 2u);
  w.setIdle(1);
  EXPECT_FALSE(w.inEpisode());
  EXPECT_FALSE(w.poll(10'000 * kS));  // idle streams never hang
}

TEST(HangWatchdog, AllStuckStreamsAreListedLongestFirst) {
  HangWatchdog w(WatchdogOptions{10 * kS, 4.0});
  w.setHead(1, op(1, 5));
  w.setHead(2, op(2, 0, true));
  w.setHead(3, op(3, 18));  // not stuck yet at 20 s
  auto s = w.poll(20 * kS);
  ASSERT_TRUE(s);
  EXPECT_EQ(s->first.stream, 2u);
  ASSERT_EQ(s->stuck.size(), 2u);
  EXPECT_EQ(s->stuck[1].stream, 1u);
  // Progress on a stream other than the one that raised it keeps the episode.
  w.setHead(1, op(4, 21));
  EXPECT_TRUE(w.inEpisode());
}

}  // namespace
}  // namespace flare::hang
