// The rank's StepAccumulator (MODE_SUMMARY) against the daemon's definition: fed ops and spans
// in the order the poller sees them, it must produce the StepStats computeStepStats gives for
// the whole record set, name the host causes as causesBefore does, and count what it could not.
#include "src/records/step_accumulator.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <map>
#include <random>
#include <string>

namespace flare::records {
namespace {

// A job of `steps` steps of ~1 ms: each step a DataLoader call, then 40 ops on one stream
// (one thread), some of them plain kernels; random gaps. Ops reach the accumulator when they
// end (the poller's order), spans when they end.
TEST(StepAccumulator, SameStatsAsTheDaemonsDefinitionInPollerOrder) {
  std::mt19937_64 rng(7);
  std::uniform_int_distribution<int64_t> gap(1'000, 20'000), dur(2'000, 15'000);
  std::vector<StepOp> ops;
  std::vector<StepSpan> loader;
  int64_t host = 1'000'000, gpu = 0;
  for (int s = 0; s < 12; ++s) {
    const int64_t load_start = host;
    host += 50'000 + gap(rng) * 5;  // the input wait
    loader.push_back({load_start, host});
    for (int k = 0; k < 40; ++k) {
      host += gap(rng);
      const int64_t start = std::max(host + 3'000, gpu);
      gpu = start + dur(rng);
      ops.push_back({host, start, gpu, k % 3 == 0});
    }
  }
  struct Arrival {
    int64_t at;
    int which;  // 0 op, 1 span
    size_t index;
  };
  std::vector<Arrival> arrivals;
  for (size_t i = 0; i < ops.size(); ++i) arrivals.push_back({ops[i].end, 0, i});
  for (size_t i = 0; i < loader.size(); ++i) arrivals.push_back({loader[i].end, 1, i});
  std::stable_sort(arrivals.begin(), arrivals.end(),
                   [](const Arrival& a, const Arrival& b) { return a.at < b.at; });
  StepAccumulator acc;
  std::vector<StepResult> got;
  for (const Arrival& a : arrivals) {
    if (a.which == 0) {
      const StepOp& op = ops[a.index];
      acc.addGpuOp(op.issue, op.start, op.end, op.kernel, 1);
    } else {
      acc.addHostEvent(loader[a.index].start, loader[a.index].end, 1, "DataLoader.__next__");
      acc.addLoaderSpan(loader[a.index].start, loader[a.index].end);
    }
    for (auto& r : acc.take(false)) got.push_back(std::move(r));
  }
  const size_t before_final = got.size();
  for (auto& r : acc.take(true)) got.push_back(std::move(r));
  EXPECT_EQ(before_final, 9u);  // two steps of slack
  std::vector<int64_t> starts;
  for (const StepSpan& l : loader) starts.push_back(l.start);
  const auto want = computeStepStats(ops, loader, starts);
  ASSERT_EQ(want.size(), 11u);
  ASSERT_EQ(got.size(), want.size());
  for (size_t i = 0; i < want.size(); ++i) {
    SCOPED_TRACE(i);
    EXPECT_EQ(got[i].stats.start_ns, want[i].start_ns);
    EXPECT_EQ(got[i].stats.end_ns, want[i].end_ns);
    EXPECT_EQ(got[i].stats.gpu_busy_ns, want[i].gpu_busy_ns);
    EXPECT_EQ(got[i].stats.inter_ns, want[i].inter_ns);
    EXPECT_EQ(got[i].stats.minority_ns, want[i].minority_ns);
    EXPECT_EQ(got[i].stats.gpu_ops, want[i].gpu_ops);
    EXPECT_DOUBLE_EQ(got[i].stats.issue_latency_sum_ns, want[i].issue_latency_sum_ns);
    EXPECT_DOUBLE_EQ(got[i].stats.issue_offset_sum_ns, want[i].issue_offset_sum_ns);
    EXPECT_EQ(got[i].stats.latency.count(), want[i].gpu_ops);
    EXPECT_EQ(got[i].late_ops, 0u);
    if (i == 0) continue;  // nothing ran before the first DataLoader call
    EXPECT_GT(got[i].stats.inter_ns, 0);
    // The first op after each DataLoader call waited on it: the loader is its cause.
    ASSERT_EQ(got[i].causes.size(), 1u);
    EXPECT_EQ(got[i].causes[0].first, "DataLoader.__next__");
    EXPECT_EQ(got[i].causes[0].second.count(), 1u);
  }
  EXPECT_TRUE(acc.take(true).empty());
}

// causesBefore's rule by hand: a host event on the launching thread that ended inside the gap
// before a launch and lasted at least half of it.
TEST(StepAccumulator, HostCausesByHand) {
  StepAccumulator acc;
  acc.addStepMarker(0);
  acc.addGpuOp(100, 110, 150, false, 1);
  acc.addHostEvent(110, 190, 1, "gc.collect");    // 80 of the 100 gap: a cause
  acc.addHostEvent(150, 160, 1, "torch.item");    // 10 of it: not
  acc.addHostEvent(120, 195, 2, "other.thread");  // another thread: not
  acc.addGpuOp(200, 205, 260, false, 1);          // latency 5, held up by gc.collect
  acc.addGpuOp(210, 262, 300, false, 1);          // gap 10: nothing ended inside it
  acc.addHostEvent(300, 600, 1, "torch.cuda.synchronize");
  acc.addStepMarker(1000);
  acc.addGpuOp(700, 701, 720, true, 1);  // the sync (300 of the 490 gap) held it up
  acc.addStepMarker(2000);
  auto r = acc.take(true);
  ASSERT_EQ(r.size(), 2u);
  ASSERT_EQ(r[0].causes.size(), 2u);
  EXPECT_EQ(r[0].stats.gpu_ops, 4u);
  std::map<std::string, uint64_t> counts;
  for (const auto& [name, sk] : r[0].causes) counts[name] = sk.count();
  EXPECT_EQ(counts["gc.collect"], 1u);
  EXPECT_EQ(counts["torch.cuda.synchronize"], 1u);
  for (const auto& [name, sk] : r[0].causes) {
    if (name == "gc.collect") {
      EXPECT_NEAR(sk.quantile(0.5), 5, 0.2);
    }
  }
  EXPECT_TRUE(r[1].causes.empty());
  EXPECT_EQ(r[1].stats.gpu_ops, 0u);
}

// Markers decide the boundaries once seen (DataLoader spans no longer do); an op of a step
// already sent is counted late; a job without boundaries keeps a bounded number of ops.
TEST(StepAccumulator, MarkersLateOpsAndOverflow) {
  StepAccumulator acc(64);
  acc.addLoaderSpan(0, 10);
  acc.addStepMarker(100);
  acc.addLoaderSpan(150, 160);
  acc.addStepMarker(200);
  acc.addStepMarker(300);
  acc.addGpuOp(120, 130, 140, false, 1);
  EXPECT_TRUE(acc.take(false).empty());  // two steps of slack
  acc.addStepMarker(400);
  auto r = acc.take(false);
  ASSERT_EQ(r.size(), 1u);
  EXPECT_EQ(r[0].stats.start_ns, 100);
  EXPECT_EQ(r[0].stats.end_ns, 200);
  EXPECT_EQ(r[0].stats.gpu_ops, 1u);
  acc.addGpuOp(150, 160, 170, false, 1);  // step [100,200) was sent
  acc.addStepMarker(500);
  r = acc.take(false);
  ASSERT_EQ(r.size(), 1u);
  EXPECT_EQ(r[0].late_ops, 1u);
  EXPECT_EQ(r[0].stats.gpu_ops, 0u);

  StepAccumulator none(64);
  for (int i = 0; i < 1000; ++i) none.addGpuOp(i, i, i + 1, false, 1);
  EXPECT_GT(none.overflowOps(), 900u);
  EXPECT_TRUE(none.take(true).empty());
}

// 1-in-N sampled kernels: gpu_ops (and the sketches) count the timed ops, gpu_ops_estimated
// the launches they stand for; a step of weight-1 ops only reports no estimate.
TEST(StepAccumulator, SampledOpsGiveAnEstimatedOpCount) {
  StepAccumulator acc;
  for (int64_t b : {100, 200, 300, 400, 500}) acc.addStepMarker(b);
  acc.addGpuOp(110, 115, 120, true, 1, 8);
  acc.addGpuOp(130, 135, 140, true, 1, 3);
  acc.addGpuOp(150, 155, 160, false, 1);  // a GEMM: exact
  acc.addGpuOp(210, 215, 220, false, 1);  // step 2: nothing sampled
  auto r = acc.take(false);
  ASSERT_EQ(r.size(), 2u);
  EXPECT_EQ(r[0].stats.gpu_ops, 3u);
  EXPECT_EQ(r[0].stats.latency.count(), 3u);
  EXPECT_EQ(r[0].gpu_ops_estimated, 12u);
  EXPECT_EQ(r[1].stats.gpu_ops, 1u);
  EXPECT_EQ(r[1].gpu_ops_estimated, 0u);
}

// Run-queue wait: the counter interpolated to the step's bounds, the most of any thread that
// issued the step's ops; a step whose issuing threads have no readings around it says -1 (not
// measured), never 0.
TEST(StepAccumulator, RunQueueWaitOfTheIssuingThreads) {
  StepAccumulator acc;
  for (int64_t b : {1000, 2000, 3000, 4000, 5000, 6000}) acc.addStepMarker(b);
  acc.addGpuOp(1100, 1200, 1300, true, /*thread=*/7);
  acc.addGpuOp(1500, 1600, 1700, true, /*thread=*/8);
  acc.addGpuOp(2100, 2200, 2300, true, 7);
  acc.addGpuOp(3100, 3200, 3300, true, 9);  // thread 9 is never read
  // Thread 7 waits 100 ns over [500, 1500) and 400 ns over [1500, 2500): 50 + 200 in
  // [1000, 2000); thread 8 waits 600 ns over [900, 2100): 500 in [1000, 2000).
  acc.addRunQueueWait(7, 500, 1000);
  acc.addRunQueueWait(7, 1500, 1100);
  acc.addRunQueueWait(7, 2500, 1500);
  acc.addRunQueueWait(8, 900, 0);
  acc.addRunQueueWait(8, 2100, 600);
  acc.addRunQueueWait(8, 2050, 9999);  // out of order: ignored
  acc.addRunQueueWait(9, 3900, 50);    // first read inside step 3: not measured there
  auto r = acc.take(false);
  ASSERT_EQ(r.size(), 3u);
  EXPECT_EQ(r[0].stats.run_queue_wait_ns, 500);  // thread 8's, the most
  EXPECT_EQ(r[1].stats.run_queue_wait_ns, 200);  // thread 7: [2000, 2500) of its 400, then flat
  EXPECT_EQ(r[2].stats.run_queue_wait_ns, -1);   // thread 9: no reading before the step
  // No reading after the step's start: not measured.
  StepAccumulator late;
  for (int64_t b : {100, 200, 300, 400}) late.addStepMarker(b);
  late.addGpuOp(110, 120, 130, false, 3);
  late.addRunQueueWait(3, 50, 10);
  auto l = late.take(false);
  ASSERT_EQ(l.size(), 1u);
  EXPECT_EQ(l[0].stats.run_queue_wait_ns, -1);
  // A step's wait never exceeds its length (a counter read across a thread-id reuse).
  StepAccumulator big;
  for (int64_t b : {100, 200, 300, 400}) big.addStepMarker(b);
  big.addGpuOp(110, 120, 130, false, 4);
  big.addRunQueueWait(4, 90, 0);
  big.addRunQueueWait(4, 210, 1'000'000);
  EXPECT_EQ(big.take(false).at(0).stats.run_queue_wait_ns, 100);
  // A step 100 times longer than the readings the accumulator holds: they are thinned, still
  // span the step, and the wait over it is exact (a counter growing linearly).
  StepAccumulator longStep;
  const int64_t n = 100 * static_cast<int64_t>(StepAccumulator::kMaxRunQueueReadings);
  for (int64_t b : {int64_t{0}, n, n + 1, n + 2}) longStep.addStepMarker(b);
  longStep.addGpuOp(10, 20, 30, false, 5);
  for (int64_t t = 0; t <= n + 1; ++t) longStep.addRunQueueWait(5, t, t / 4);
  EXPECT_EQ(longStep.take(false).at(0).stats.run_queue_wait_ns, n / 4);
}

// With the Tracer's watermark a step leaves as soon as every op issued in it has completed,
// however far the GPU lags (no op lost as late), and a stuck stream delays it at most
// kMaxSlackSteps.
TEST(StepAccumulator, WatermarkDecidesWhenAStepIsFinal) {
  StepAccumulator acc;
  acc.setWatermark(0);
  for (int64_t t : {100, 200, 300, 400, 500}) acc.addStepMarker(t);
  // The GPU runs three steps behind: step [100,200)'s op completes only now.
  EXPECT_TRUE(acc.take(false).empty());
  acc.addGpuOp(150, 450, 460, false, 1);
  acc.setWatermark(199);
  EXPECT_TRUE(acc.take(false).empty());
  acc.setWatermark(200);
  auto r = acc.take(false);
  ASSERT_EQ(r.size(), 1u);
  EXPECT_EQ(r[0].stats.gpu_ops, 1u);
  EXPECT_EQ(r[0].late_ops, 0u);
  // Many short steps while the watermark stays (a slow first launch is still in its vendor
  // call): kMaxSlackSteps steps later they still wait, as long as kMaxHoldNs has not passed.
  int64_t t = 600;
  for (; t < 600 + 100 * static_cast<int64_t>(StepAccumulator::kMaxSlackSteps); t += 100)
    acc.addStepMarker(t);
  EXPECT_TRUE(acc.take(false).empty());
  acc.addGpuOp(250, 1200, 1300, false, 1);  // the slow launch's op arrives: not late
  acc.setWatermark(400);
  r = acc.take(false);
  ASSERT_EQ(r.size(), 2u);
  EXPECT_EQ(r[0].stats.gpu_ops, 1u);
  EXPECT_EQ(r[0].late_ops, 0u);
  // A stream that never completes again: the watermark stays; the steps leave kMaxHoldNs late.
  acc.addStepMarker(StepAccumulator::kMaxHoldNs + 1000);
  r = acc.take(false);
  EXPECT_FALSE(r.empty());
  EXPECT_EQ(r.front().stats.start_ns, 400);
}

}  // namespace
}  // namespace flare::records
