// Hang analysis time over synthetic jobs (src/hang/synthetic.h). Run:
//   build/bin/hang_analysis_benchmark
#include <benchmark/benchmark.h>

#include <atomic>
#include <thread>
#include <vector>

#include "src/hang/analysis.h"
#include "src/hang/stack_capture.h"
#include "src/hang/synthetic.h"

namespace flare::hang {
namespace {

void run(benchmark::State& state, testing::Scenario s) {
  const int n = int(state.range(0));
  auto ranks = testing::makeJob(testing::JobShape{n, 8, 8}, s, n / 3);
  for (auto _ : state) {
    Diagnosis d = analyze(ranks);
    if (d.suspects.empty()) state.SkipWithError("no suspect");
    benchmark::DoNotOptimize(d);
  }
  state.counters["ranks"] = n;
}

void BM_ComputeHang(benchmark::State& state) {
  run(state, testing::Scenario::kComputeHang);
}
void BM_StalledLink(benchmark::State& state) {
  run(state, testing::Scenario::kStalledLink);
}

BENCHMARK(BM_ComputeHang)->Arg(1024)->Arg(8192)->Unit(benchmark::kMillisecond);
BENCHMARK(BM_StalledLink)->Arg(1024)->Arg(8192)->Unit(benchmark::kMillisecond);

// Native stack capture (signal + unwind + symbolize) of this process with `range(0)` extra
// threads sleeping in nanosleep.
void BM_CaptureNativeStacks(benchmark::State& state) {
  std::atomic<bool> stop{false};
  std::vector<std::thread> threads;
  for (int i = 0; i < state.range(0); ++i) {
    threads.emplace_back([&] {
      while (!stop.load()) std::this_thread::sleep_for(std::chrono::milliseconds(1));
    });
  }
  CaptureOptions opts;
  opts.python = false;
  for (auto _ : state) {
    flare::v1::StackDump dump;
    CaptureStats stats;
    std::string error;
    if (!captureStacks(opts, &dump, &stats, &error) || stats.timed_out) {
      state.SkipWithError("capture failed");
    }
  }
  stop = true;
  for (auto& t : threads) t.join();
}
BENCHMARK(BM_CaptureNativeStacks)->Arg(8)->Arg(64)->Unit(benchmark::kMillisecond);

}  // namespace
}  // namespace flare::hang

BENCHMARK_MAIN();
