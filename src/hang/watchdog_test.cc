#include "src/hang/watchdog.h"

#include <gtest/gtest.h>

namespace flare::hang {
namespace {

constexpr int64_t kS = 1'000'000'000;

// A 2 s timeout, and 20 s for an all-reduce (FLARE_HANG_TIMEOUT_OPS=ncclAllReduce=20).
WatchdogOptions longAllReduce() {
  WatchdogOptions o;
  o.timeout_ns = 2 * kS;
  o.op_timeouts = {{"ncclAllReduce", 20 * kS}};
  return o;
}

HeadOp op(uint64_t id, int64_t since_s, bool collective = false, int64_t expected_s = 0) {
  HeadOp h;
  h.op_id = id;
  h.name = collective ? "ncclAllReduce" : "gemm";
  h.collective = collective;
  h.expected_ns = expected_s * kS;
  h.since_ns = since_s * kS;
  return h;
}

// The op with its start event completed (it runs on the GPU).
HeadOp running(HeadOp h) {
  h.started = true;
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
  WatchdogOptions o;
  o.timeout_ns = 10 * kS;
  HangWatchdog w(o);
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

TEST(HangWatchdog, PerOpOverrideByNameThenByClass) {
  WatchdogOptions o;
  o.timeout_ns = 10 * kS;
  o.op_timeouts = {{"ncclAllReduce", 100 * kS}, {"collective", 50 * kS}};
  HangWatchdog w(o);
  HeadOp ar = op(1, 5, true);
  ar.kind = "collective";
  HeadOp ag = op(2, 5, true);
  ag.name = "ncclAllGather";
  ag.kind = "collective";
  HeadOp gemm = op(3, 0);
  gemm.kind = "gemm";
  EXPECT_EQ(w.thresholdNs(ar), 100 * kS);  // its name
  EXPECT_EQ(w.thresholdNs(ag), 50 * kS);   // its class
  EXPECT_EQ(w.thresholdNs(gemm), 10 * kS);
  w.setHead(1, ar);
  w.setHead(2, ag);
  w.setHead(3, gemm);
  // The gemm's stream raises first (10 s); the collectives are not listed before their bound.
  auto s = w.poll(11 * kS);
  ASSERT_TRUE(s);
  ASSERT_EQ(s->stuck.size(), 1u);
  EXPECT_EQ(s->first.stream, 3u);
  EXPECT_EQ(s->first.threshold_ns, 10 * kS);
}

TEST(HangWatchdog, AllReduceBelowItsOverrideNeverRaisesAboveItDoes) {
  const WatchdogOptions o = longAllReduce();
  HangWatchdog w(o);
  w.setHead(1, op(1, 0, true));
  for (int t = 1; t <= 20; ++t) EXPECT_FALSE(w.poll(t * kS)) << t;
  auto s = w.poll(21 * kS);
  ASSERT_TRUE(s);
  EXPECT_EQ(s->first.waited_ns, 21 * kS);
}

TEST(HangWatchdog, LearnsTheLongestDurationOfASignature) {
  WatchdogOptions o;
  o.timeout_ns = 10 * kS;
  o.learn_factor = 3.0;
  HangWatchdog w(o);
  HeadOp barrier = op(1, 0, true);
  barrier.signature = 42;
  EXPECT_EQ(w.thresholdNs(barrier), 10 * kS);  // nothing learned yet
  w.learn(42, 2 * kS);
  w.learn(42, 8 * kS);   // a checkpoint barrier took 8 s
  w.learn(42, 1 * kS);   // shorter ones do not lower it
  w.learn(7, 100 * kS);  // another signature
  EXPECT_EQ(w.thresholdNs(barrier), 24 * kS);
  w.setHead(5, barrier);
  EXPECT_FALSE(w.poll(23 * kS));  // a second long barrier: healthy
  EXPECT_TRUE(w.poll(25 * kS));
  // learn_factor 0 learns nothing.
  WatchdogOptions off = o;
  off.learn_factor = 0;
  HangWatchdog w2(off);
  w2.learn(42, 100 * kS);
  EXPECT_EQ(w2.thresholdNs(barrier), 10 * kS);
}

TEST(HangWatchdog, ParsesOpTimeoutsAndNamesBadEntries) {
  std::vector<OpTimeout> t;
  std::vector<std::string> errors;
  EXPECT_TRUE(parseOpTimeouts(" ncclAllReduce=30m, collective=900 ,barrier=1h", &t, &errors));
  ASSERT_EQ(t.size(), 3u);
  EXPECT_EQ(t[0].op, "ncclAllReduce");
  EXPECT_EQ(t[0].timeout_ns, 1800 * kS);
  EXPECT_EQ(t[1].timeout_ns, 900 * kS);
  EXPECT_EQ(t[2].timeout_ns, 3600 * kS);
  EXPECT_TRUE(errors.empty());

  t.clear();
  EXPECT_FALSE(parseOpTimeouts("ncclAllReduce,=5,x=abc,y=-3,z=0,ok=500ms,ok=2", &t, &errors));
  ASSERT_EQ(t.size(), 1u);  // the later "ok" replaces the earlier one
  EXPECT_EQ(t[0].op, "ok");
  EXPECT_EQ(t[0].timeout_ns, 2 * kS);
  ASSERT_EQ(errors.size(), 5u);
  EXPECT_NE(errors[0].find("'ncclAllReduce'"), std::string::npos);
  EXPECT_NE(errors[0].find("NAME=DURATION"), std::string::npos);
  EXPECT_NE(errors[1].find("empty op name"), std::string::npos);
  EXPECT_NE(errors[2].find("'x=abc'"), std::string::npos);
  EXPECT_NE(errors[3].find("'y=-3'"), std::string::npos);
  EXPECT_NE(errors[4].find("'z=0'"), std::string::npos);
  EXPECT_TRUE(parseOpTimeouts("", &t, &errors));
}

TEST(HangWatchdog, KernelWaitingBehindAHealthyLongCollectiveIsNotStuck) {
  const WatchdogOptions o = longAllReduce();
  HangWatchdog w(o);
  const HeadOp all_reduce =
      running(op(1, 0, true));  // head since 0 s (bound 20 s), running on the GPU
  w.setHead(1, all_reduce);
  w.setHead(2, op(2, 1));  // the optimizer kernel after it, head since 1 s (bound 2 s)
  EXPECT_FALSE(w.poll(10 * kS));
  EXPECT_FALSE(w.poll(20 * kS));
  // Past the collective's own bound both are stuck: the collective is reported first.
  auto s = w.poll(21 * kS);
  ASSERT_TRUE(s);
  EXPECT_EQ(s->first.stream, 1u);
  EXPECT_EQ(s->stuck.size(), 2u);
}

TEST(HangWatchdog, KernelStuckBeforeTheCollectiveIsReported) {
  // A compute kernel that never finishes, with the collective queued after it (it waits for
  // the kernel): the kernel was the head first, so it is stuck after the timeout.
  const WatchdogOptions o = longAllReduce();
  HangWatchdog w(o);
  w.setHead(2, op(2, 0));        // the kernel, head since 0 s
  w.setHead(1, op(1, 1, true));  // the all-reduce, head since 1 s
  auto s = w.poll(3 * kS);
  ASSERT_TRUE(s);
  EXPECT_EQ(s->first.stream, 2u);
  EXPECT_EQ(s->first.op.name, "gemm");
}

TEST(HangWatchdog, KernelHeadFirstWaitingForARunningCollectiveIsNotStuck) {
  // The false positive of a loaded machine: the optimizer kernel heads the compute stream (it
  // waits on the all-reduce through cudaStreamWaitEvent) before the all-reduce heads the
  // communication stream. The all-reduce has started on the GPU: its bound decides.
  const WatchdogOptions o = longAllReduce();
  HangWatchdog w(o);
  w.setHead(2, op(2, 0));         // the optimizer kernel, head since 0 s (not started)
  w.setHead(1, op(1, 1, true));   // the all-reduce, head since 1 s, not started yet
  w.setStarted(1, true, 1 * kS);  // now it runs
  EXPECT_FALSE(w.poll(3 * kS));
  EXPECT_FALSE(w.poll(21 * kS));
  auto s = w.poll(22 * kS);  // past the all-reduce's own bound: both are stuck
  ASSERT_TRUE(s);
  // The all-reduce runs and the kernel waits for it: the all-reduce is what the rank is stuck
  // in, although the kernel has been a head for longer (it came first in the report, so a
  // loaded rank reported its optimizer kernel instead of the hung collective).
  EXPECT_EQ(s->first.stream, 1u);
  EXPECT_EQ(s->first.op.name, "ncclAllReduce");
  ASSERT_EQ(s->stuck.size(), 2u);
  EXPECT_EQ(s->stuck[1].stream, 2u);
  EXPECT_GT(s->stuck[1].waited_ns, s->stuck[0].waited_ns);
}

TEST(HangWatchdog, KernelIsJudgedByItsOwnBoundWhileNoCollectiveRuns) {
  // The all-reduce became head before the kernel but has not started (it waits itself): the
  // kernel is not excused by it, whatever the order.
  const WatchdogOptions o = longAllReduce();
  HangWatchdog w(o);
  w.setHead(1, op(1, 0, true));
  w.setHead(2, op(2, 1));
  auto s = w.poll(4 * kS);
  ASSERT_TRUE(s);
  EXPECT_EQ(s->first.stream, 2u);
  EXPECT_EQ(s->stuck.size(), 1u);
  // A collective that stops running (setStarted false) no longer excuses anything either; and
  // setStarted on an idle stream is ignored.
  HangWatchdog w2(o);
  HeadOp running = op(1, 0, true);
  running.started = true;
  w2.setHead(1, running);
  w2.setHead(2, op(2, 0));
  w2.setStarted(3, true, 0);
  EXPECT_FALSE(w2.poll(5 * kS));
  w2.setStarted(1, false, 5 * kS);
  auto s2 = w2.poll(6 * kS);
  ASSERT_TRUE(s2);
  EXPECT_EQ(s2->first.stream, 2u);
}

TEST(HangWatchdog, KernelThatStartsAfterWaitingIsTimedFromItsStart) {
  // The optimizer kernel waits 10 s for the all-reduce (running, within its 20 s); the
  // all-reduce ends and, in the same pass, the kernel starts: its 2 s count from there, not
  // from when it became head (seen on the sim: the pass that saw the all-reduce complete
  // reported the kernel).
  const WatchdogOptions o = longAllReduce();
  HangWatchdog w(o);
  const HeadOp all_reduce = running(op(1, 0, true));
  w.setHead(1, all_reduce);
  w.setHead(2, op(2, 0));  // not started: it waits for the all-reduce
  EXPECT_FALSE(w.poll(10 * kS));
  w.setIdle(1);
  w.setStarted(2, true, 10 * kS);
  EXPECT_FALSE(w.poll(10 * kS));
  EXPECT_FALSE(w.poll(12 * kS));
  auto s = w.poll(12 * kS + 1);  // then it runs past its own bound: stuck
  ASSERT_TRUE(s);
  EXPECT_EQ(s->first.stream, 2u);
  EXPECT_EQ(s->first.waited_ns, 2 * kS + 1);
  // A head that was started when it became the head keeps its time (no reset on repeats).
  HangWatchdog w2(o);
  HeadOp running = op(3, 0);
  running.started = true;
  w2.setHead(3, running);
  w2.setStarted(3, true, 5 * kS);
  ASSERT_TRUE(w2.poll(5 * kS));
}

TEST(HangWatchdog, KernelWaitingForACollectiveThatJustCompletedIsTimedFromItsCompletion) {
  // The optimizer kernel waits 10 s for the all-reduce (running, within its 20 s). The
  // all-reduce completes, but the kernel's start event completes only later on the GPU (a
  // stream that wakes up late on a loaded machine): a poll in between sees the all-reduce gone
  // and the kernel not started. Its clock restarts at that poll, so the 10 s it waited for the
  // all-reduce do not pass its 2 s bound (the CI's false report of residual_add behind a
  // host-stalled peer's all-reduce); if it still has not started 2 s later, it is stuck.
  const WatchdogOptions o = longAllReduce();
  for (const bool next_collective_queued : {false, true}) {
    SCOPED_TRACE(next_collective_queued ? "next all-reduce heads its stream" : "stream idle");
    HangWatchdog w(o);
    const HeadOp all_reduce = running(op(1, 0, true));
    w.setHead(1, all_reduce);
    w.setHead(2, op(2, 0));  // not started: it waits for the all-reduce
    EXPECT_FALSE(w.poll(5 * kS));
    EXPECT_FALSE(w.poll(10 * kS));
    if (next_collective_queued) {
      w.setHead(1, op(3, 10, true));  // waits itself (not started)
    } else {
      w.setIdle(1);
    }
    EXPECT_FALSE(w.poll(10 * kS + 1));  // the kernel has not started yet
    EXPECT_FALSE(w.poll(12 * kS + 1));
    auto s = w.poll(12 * kS + 2);  // 2 s after the all-reduce completed, still not started
    ASSERT_TRUE(s);
    EXPECT_EQ(s->first.stream, 2u);
    EXPECT_EQ(s->first.waited_ns, 2 * kS + 1);
  }
  // The kernel that starts a pass later is timed from its start, as before.
  HangWatchdog w(o);
  const HeadOp all_reduce = running(op(1, 0, true));
  w.setHead(1, all_reduce);
  w.setHead(2, op(2, 0));
  EXPECT_FALSE(w.poll(10 * kS));
  w.setIdle(1);
  EXPECT_FALSE(w.poll(10 * kS + 1));
  w.setStarted(2, true, 10 * kS + 200'000'000);
  EXPECT_FALSE(w.poll(12 * kS));
  EXPECT_TRUE(w.poll(12 * kS + 200'000'001));
}

TEST(HangWatchdog, CompletedCollectiveRestartsNoRunningKernelNorAnotherCollective) {
  // Only heads that have not started are timed afresh: a kernel that runs (started) keeps its
  // time, and so does a collective that waits.
  const WatchdogOptions o = longAllReduce();
  HangWatchdog w(o);
  const HeadOp all_reduce = running(op(1, 0, true));
  w.setHead(1, all_reduce);
  HeadOp running = op(2, 0);
  running.started = true;
  w.setHead(2, running);
  w.setHead(3, op(3, 0, true));  // a collective that waits (bound 20 s)
  EXPECT_FALSE(w.poll(10 * kS));
  w.setIdle(1);
  auto s = w.poll(10 * kS + 1);
  ASSERT_TRUE(s);
  EXPECT_EQ(s->first.stream, 2u);
  EXPECT_EQ(s->first.waited_ns, 10 * kS + 1);
  ASSERT_EQ(s->stuck.size(), 1u);
  HangWatchdog w2(o);
  w2.setHead(1, all_reduce);
  w2.setHead(3, op(3, 0, true));
  w2.setIdle(1);
  EXPECT_FALSE(w2.poll(20 * kS));
  auto s2 = w2.poll(20 * kS + 1);
  ASSERT_TRUE(s2);
  EXPECT_EQ(s2->first.stream, 3u);
  EXPECT_EQ(s2->first.waited_ns, 20 * kS + 1);
}

}  // namespace
}  // namespace flare::hang
