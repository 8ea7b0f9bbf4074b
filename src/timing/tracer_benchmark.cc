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

#include "src/common/clock.h"
#include "src/timing/run_queue.h"
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

}  // namespace
}  // namespace flare::timing

BENCHMARK_MAIN();
