// The launching thread's cost of timing one op: Tracer::begin() + Tracer::end(), with a
// DeviceTimer whose calls do nothing (the hot path with the event calls stubbed: what Flare
// adds on top of the two cudaEventRecord calls).
//
// Ops are launched in rounds of kRound (a quarter of the ring) between which the benchmark
// waits, untimed, for the poller to take them: the figure is the steady state, not the cost
// of dropping on a full ring (which a launch rate beyond the poller's would measure).
//
//   build/bin/tracer_benchmark
#include <benchmark/benchmark.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <cstdint>
#include <deque>
#include <mutex>

#include "flare/step.h"
#include "src/common/clock.h"
#include "src/timing/batch_builder.h"
#include "src/timing/run_queue.h"
#include "src/timing/step_sampling.h"
#include "src/timing/timing.h"

namespace flare::timing {
namespace {

constexpr int kRound = 4096;

class NoopTimer final : public DeviceTimer {
 public:
  bool createEvent(void** event) override {
    std::lock_guard<std::mutex> lock(mu_);
    *event = &handles_.emplace_back();  // distinct addresses; never dereferenced
    return true;
  }
  void destroyEvent(void*) override {}
  bool recordEvent(void*, void*) override { return true; }
  Status queryEvent(void*) override { return Status::kReady; }
  bool elapsedNs(void*, void*, int64_t* ns) override {
    *ns = 0;
    return true;
  }
  bool isCapturing(void*) override { return false; }
  uint64_t streamId(void* stream) override { return reinterpret_cast<uintptr_t>(stream); }
  int currentDevice() override { return 0; }
  bool recordReference(int, void** event) override { return createEvent(event); }

 private:
  std::mutex mu_;
  std::deque<char> handles_;
};

class NullSink final : public Sink {
 public:
  void onSignature(uint32_t, const Signature&) override {}
  void onOps(std::span<const CompletedOp> ops) override { count_ += ops.size(); }
  void onDrops(const DropCounters&) override {}
  void flush() override {}

