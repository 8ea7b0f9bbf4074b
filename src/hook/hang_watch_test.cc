// The rank watchdog end to end inside one process: a real Tracer (its poller thread) with the
// fake device timer and a fake clock feeds HangWatch, which reports the stuck op once per
// episode with its name, communicator, sequence number and age, honours per-op overrides and
// learns the longest duration of a signature.
#include "src/hook/hang_watch.h"

#include <gtest/gtest.h>

#include <chrono>
#include <mutex>
#include <thread>
#include <vector>

#include "src/timing/testing/fake_device_timer.h"

namespace flare::hook {
namespace {

constexpr int64_t kS = 1'000'000'000;
void* const kNccl = reinterpret_cast<void*>(0x10);
void* const kCompute = reinterpret_cast<void*>(0x20);

class NullSink : public timing::Sink {
 public:
  explicit NullSink(HangWatch* watch) : watch_(watch) {}
  void onSignature(uint32_t id, const timing::Signature& sig) override {
    watch_->onSignature(id, sig);
  }
  void onOps(std::span<const timing::CompletedOp> ops) override { watch_->onOps(ops); }
  void onDrops(const timing::DropCounters&) override {}
  void flush() override {}

 private:
  HangWatch* watch_;
};

class HangWatchTest : public ::testing::Test {
 protected:
  // A 2 s timeout and the FLARE_HANG_TIMEOUT_OPS entry `ops` (e.g. "ncclAllReduce=20").
  void startWithOverride(const char* ops) {
    hang::WatchdogOptions o;
    o.timeout_ns = 2 * kS;
    std::vector<std::string> errors;
    ASSERT_TRUE(hang::parseOpTimeouts(ops, &o.op_timeouts, &errors)) << ops;
    start(o);
  }
  void start(hang::WatchdogOptions o) {
    watch_ = std::make_unique<HangWatch>(
        std::move(o),
        [this](const flare::v1::HangReport& r) {
          std::lock_guard lock(mu_);
          reports_.push_back(r);
        },
        [] { return int64_t{42}; });
    sink_ = std::make_unique<NullSink>(watch_.get());
    timing::TracerOptions t;
    t.poll_interval_ns = 1'000'000;  // the poller runs on its own (real time)
    t.recalibrate_ns = 3600 * kS;
    t.head_observer = watch_.get();
    t.head_interval_ns = 0;  // every pass
    tracer_ = std::make_unique<timing::Tracer>(&timer_, &clock_, sink_.get(), t);
  }
  void TearDown() override { tracer_.reset(); }

