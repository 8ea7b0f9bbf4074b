// Hang analysis time over synthetic jobs (src/hang/synthetic.h). Run:
//   build/bin/hang_analysis_benchmark
#include <benchmark/benchmark.h>

#include "src/hang/analysis.h"
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

}  // namespace
}  // namespace flare::hang

BENCHMARK_MAIN();
