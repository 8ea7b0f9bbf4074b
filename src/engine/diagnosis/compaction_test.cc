// The daemon's folding of summary-mode windows and step sketches (JobModel::setCompaction), and
// the detectors' large-job paths (issue stall at 10,000 summary-mode ranks).
#include <gtest/gtest.h>
#include <malloc.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <string>
#include <vector>

#include "src/engine/diagnosis/detectors.h"
#include "src/engine/diagnosis/job_model.h"
#include "src/engine/diagnosis/series.h"
#include "src/engine/diagnosis/signals.h"
#include "src/engine/load_shape.h"
#include "src/stats/sketch.h"

namespace flare::engine {
namespace {

constexpr int64_t kSec = 1'000'000'000;

// One second of a summary-mode rank: 3 GEMM signatures' summaries (two clusters each, `factor`
// times longer on a slow rank), a step marker at the second's start and the step's statistics
// with `ops` issue latencies log-uniform over [lo, lo·100).
flare::v1::RecordBatch second(int rank, int64_t t, double factor, double lo, int ops = 100) {
  flare::v1::RecordBatch b;
  b.set_rank(rank);
  if (t == 0) {
    for (int s = 1; s <= 3; ++s) {
      auto* sig = b.add_signatures();
      sig->set_id(s);
      sig->set_name("gemm" + std::to_string(s));
      sig->set_kind(flare::v1::OP_KIND_GEMM);
      sig->add_shape(1024 * s);
    }
  }
  auto* marker = b.add_steps();
  marker->set_start_ns(t * kSec);
  for (int s = 1; s <= 3; ++s) {
    auto* w = b.add_summaries();
    w->set_signature_id(s);
    w->set_stream_id(7);
    w->set_window_start_ns(t * kSec);
    w->set_window_end_ns((t + 1) * kSec);
    for (int c = 0; c < 2; ++c) {
      auto* cl = w->add_clusters();
      const double p50 = (100'000.0 * s * (c + 1) + 37.0 * static_cast<double>(t % 5)) * factor;
      cl->set_count(c == 0 ? 90 : 10);
      cl->set_p50_ns(static_cast<int64_t>(p50));
      cl->set_p99_ns(static_cast<int64_t>(p50 * 1.04));
      cl->set_sum_ns(static_cast<int64_t>(p50 * static_cast<double>(cl->count())));
    }
  }
  auto* st = b.add_step_stats();
  st->set_start_ns(t * kSec);
  st->set_end_ns((t + 1) * kSec);
  st->set_gpu_busy_ns(kSec * 9 / 10);
  st->set_gpu_ops(static_cast<uint64_t>(ops));
  stats::LatencySketch sketch(records::StepStats::kStepSketchAccuracy);
  double sum = 0;
  for (int i = 0; i < ops; ++i) {
    const double v = lo * std::pow(100.0, (i + 0.5 * static_cast<double>(t % 2)) / ops);
    sketch.add(v);
    sum += v;
  }
  st->set_issue_latency_sum_ns(sum);
  const auto bytes = sketch.serialize();
  st->set_issue_latency(bytes.data(), bytes.size());
  return b;
}

// 8 ranks × `seconds` one-second batches; rank 3's GEMMs 1.25× slower.
JobModel job(int seconds, bool fold) {
  JobModel m;
  if (fold) m.setCompaction(20 * kSec, 10 * kSec);
  for (int64_t t = 0; t < seconds; ++t) {
    for (int r = 0; r < 8; ++r) m.addBatch(r, second(r, t, r == 3 ? 1.25 : 1.0, 50'000));
  }
  return m;
}

std::map<uint32_t, std::pair<uint64_t, double>> totals(const RankData& r) {
  std::map<uint32_t, std::pair<uint64_t, double>> out;
  for (const SummaryWindow& w : r.summaries) {
    out[w.sig].first += w.count();
    out[w.sig].second += w.sumNs();
  }
  return out;
}

// A summary window's clusters: in place up to two, in one exact block beyond; copies, moves and
// self-referencing writes keep every cluster.
TEST(ClusterListTest, KeepsEveryClusterInPlaceOrInOneBlock) {
  auto c = [](uint64_t n) { return WindowCluster{n, 1.0 * n, 2.0 * n, 3.0 * n}; };
  auto counts = [](const ClusterList& l) {
    std::vector<uint64_t> v;
    for (const WindowCluster& x : l) v.push_back(x.count);
    return v;
  };
  ClusterList a;
  EXPECT_TRUE(a.empty());
  a.push_back(c(1));
  a.push_back(c(2));
  EXPECT_EQ(a.heapBytes(), 0u);  // in place
  a.push_back(a[0]);             // an element of the list itself, as it moves to a block
  EXPECT_EQ(counts(a), (std::vector<uint64_t>{1, 2, 1}));
  EXPECT_GT(a.heapBytes(), 0u);
  for (uint64_t i = 4; i <= 9; ++i) a.push_back(c(i));
  EXPECT_EQ(a.size(), 9u);
  EXPECT_EQ(a[8].sum, 27.0);
  ClusterList b = a;  // copy: exact block
  EXPECT_EQ(counts(b), counts(a));
  EXPECT_EQ(b.heapBytes(), 9 * sizeof(WindowCluster));
  ClusterList m = std::move(b);  // move: the block changes hands
  EXPECT_EQ(counts(m), counts(a));
  EXPECT_TRUE(b.empty());  // NOLINT(bugprone-use-after-move): moved-from is empty by contract
  m.assign(m.begin() + 7, m.end());  // from itself, back in place
  EXPECT_EQ(counts(m), (std::vector<uint64_t>{8, 9}));
  EXPECT_EQ(m.heapBytes(), 0u);
  ClusterList small;
  small.push_back(c(5));
  a = small;  // a block replaced by in-place clusters
  EXPECT_EQ(counts(a), (std::vector<uint64_t>{5}));
  a = std::move(m);
  EXPECT_EQ(counts(a), (std::vector<uint64_t>{8, 9}));
  a = a;  // NOLINT: self-assignment is a no-op
  EXPECT_EQ(counts(a), (std::vector<uint64_t>{8, 9}));
}

TEST(Compaction, FoldsAgedWindowsAndKeepsTheirTotals) {
  const JobModel full = job(90, false);
  const JobModel folded = job(90, true);
  const RankData& a = full.ranks().at(0);
  const RankData& b = folded.ranks().at(0);
  EXPECT_EQ(a.summaries.size(), 270u);
  // Fine: the last ~20-30 s (folding runs once per 10 s); coarse: one window per signature and
  // 10 s bucket before that, plus the warm-up second kept whole.
  EXPECT_LE(b.summaries.size(), 3u * (30 + 9 + 1));
  EXPECT_GT(b.coarse_summaries, 0u);
  for (size_t i = 0; i < b.coarse_summaries; ++i) {
    EXPECT_LE(b.summaries[i].clusters.size(), 8u);
    EXPECT_LE(b.summaries[i].end - b.summaries[i].start, 10 * kSec);
  }
  // The warm-up window (before the second step boundary, 1 s) is never folded.
  EXPECT_TRUE(std::any_of(b.summaries.begin(), b.summaries.end(),
                          [](const SummaryWindow& w) { return w.start == 0 && w.end == kSec; }));
  // Every kernel and every nanosecond is still counted.
  const auto ta = totals(a), tb = totals(b);
  ASSERT_EQ(ta.size(), tb.size());
  for (const auto& [sig, t] : ta) {
    EXPECT_EQ(tb.at(sig).first, t.first);
    EXPECT_NEAR(tb.at(sig).second, t.second, 1e-9 * t.second);
  }
  // Step sketches: most folded into coarse buckets; the steps keep their figures.
  EXPECT_FALSE(b.coarse_steps.empty());
  EXPECT_EQ(b.steps.size(), a.steps.size());
  EXPECT_EQ(folded.stepStats(0).size(), full.stepStats(0).size());
  // The issue latencies the detectors read: as many, each within the sketch's 2% (a merged
  // sketch clips its edge buckets to its own min and max, not each step's).
  auto la = rankIssueLatencies(full, 0), lb = rankIssueLatencies(folded, 0);
  std::sort(la.begin(), la.end());
  std::sort(lb.begin(), lb.end());
  ASSERT_EQ(la.size(), lb.size());
  for (size_t i = 0; i < la.size(); ++i) ASSERT_NEAR(lb[i], la[i], 0.02 * la[i]) << i;
}

TEST(Compaction, DetectorsAgreeOnTheFoldedWindow) {
  const auto a = diagnose(job(90, false), DiagnoseOptions{});
  const auto b = diagnose(job(90, true), DiagnoseOptions{});
  ASSERT_EQ(a.size(), 1u);
  ASSERT_EQ(b.size(), 1u);
  EXPECT_EQ(b[0].kind, "gpu_slow");
  EXPECT_EQ(b[0].ranks, std::vector<int>{3});
  EXPECT_NEAR(b[0].severity, a[0].severity, 0.005);
}

TEST(Compaction, TrimDropsWholeBucketsAndKeepsTheLayout) {
  JobModel m = job(90, true);
  m.trim(45 * kSec, 1000);
  const RankData& r = m.ranks().at(0);
  ASSERT_LE(r.coarse_summaries, r.summaries.size());
  for (const SummaryWindow& w : r.summaries) EXPECT_GE(w.end, 45 * kSec);
  for (const CoarseSteps& c : r.coarse_steps) EXPECT_GE(c.end, 45 * kSec);
  for (size_t i = r.coarse_summaries; i < r.summaries.size(); ++i) {
    EXPECT_EQ(r.summaries[i].end - r.summaries[i].start, kSec);  // the fine part stays fine
  }
}

TEST(Compaction, HandOverInPiecesEqualsOneModel) {
  // The daemon's path: batches go to a feeding model; every 7 s what arrived is taken and
  // absorbed by the analysed (folding) model. The result holds what one folding model fed every
  // batch holds, and the feeding model keeps its tables (later batches carry no signatures).
  JobModel incoming, analysed, direct;
  analysed.setCompaction(20 * kSec, 10 * kSec);
  direct.setCompaction(20 * kSec, 10 * kSec);
  for (int64_t t = 0; t < 90; ++t) {
    for (int r = 0; r < 8; ++r) {
      const auto b = second(r, t, r == 3 ? 1.25 : 1.0, 50'000);
      incoming.addBatch(r, b);
      direct.addBatch(r, b);
    }
    if (t % 7 == 6) analysed.absorb(incoming.takeRecords());
  }
  analysed.absorb(incoming.takeRecords());
  EXPECT_TRUE(incoming.ranks().at(0).summaries.empty());
  EXPECT_EQ(incoming.ranks().at(0).unknown_signature_records, 0u);
  EXPECT_EQ(analysed.signatures().size(), direct.signatures().size());
  for (int r = 0; r < 8; ++r) {
    const RankData& a = analysed.ranks().at(r);
    const RankData& d = direct.ranks().at(r);
    EXPECT_EQ(a.steps.size(), d.steps.size());
    EXPECT_EQ(a.step_starts.size(), d.step_starts.size());
    EXPECT_EQ(a.unknown_signature_records, 0u);
    const auto ta = totals(a), td = totals(d);
    ASSERT_EQ(ta.size(), td.size());
    for (const auto& [sig, t] : td) EXPECT_EQ(ta.at(sig).first, t.first);
    EXPECT_GT(a.coarse_summaries, 0u);
  }
  const auto found = diagnose(analysed, DiagnoseOptions{});
  ASSERT_EQ(found.size(), 1u);
  EXPECT_EQ(found[0].ranks, std::vector<int>{3});
}

TEST(Compaction, OffByDefault) {
  const JobModel m = job(40, false);
  EXPECT_EQ(m.ranks().at(0).coarse_summaries, 0u);
  EXPECT_TRUE(m.ranks().at(0).coarse_steps.empty());
}

TEST(LargeJob, IssueStallAmongTenThousandSummaryRanks) {
  // 10,000 summary-mode ranks × 24 steps; rank 4242's host stalls: its kernels' issue latencies
  // are 100× lower (its GPU waits for work) and its GPU idles. The pooled-reference path names
  // it; the exact leave-one-out comparison (O(n² × ops)) would take hours here.
  JobModel m;
  for (int64_t t = 0; t < 24; ++t) {
    for (int r = 0; r < 10000; ++r) {
      flare::v1::RecordBatch b = second(r, t, 1.0, r == 4242 ? 500 : 50'000, 40);
      b.clear_summaries();
      if (r == 4242) b.mutable_step_stats(0)->set_gpu_busy_ns(kSec / 2);
      m.addBatch(r, b);
    }
  }
  const auto t0 = std::chrono::steady_clock::now();
  const auto found = diagnose(m, DiagnoseOptions{});
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  ASSERT_EQ(found.size(), 1u);
  EXPECT_EQ(found[0].kind, "issue_stall");
  EXPECT_EQ(found[0].ranks, std::vector<int>{4242});
  RecordProperty("diagnose_seconds", std::to_string(seconds));
}

}  // namespace
}  // namespace flare::engine

namespace flare::engine {
namespace {
// Not a test: the figures of docs/benchmarks.md ("Steady state: after the detectors' 2-minute
// window has filled"), printed. Run with (FLARE_BENCH_RANKS=N in the environment for another
// size, FLARE_BENCH_PASSES=K for another number of detector passes)
//   build/bin/diagnosis_test --gtest_also_run_disabled_tests --gtest_filter='WindowMeasurement.*'
// N summary-mode ranks (default 128) of what flare-loadgen sends each second (50 signatures of
// two clusters, a step marker, the step's statistics of 1,000 ops and two host causes), handed
// over each second and folded as flared does (--fold-after-s 10) for 200 s, trimmed to the
// 120 s window; the live heap per rank over the last 20 s, then two detector passes (time and
// peak RSS).
TEST(WindowMeasurement, DISABLED_PerRankBytesAndOnePass) {
  // One second of a rank, as flare-loadgen sends it; the signature table with the first.
  auto batch = [](int rank, int64_t t) {
    flare::v1::RecordBatch b;
    b.set_rank(rank);
    if (t == 1) load::addSignatures(&b, 50);
    load::addStepMarker(&b, static_cast<uint64_t>(t), t * kSec, kSec);
    load::addSummaryInterval(&b, 50, 1000, t * kSec, kSec);
    return b;
  };
  // The live heap: chunks in use plus mmapped ones (uordblks alone leaves out every block glibc
  // mmapped, e.g. a rank's ~240 KB summaries vector until the dynamic mmap threshold has risen).
  auto live = [] {
    const struct mallinfo2 m = mallinfo2();
    return m.uordblks + m.hblkhd;
  };
  const size_t before = live();
  JobModel incoming, model;
  incoming.setCompaction(10 * kSec, 10 * kSec);
  model.setCompaction(10 * kSec, 10 * kSec);
  const char* env = std::getenv("FLARE_BENCH_RANKS");
  const int kRanks = env != nullptr ? std::max(3, std::atoi(env)) : 128;
  // The live heap over the last 20 s: folding every 10 s makes it saw-toothed.
  size_t low = SIZE_MAX, high = 0;
  // The batches are built outside the timed part (the daemon receives them parsed).
  std::vector<flare::v1::RecordBatch> batches(kRanks);
  double fill_s = 0;
  for (int64_t t = 1; t <= 200; ++t) {
    for (int r = 0; r < kRanks; ++r) batches[r] = batch(r, t);
    const auto t0 = std::chrono::steady_clock::now();
    for (int r = 0; r < kRanks; ++r) incoming.addBatch(r, batches[r]);
    model.absorb(incoming.takeRecords());
    model.trim(t * kSec - 120 * kSec, 1 << 20);
    fill_s += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    if (t > 180) {
      const size_t now = live();
      low = std::min(low, now);
      high = std::max(high, now);
    }
  }
  printf("the window's cost: %.1f µs per batch (conversion, hand-over, folding, trim)\n",
         fill_s * 1e6 / (200.0 * kRanks));
  const RankData& r = model.ranks().at(5);
  size_t sk = 0;
  for (const auto& st : r.steps) sk += st.causes.size();
  printf(
      "%d ranks: live heap %.1f–%.1f KiB per rank (the last 20 s); at the end: summary windows "
      "%zu (capacity %zu, %zu folded); steps %zu (capacity %zu, %zu cause sketches unfolded); "
      "folded step buckets %zu\n",
      kRanks, static_cast<double>(low - before) / 1024.0 / kRanks,
      static_cast<double>(high - before) / 1024.0 / kRanks, r.summaries.size(),
      r.summaries.capacity(), r.coarse_summaries, r.steps.size(), r.steps.capacity(), sk,
      r.coarse_steps.size());
  auto hwm = [] {
    FILE* f = fopen("/proc/self/status", "r");
    char line[256];
    long v = 0;
    while (fgets(line, sizeof line, f))
      if (sscanf(line, "VmHWM: %ld", &v) == 1) break;
    fclose(f);
    return v;
  };
  // Where rank 5's bytes are (sizes and capacities, not counting malloc's per-block overhead).
  {
    auto sketchBytes = [](const stats::LatencySketch& s) { return s.heapBytes(); };
    size_t sw = r.summaries.capacity() * sizeof(SummaryWindow), cl = 0, ncl = 0, blocks = 0;
    for (const auto& w : r.summaries) {
      cl += w.clusters.heapBytes();
      ncl += w.clusters.size();
      blocks += w.clusters.heapBytes() > 0;
    }
    size_t st = r.steps.capacity() * sizeof(ReceivedStep), sks = 0, cs = 0;
    for (const auto& s : r.steps) {
      sks += sketchBytes(s.stats.latency);
      for (const auto& c : s.causes) cs += sizeof(c) + sketchBytes(c.second);
    }
    size_t co = r.coarse_steps.capacity() * sizeof(CoarseSteps), cos = 0;
    for (const auto& c : r.coarse_steps) {
      cos += sketchBytes(c.latency);
      for (const auto& k : c.causes) cos += sizeof(k) + sketchBytes(k.second);
    }
    printf(
        "rank 5: summaries %zu B + clusters %zu B (%zu clusters, %zu blocks); steps %zu B + "
        "sketches ~%zu B + causes ~%zu B; coarse steps %zu B + ~%zu B; step_starts %zu B; "
        "batch_bytes %zu B; sizeof SummaryWindow %zu, ReceivedStep %zu, LatencySketch %zu\n",
        sw, cl, ncl, blocks, st, sks, cs, co, cos, r.step_starts.capacity() * 8,
        r.batch_bytes.capacity() * 16, sizeof(SummaryWindow), sizeof(ReceivedStep),
        sizeof(stats::LatencySketch));
  }
  printf("peak RSS before the passes %ld KiB\n", hwm());
  const char* passes = std::getenv("FLARE_BENCH_PASSES");
  fflush(stdout);
  for (int i = 0; i < (passes != nullptr ? std::atoi(passes) : 2); ++i) {
    const auto t0 = std::chrono::steady_clock::now();
    const auto found = diagnose(model, DiagnoseOptions{});
    printf("pass %d: %.2f s, %zu diagnoses; peak RSS %ld KiB\n", i + 1,
           std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count(),
           found.size(), hwm());
  }
}

// A second() batch as a sampled-out step sends it: its times only (nothing timed).
void sampleOut(flare::v1::RecordBatch* b) {
  b->clear_summaries();
  auto* st = b->mutable_step_stats(0);
  st->set_sampled_out(true);
  st->set_gpu_busy_ns(0);
  st->set_gpu_ops(0);
  st->set_issue_latency_sum_ns(0);
  const auto empty = stats::LatencySketch(records::StepStats::kStepSketchAccuracy).serialize();
  st->set_issue_latency(empty.data(), empty.size());
}

bool sampledOutSecond(int64_t t) {
  return t >= 4 && t % 3 != 0;
}  // 4 5 7 8 10 11

// `ranks` ranks of 12 one-second steps, those of sampledOutSecond() sampled out; `adjust` sees
// each batch before it is sampled out and added.
template <typename Adjust>
JobModel sampledJob(int ranks, Adjust adjust) {
  JobModel m;
  for (int64_t t = 0; t < 12; ++t) {
    for (int r = 0; r < ranks; ++r) {
      flare::v1::RecordBatch b = second(r, t, 1.0, 50'000);
      adjust(t, &b);
      if (sampledOutSecond(t)) sampleOut(&b);
      m.addBatch(r, b);
    }
  }
  return m;
}

// Step sampling (FLARE_SAMPLE_STEPS): a rank's sampled-out steps come with their times only. The
// detectors' step figures leave them out (their GPU time, 0, would read as an idle GPU), the
// steps still count as present (stepStarts, the times of stepStats(rank, true)), and what the
// detectors looked at says how many were measured.
TEST(StepSamplingTest, SampledOutStepsCountAsPresentButGiveNoGpuFigure) {
  const auto sampled_out = sampledOutSecond;
  const JobModel m = sampledJob(4, [](int64_t, flare::v1::RecordBatch*) {});
  for (int r = 0; r < 4; ++r) {
    const auto all = m.stepStats(r, /*with_sampled_out=*/true);
    ASSERT_EQ(all.size(), 12u) << r;  // every step present, with its time
    for (const auto& st : all) {
      EXPECT_EQ(st.end_ns - st.start_ns, kSec);
      EXPECT_EQ(st.sampled_out, sampled_out(st.start_ns / kSec));
    }
    const auto measured = m.stepStats(r);
    ASSERT_EQ(measured.size(), 6u) << r;
    for (const auto& st : measured) {
      EXPECT_FALSE(st.sampled_out);
      EXPECT_EQ(st.gpu_busy_ns, kSec * 9 / 10);
      EXPECT_EQ(st.step, st.start_ns / kSec);  // numbered among all the steps
    }
    for (const ReceivedStep* st : m.receivedSteps(r)) EXPECT_FALSE(st->stats.sampled_out);
  }
  std::vector<DetectorRun> runs;
  const auto found =
      runDetectors(builtinDetectors(), m, DiagnoseOptions{}, nullptr, nullptr, &runs);
  EXPECT_TRUE(found.empty())
      << (found.empty() ? "" : found.front().kind);  // no idle GPU from the sampled-out steps
  const LookedAt looked = lookedAt(m, runs);
  EXPECT_EQ(looked.steps_measured, 4u * 5);  // steps 1-3, 6 and 9 of each rank (0: warm-up)
  EXPECT_EQ(looked.steps_sampled_out, 4u * 6);
  EXPECT_NE(lookedAtText(looked).find("20 measured rank-steps; 24 sampled out"), std::string::npos)
      << lookedAtText(looked);
}

// A sampled-out step's run-queue wait is measured (the rank reads it every step, its kernels
// untimed or not): the series shows it beside a null V_inter, and the per-rank wait the
// cpu_contention evidence cites is the median over every step. Under the default timing budget
// most steps are sampled out; the series showed the wait in 1 step of 8.
TEST(StepSamplingTest, ASampledOutStepKeepsItsRunQueueWait) {
  const auto sampled_out = sampledOutSecond;
  // 1 ms in a measured step, 3 ms in a sampled-out one: the median tells which were read.
  const JobModel m = sampledJob(2, [](int64_t t, flare::v1::RecordBatch* b) {
    b->mutable_step_stats(0)->set_run_queue_wait_ns(sampledOutSecond(t) ? 3'000'000 : 1'000'000);
  });
  const JobSeries s = computeSeries(m, SeriesOptions{});
  ASSERT_EQ(s.ranks.size(), 2u);
  for (const RankSteps& row : s.ranks) {
    ASSERT_EQ(row.run_queue_wait_ns.size(), row.v_inter.size());
    for (size_t i = 0; i < row.v_inter.size(); ++i) {
      const int64_t t = static_cast<int64_t>(s.first_step + i);
      EXPECT_EQ(row.run_queue_wait_ns[i], sampled_out(t) ? 3e6 : 1e6) << t;
      EXPECT_EQ(std::isnan(row.v_inter[i]), sampled_out(t)) << t;
    }
  }
  // Steps 1-11 (the first after the warm-up left out): 6 sampled out at 3 ms, 5 measured at 1.
  const auto wait = signals::runQueueWaitPerStep(m);
  ASSERT_EQ(wait.size(), 2u);
  for (const auto& [rank, ns] : wait) EXPECT_EQ(ns, 3e6) << rank;
}

// Read weighted (what a run is compared with history by), a measured step's issue latencies
// stand for it and the steps sampled out before it (as its ops do in the kernel summaries):
// steps 1-3 measured one by one (the budget not chosen yet), 6 and 9 each after two sampled out.
// Unweighted, the early steps were 3 of 5 in the sample; the H200 healthy-small loop's stored
// history then read as low as a stray synchronize.
TEST(StepSamplingTest, AMeasuredStepsIssueLatenciesStandForTheStepsSampledOutBeforeIt) {
  constexpr int kOps = 100;
  // Early steps' latencies from 50 us, the later measured ones' from 5 ms: no overlap.
  const JobModel m = sampledJob(1, [](int64_t t, flare::v1::RecordBatch* b) {
    if (t < 4) return;
    *b = second(0, t, 1.0, 5'000'000);
  });
  const std::vector<double> v = signals::issueLatencies(m, m.ranks().at(0), SIZE_MAX, true);
  ASSERT_EQ(v.size(), static_cast<size_t>(kOps * (3 + 3 + 3)));  // 1, 2, 3; 6 ×3; 9 ×3
  const auto late = std::count_if(v.begin(), v.end(), [](double x) { return x >= 4'900'000; });
  EXPECT_EQ(late, 6 * kOps);
  EXPECT_EQ(rankIssueLatencies(m, 0).size(), v.size());  // what history compares
  // Unweighted (ranks compared at the same measured steps: issue_stall), each step once.
  EXPECT_EQ(signals::issueLatencies(m, m.ranks().at(0)).size(), static_cast<size_t>(kOps * 5));
  // A quantile sample of the weighted distribution keeps its proportions.
  const std::vector<double> q = signals::issueLatencies(m, m.ranks().at(0), 90, true);
  ASSERT_EQ(q.size(), 90u);
  EXPECT_EQ(std::count_if(q.begin(), q.end(), [](double x) { return x >= 4'900'000; }), 60);
  // Folded (compaction) the weights stay: the sketches were scaled when they arrived.
  JobModel folded;
  folded.setCompaction(4 * kSec, 2 * kSec);
  for (int64_t t = 0; t < 12; ++t) {
    flare::v1::RecordBatch b = second(0, t, 1.0, t < 4 ? 50'000 : 5'000'000);
    if (sampledOutSecond(t)) sampleOut(&b);
    folded.addBatch(0, b);
  }
  const std::vector<double> w =
      signals::issueLatencies(folded, folded.ranks().at(0), SIZE_MAX, true);
  EXPECT_EQ(std::count_if(w.begin(), w.end(), [](double x) { return x >= 4'900'000; }), 6 * kOps);
  EXPECT_EQ(w.size(), v.size());
}

}  // namespace
}  // namespace flare::engine