  void launch(void* stream, uint32_t sig, timing::OpKind kind, uint64_t seq = 0,
              uint8_t flags = 0) {
    timing::Tracer::Ticket ticket;
    ASSERT_TRUE(tracer_->begin(stream, &ticket));
    timing::OpInfo info;
    info.signature_id = sig;
    info.kind = kind;
    info.flags = flags;
    info.comm_hash = kind == timing::OpKind::kCollective ? 0xabcdef12345678ull : 0;
    info.seq = seq;
    info.nranks = 8;
    tracer_->end(&ticket, info);
  }
  // Sets the fake clock and waits (real time, bounded) for a poller pass that saw it.
  void at(int64_t t_ns) {
    clock_.setNs(t_ns);
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(20);
    while (watch_->lastHeadsNs() < t_ns && std::chrono::steady_clock::now() < deadline) {
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
    ASSERT_GE(watch_->lastHeadsNs(), t_ns) << "no poller pass";
    // One more pass so that a report decided in that pass is recorded.
    const int64_t seen = watch_->lastHeadsNs();
    clock_.setNs(t_ns + 1);
    while (watch_->lastHeadsNs() <= seen && std::chrono::steady_clock::now() < deadline) {
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
  }
  std::vector<flare::v1::HangReport> reports() {
    std::lock_guard lock(mu_);
    return reports_;
  }

  common::FakeClock clock_{100 * kS};
  timing::testing::FakeDeviceTimer timer_{&clock_};
  std::unique_ptr<HangWatch> watch_;
  std::unique_ptr<NullSink> sink_;
  std::unique_ptr<timing::Tracer> tracer_;
  std::mutex mu_;
  std::vector<flare::v1::HangReport> reports_;
};

timing::Signature sig(std::string name, timing::OpKind kind) {
  timing::Signature s;
  s.name = std::move(name);
  s.kind = kind;
  return s;
}

TEST_F(HangWatchTest, StuckCollectiveIsReportedOnceWithItsIdentityAndAge) {
  hang::WatchdogOptions o;
  o.timeout_ns = 10 * kS;
  start(o);
  const uint32_t ar = tracer_->intern(sig("ncclAllReduce", timing::OpKind::kCollective));
  launch(kNccl, ar, timing::OpKind::kCollective, 7);  // issued at 100 s, never completes
  at(105 * kS);
  EXPECT_TRUE(reports().empty());
  at(109 * kS);
  EXPECT_TRUE(reports().empty());
  at(111 * kS);
  auto r = reports();
  ASSERT_EQ(r.size(), 1u);
  EXPECT_EQ(r[0].time_unix_ns(), 42);
  EXPECT_EQ(r[0].episode(), 1u);
  EXPECT_EQ(r[0].first().name(), "ncclAllReduce");
  EXPECT_EQ(r[0].first().kind(), "collective");
  EXPECT_EQ(r[0].first().communicator(), "00abcdef12345678");
  EXPECT_EQ(r[0].first().seq(), 7u);
  EXPECT_EQ(r[0].first().nranks(), 8u);
  EXPECT_EQ(r[0].first().stream(), reinterpret_cast<uintptr_t>(kNccl));
  EXPECT_EQ(r[0].first().threshold_ns(), 10 * kS);
  EXPECT_GE(r[0].first().age_ns(), 11 * kS);
  EXPECT_LE(r[0].first().age_ns(), 11 * kS + 1);
  // Still stuck: one episode, one report.
  at(200 * kS);
  EXPECT_EQ(reports().size(), 1u);
  EXPECT_EQ(watch_->reports(), 1u);
}

// Step sampling leaves a step's kernels untimed: a kernel that never finishes there heads no
// stream, and the collective after it waits, not started. The report names the untimed compute
// as stuck (the daemon's culprit rule reads kind "kernel"), the collective's identity kept; a
// collective that started, or one not issued after untimed work in a sampled-out step, stays a
// collective.
TEST_F(HangWatchTest, ACollectiveWaitingForComputeOfASampledOutStepNamesThatCompute) {
  hang::WatchdogOptions o;
  o.timeout_ns = 10 * kS;
  start(o);
  const uint32_t ar = tracer_->intern(sig("ncclAllReduce", timing::OpKind::kCollective));
  constexpr uint8_t kBehind = timing::kOpAfterUntimed | timing::kOpInSampledOutStep;
  launch(kNccl, ar, timing::OpKind::kCollective, 7, kBehind);  // never starts
  at(111 * kS);
  auto r = reports();
  ASSERT_EQ(r.size(), 1u);
  EXPECT_EQ(r[0].first().kind(), "kernel");
  EXPECT_EQ(r[0].first().name(), "compute not timed (its step sampled out) ahead of ncclAllReduce");
  EXPECT_EQ(r[0].first().communicator(), "00abcdef12345678");
  EXPECT_EQ(r[0].first().seq(), 7u);
}

TEST_F(HangWatchTest, AStartedOrOrdinaryCollectiveStaysACollective) {
  for (const uint8_t flags :
       {uint8_t{timing::kOpAfterUntimed | timing::kOpInSampledOutStep},
        uint8_t{timing::kOpAfterUntimed}, uint8_t{timing::kOpInSampledOutStep}}) {
    SCOPED_TRACE(static_cast<int>(flags));
    hang::WatchdogOptions o;
    o.timeout_ns = 10 * kS;
    reports_.clear();
    clock_.setNs(100 * kS);
    start(o);
    const uint32_t ar = tracer_->intern(sig("ncclAllReduce", timing::OpKind::kCollective));
    launch(kNccl, ar, timing::OpKind::kCollective, 1, flags);
    const bool both = flags == (timing::kOpAfterUntimed | timing::kOpInSampledOutStep);
    if (both) {  // started: in the collective
      ASSERT_TRUE(timer_.completeNext(kNccl, 100 * kS));
    }
    at(111 * kS);
    auto r = reports();
    ASSERT_EQ(r.size(), 1u);
    EXPECT_EQ(r[0].first().kind(), "collective");
    EXPECT_EQ(r[0].first().name(), "ncclAllReduce");
    tracer_.reset();
  }
}

TEST_F(HangWatchTest, StuckComputeKernelBehindCompletedOpsCountsFromTheLastCompletion) {
  hang::WatchdogOptions o;
  o.timeout_ns = 10 * kS;
  o.learn_factor = 0;
  start(o);
  const uint32_t g = tracer_->intern(sig("gemm_kernel", timing::OpKind::kGemm));
  launch(kCompute, g, timing::OpKind::kGemm);  // issued at 100 s
  launch(kCompute, g, timing::OpKind::kGemm);  // queued behind it
  at(108 * kS);
  ASSERT_TRUE(timer_.completeOp(kCompute, 107 * kS, 108 * kS));  // the first one completes
  at(108 * kS + 2);                                              // a pass sees it
  at(115 * kS);  // the second is the head since ~108 s: 7 s
  EXPECT_TRUE(reports().empty());
  at(119 * kS);
  auto r = reports();
  ASSERT_EQ(r.size(), 1u);
  EXPECT_EQ(r[0].first().name(), "gemm_kernel");
  EXPECT_EQ(r[0].first().communicator(), "");
  EXPECT_GT(r[0].first().age_ns(), 10 * kS);
  EXPECT_LT(r[0].first().age_ns(), 12 * kS);
  // Progress ends the episode; a new stall raises a second report.
  ASSERT_TRUE(timer_.completeOp(kCompute, 119 * kS, 119 * kS + 1000));
  at(120 * kS);
  launch(kCompute, g, timing::OpKind::kGemm);
  at(125 * kS);
  EXPECT_EQ(reports().size(), 1u);
  at(131 * kS);
  r = reports();
  ASSERT_EQ(r.size(), 2u);
  EXPECT_EQ(r[1].episode(), 2u);
}

TEST_F(HangWatchTest, LongCollectiveBelowItsOverrideIsNotAHang) {
  startWithOverride("ncclAllReduce=30");
  const uint32_t ar = tracer_->intern(sig("ncclAllReduce", timing::OpKind::kCollective));
  const uint32_t ag = tracer_->intern(sig("ncclAllGather", timing::OpKind::kCollective));
  launch(kNccl, ar, timing::OpKind::kCollective, 1);
  at(125 * kS);  // 25 s in an all-reduce: below its 30 s
  EXPECT_TRUE(reports().empty());
  ASSERT_TRUE(timer_.completeOp(kNccl, 124 * kS, 125 * kS));
  at(125 * kS + 2);                                   // a pass sees it
  launch(kNccl, ag, timing::OpKind::kCollective, 2);  // the default 2 s applies to all-gather
  at(128 * kS);
  auto r = reports();
  ASSERT_EQ(r.size(), 1u);
  EXPECT_EQ(r[0].first().name(), "ncclAllGather");
  EXPECT_EQ(r[0].first().threshold_ns(), 2 * kS);
}

// The heads' start-event state decides a cross-stream wait, whichever op became head first.
TEST_F(HangWatchTest, KernelWaitingForAStartedCollectiveIsNotStuckButOneBeforeItIs) {
  startWithOverride("ncclAllReduce=20");
  const uint32_t ar = tracer_->intern(sig("ncclAllReduce", timing::OpKind::kCollective));
  const uint32_t adam = tracer_->intern(sig("adam", timing::OpKind::kKernel));
  // The optimizer kernel heads the compute stream first (it waits on the all-reduce: its start
  // event does not complete), then the all-reduce heads the communication stream and starts.
  launch(kCompute, adam, timing::OpKind::kKernel);
  at(100 * kS + 1000);
  launch(kNccl, ar, timing::OpKind::kCollective, 1);
  ASSERT_TRUE(timer_.completeNext(kNccl, 100 * kS));  // the all-reduce's start event
  at(110 * kS);  // the kernel has headed 10 s (its bound: 2 s), the all-reduce 10 s of 20
  EXPECT_TRUE(reports().empty());
  // The all-reduce ends, so does the kernel: no report ever.
  ASSERT_TRUE(timer_.completeNext(kNccl, 111 * kS));
  ASSERT_TRUE(timer_.completeOp(kCompute, 111 * kS, 111 * kS + 1000));
  at(112 * kS);
  EXPECT_TRUE(reports().empty());

  // A kernel that never finishes (started), the next all-reduce queued behind it on the other
  // stream (waits for it: not started). The kernel is stuck after its own 2 s.
  launch(kCompute, adam, timing::OpKind::kKernel);
  ASSERT_TRUE(timer_.completeNext(kCompute, 112 * kS));  // runs
  launch(kNccl, ar, timing::OpKind::kCollective, 2);
  at(115 * kS);
  auto r = reports();
  ASSERT_EQ(r.size(), 1u);
  EXPECT_EQ(r[0].first().name(), "adam");
}

// The all-reduce's end is seen in one pass, the kernel that waits for it starts only in a
// later one (its stream wakes up late on a loaded machine): the pass in between must not
// report the kernel for the time it waited for the all-reduce.
TEST_F(HangWatchTest, KernelWhoseStartLagsTheCollectivesEndIsNotStuck) {
  startWithOverride("ncclAllReduce=20");
  const uint32_t ar = tracer_->intern(sig("ncclAllReduce", timing::OpKind::kCollective));
  const uint32_t residual = tracer_->intern(sig("residual_add", timing::OpKind::kKernel));
  launch(kNccl, ar, timing::OpKind::kCollective, 1);
  ASSERT_TRUE(timer_.completeNext(kNccl, 100 * kS));    // the all-reduce runs (waits for a peer)
  launch(kCompute, residual, timing::OpKind::kKernel);  // waits for it: not started
  at(103 * kS);  // the kernel has headed 3 s (its bound: 2 s), the all-reduce 3 s of 20
  EXPECT_TRUE(reports().empty());
  ASSERT_TRUE(timer_.completeNext(kNccl, 103 * kS));  // the all-reduce ends
  at(103 * kS + 100);  // passes that see it ended and the kernel not started yet
  EXPECT_TRUE(reports().empty());
  ASSERT_TRUE(timer_.completeNext(kCompute, 103 * kS + 200));  // the kernel starts, then ends
  ASSERT_TRUE(timer_.completeNext(kCompute, 103 * kS + 300));
  at(104 * kS);
  EXPECT_TRUE(reports().empty());
  // A kernel that then never starts is still stuck, 2 s after the all-reduce ended.
  launch(kNccl, ar, timing::OpKind::kCollective, 2);
  ASSERT_TRUE(timer_.completeNext(kNccl, 104 * kS));
  launch(kCompute, residual, timing::OpKind::kKernel);
  at(105 * kS);
  ASSERT_TRUE(timer_.completeNext(kNccl, 105 * kS));
  at(105 * kS + 100);  // a pass sees the all-reduce end
  at(107 * kS);
  EXPECT_TRUE(reports().empty());
  at(107 * kS + 200);
  auto r = reports();
  ASSERT_EQ(r.size(), 1u);
  EXPECT_EQ(r[0].first().name(), "residual_add");
  EXPECT_GT(r[0].first().age_ns(), 2 * kS);  // timed from the all-reduce's end, not from
  EXPECT_LT(r[0].first().age_ns(), 3 * kS);  // when it became head (about 104 s)
}

TEST_F(HangWatchTest, LearnedBoundCoversASecondLongBarrier) {
  hang::WatchdogOptions o;
  o.timeout_ns = 5 * kS;
  o.learn_factor = 2.0;
  start(o);
  const uint32_t ar = tracer_->intern(sig("ncclAllReduce", timing::OpKind::kCollective));
  launch(kNccl, ar, timing::OpKind::kCollective, 1);
  at(104 * kS);
  // A 4 s barrier completes (GPU time 100..104 s): bound max(5 s, 2 x 4 s) = 8 s.
  ASSERT_TRUE(timer_.completeOp(kNccl, 100 * kS, 104 * kS));
  at(105 * kS);
  launch(kNccl, ar, timing::OpKind::kCollective, 2);
  at(112 * kS);  // 7 s: below the learned bound
  EXPECT_TRUE(reports().empty());
  at(114 * kS);
  auto r = reports();
  ASSERT_EQ(r.size(), 1u);
  EXPECT_EQ(r[0].first().threshold_ns(), 8 * kS);
  EXPECT_EQ(r[0].first().seq(), 2u);
}

}  // namespace
}  // namespace flare::hook
