// Cost of one kernel-duration summary (clusterDurations: log, bandwidth, binned KDE, valleys,
// per-cluster order statistics) for n = 100, 10k and 1M durations, bimodal log-normal; and of
// the W1 between two rebuilt summaries, two raw samples and two sketches; and the cross-rank
// summary outlier check of one signature over 8 to 10,000 ranks.
//
//   build/bin/stats_benchmark
#include <benchmark/benchmark.h>

#include <cmath>
#include <random>
#include <vector>

#include "src/stats/kde.h"
#include "src/stats/outliers.h"
#include "src/stats/sketch.h"
#include "src/stats/wasserstein.h"

namespace flare::stats {
namespace {

std::vector<double> durations(size_t n, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::lognormal_distribution<double> fast(std::log(2e4), 0.05), slow(std::log(2.6e4), 0.05);
  std::vector<double> x(n);
  for (size_t i = 0; i < n; ++i) x[i] = (i % 5 == 0) ? slow(rng) : fast(rng);
  return x;
}

void BM_ClusterDurations(benchmark::State& state) {
  const auto x = durations(static_cast<size_t>(state.range(0)), 1);
  size_t clusters = 0;
  for (auto _ : state) {
    const Clustering c = clusterDurations(x);
    clusters = c.clusters.size();
    benchmark::DoNotOptimize(c);
  }
  state.counters["clusters"] = static_cast<double>(clusters);
  state.SetItemsProcessed(state.iterations() * state.range(0));
}
BENCHMARK(BM_ClusterDurations)->Arg(100)->Arg(10000)->Arg(1000000)->Unit(benchmark::kMicrosecond);

void BM_W1Summaries(benchmark::State& state) {
  const auto a = clusterDurations(durations(10000, 2)).clusters;
  const auto b = clusterDurations(durations(10000, 3)).clusters;
  for (auto _ : state)
    benchmark::DoNotOptimize(
        wasserstein1(std::span<const DurationCluster>(a), std::span<const DurationCluster>(b)));
}
BENCHMARK(BM_W1Summaries)->Unit(benchmark::kMicrosecond);

void BM_W1Exact(benchmark::State& state) {
  const auto a = durations(static_cast<size_t>(state.range(0)), 2);
  const auto b = durations(static_cast<size_t>(state.range(0)), 3);
  for (auto _ : state)
    benchmark::DoNotOptimize(wasserstein1(std::span<const double>(a), std::span<const double>(b)));
}
BENCHMARK(BM_W1Exact)->Arg(10000)->Unit(benchmark::kMicrosecond);

// The cross-rank check of one signature (summaryOutliers) over n ranks' two-cluster summaries:
// exact pairwise means up to OutlierOptions::maxReferences (128) ranks, the quantile grid above.
void BM_SummaryOutliers(benchmark::State& state) {
  const size_t n = static_cast<size_t>(state.range(0));
  std::vector<std::vector<DurationCluster>> members;
  for (size_t i = 0; i < n; ++i) members.push_back(clusterDurations(durations(200, i)).clusters);
  for (auto _ : state) benchmark::DoNotOptimize(summaryOutliers(members));
  state.SetItemsProcessed(state.iterations() * state.range(0));
}
BENCHMARK(BM_SummaryOutliers)
    ->Arg(8)
    ->Arg(256)
    ->Arg(1024)
    ->Arg(10000)
    ->Unit(benchmark::kMillisecond);

void BM_SketchAdd(benchmark::State& state) {
  const auto a = durations(100000, 4);
  for (auto _ : state) {
    LatencySketch s;
    for (double v : a) s.add(v);
    benchmark::DoNotOptimize(s);
  }
  state.SetItemsProcessed(state.iterations() * 100000);
}
BENCHMARK(BM_SketchAdd)->Unit(benchmark::kMicrosecond);

void BM_W1Sketches(benchmark::State& state) {
  LatencySketch sa, sb;
  for (double v : durations(100000, 5)) sa.add(v);
  for (double v : durations(100000, 6)) sb.add(v * 1.3);
  for (auto _ : state) benchmark::DoNotOptimize(wasserstein1(sa, sb));
}
BENCHMARK(BM_W1Sketches)->Unit(benchmark::kMicrosecond);

}  // namespace
}  // namespace flare::stats

BENCHMARK_MAIN();