 private:
  uint64_t count_ = 0;
};

void runBeginEnd(benchmark::State& state, const common::Clock& clock, bool measure_cost = false) {
  NoopTimer timer;
  NullSink sink;
  TracerOptions opts;
  opts.ring_capacity = static_cast<size_t>(4) * kRound;
  opts.measure_cost = measure_cost;
  Tracer tracer(&timer, &clock, &sink, opts);
  OpInfo info;
  Signature sig;
  sig.name = "benchmark_kernel";
  info.signature_id = tracer.intern(sig);
  void* stream = reinterpret_cast<void*>(0x10);
  int64_t timed = 0;
  for (auto _ : state) {
    for (int i = 0; i < kRound; ++i) {
      Tracer::Ticket ticket;
      if (tracer.begin(stream, &ticket)) [[likely]] {
        info.seq = static_cast<uint64_t>(i);
        tracer.end(&ticket, info);
      }
    }
    timed += kRound;
    state.PauseTiming();
    tracer.drain(10'000'000'000);
    state.ResumeTiming();
  }
  const DropCounters drops = tracer.drops();
  state.SetItemsProcessed(timed);
  state.counters["ns_per_op"] = benchmark::Counter(
      static_cast<double>(timed), benchmark::Counter::kIsRate | benchmark::Counter::kInvert);
  state.counters["dropped"] = static_cast<double>(drops.ring_full + drops.events_exhausted);
}

// CLOCK_MONOTONIC through the vDSO, as in production.
void beginEndSystemClock(benchmark::State& state) {
  runBeginEnd(state, common::systemClock());
}
BENCHMARK(beginEndSystemClock)->UseRealTime();

// The same with the timing cost added up (FLARE_TIMING_BUDGET_PCT: three more clock reads and
// an atomic add per op).
void beginEndMeasuringCost(benchmark::State& state) {
  runBeginEnd(state, common::systemClock(), true);
}
BENCHMARK(beginEndMeasuringCost)->UseRealTime();

// The same without the clock read: Flare's own bookkeeping alone.
void beginEndFakeClock(benchmark::State& state) {
  common::FakeClock clock(1);
  runBeginEnd(state, clock);
}
BENCHMARK(beginEndFakeClock)->UseRealTime();

// One run-queue reading of a thread (the poller thread's cost, MODE_SUMMARY, per issuing thread
// at most every millisecond): a pread of its open schedstat file.
void runQueueReading(benchmark::State& state) {
  RunQueueReader reader;
  const auto tid = static_cast<uint32_t>(::syscall(SYS_gettid));
  int64_t sum = 0;
  for (auto _ : state) sum += reader.read(tid).value_or(-1);
  benchmark::DoNotOptimize(sum);
  if (reader.off()) state.SkipWithError("no schedstat");
}
BENCHMARK(runQueueReading);

// The poller thread's cost per op of MODE_SUMMARY's BatchBuilder (aggregation, step statistics,
// encoding), with step sampling's bookkeeping (MeasuredStepOps: which ops stand for the
// sampled-out steps) or without it. Steps of 1000 kernels over 4 signatures, an all-reduce and a
// step marker; Arg: K (0: no step sampling; 1: every step measured, decisions taken; 4: one step
// in 4 measured, the others' kernels never reach the poller). Per op of the steps as launched.
void summaryStepSampling(benchmark::State& state) {
  const auto k = static_cast<int>(state.range(0));
  constexpr int kKernels = 1000;
  constexpr int64_t kStepNs = 10'000'000;
  std::vector<StepDecision> pending;
  BatchBuilderOptions opts;
  opts.summary_mode = [] { return true; };
  opts.clock_map = [] { return common::ClockMap(0, 0); };
  opts.run_queue_wait = [](uint32_t) -> std::optional<int64_t> { return std::nullopt; };
  opts.now_ns = [] { return int64_t{0}; };
  opts.step_decisions = [&pending] { return std::exchange(pending, {}); };
  uint64_t batches = 0;
  BatchBuilder builder(0, opts, [&batches](flare::v1::RecordBatch&&) { ++batches; });
  for (uint32_t sig = 1; sig <= 4; ++sig) {
    Signature s;
    s.name = "kernel_" + std::to_string(sig);
    s.kind = OpKind::kKernel;
    builder.addSignature(sig, s);
  }
  Signature marker_sig, coll_sig;
  marker_sig.name = FLARE_STEP_MARKER_NAME;
  marker_sig.kind = OpKind::kSync;
  coll_sig.name = "ncclAllReduce";
  coll_sig.kind = OpKind::kCollective;
  builder.addSignature(5, marker_sig);
  builder.addSignature(6, coll_sig);
  std::vector<CompletedOp> ops;
  int64_t step = 0;
  uint32_t since = 0;
  for (auto _ : state) {
    const int64_t b = 1'000'000'000 + step * kStepNs;
    const bool measured = k <= 1 || step < 3 || step % k == 0;
    ++since;
    if (k > 0) {
      StepDecision d{b, measured, 1};
      if (measured) d.weight = std::exchange(since, 0);
      pending.push_back(d);
    }
    ops.clear();
    CompletedOp marker;
    marker.info.signature_id = 5;
    marker.info.kind = OpKind::kSync;
    marker.issue_ns = marker.start_ns = marker.end_ns = b;
    ops.push_back(marker);
    for (int i = 0; measured && i < kKernels; ++i) {
      CompletedOp op;
      op.info.signature_id = 1 + static_cast<uint32_t>(i % 4);
      op.info.kind = OpKind::kKernel;
      op.issue_ns = b + 1000 + i * 5000;
      op.start_ns = op.issue_ns + 2000 + (i % 7) * 100;
      op.end_ns = op.start_ns + 3000 + (i % 4) * 500;
      op.thread_id = 1;
      ops.push_back(op);
    }
    CompletedOp coll;
    coll.info.signature_id = 6;
    coll.info.kind = OpKind::kCollective;
    coll.info.comm_hash = 9;
    coll.info.seq = static_cast<uint64_t>(step);
    coll.info.nranks = 8;
    coll.issue_ns = b + kStepNs - 200'000;
    coll.start_ns = coll.issue_ns + 1000;
    coll.end_ns = coll.start_ns + 100'000;
    ops.push_back(coll);
    builder.addOps(ops);
    builder.setWatermark(b + kStepNs);
    if (step % 100 == 99) builder.flush();
    ++step;
  }
  builder.finish();
  benchmark::DoNotOptimize(batches);
  state.SetItemsProcessed(state.iterations() * (kKernels + 2));
}
BENCHMARK(summaryStepSampling)->Arg(0)->Arg(1)->Arg(4);

}  // namespace
}  // namespace flare::timing

BENCHMARK_MAIN();
