// The per-job metrics and healthy history against values computed by hand from synthetic jobs.
#include "src/engine/diagnosis/job_metrics.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <span>

#include "src/engine/diagnosis/detectors.h"
#include "src/engine/diagnosis/history.h"

namespace flare::engine {
namespace {

constexpr int64_t kMs = 1'000'000;
constexpr int64_t kUs = 1'000;

// 4 ranks, 5 step markers each (every 10 ms; rank 3 every 12.5 ms), batch size 32. One GEMM of
// 2e9 FLOPs per step taking 10 µs·(rank+1) (step 0, the warm-up, 1 ms: excluded). Three (at 25 ms)
// all-reduces of 1e6 bytes over the 4 ranks, 100 µs from the last arrival (the third 200 µs).
JobModel syntheticJob() {
  JobModel job;
  for (int rank = 0; rank < 4; ++rank) {
    v1::RecordBatch b;
    auto* gemm = b.add_signatures();
    gemm->set_id(1);
    gemm->set_name("gemm");
    gemm->set_kind(v1::OP_KIND_GEMM);
    gemm->set_dtype(v1::DTYPE_BF16);
    auto* ar = b.add_signatures();
    ar->set_id(2);
    ar->set_name("ncclAllReduce");
    ar->set_kind(v1::OP_KIND_COLLECTIVE);
    ar->set_collective(v1::COLLECTIVE_KIND_ALL_REDUCE);
    const int64_t period = rank == 3 ? 12'500'000 : 10 * kMs;
    for (int s = 0; s < 5; ++s) {
      auto* st = b.add_steps();
      st->set_step(static_cast<uint64_t>(s));
      st->set_start_ns(s * period);
      st->set_samples(32);
      if (s == 4) break;
      auto* k = b.add_kernels();
      k->set_signature_id(1);
      k->set_issue_ns(s * period + 1 * kMs);
      k->set_start_ns(s * period + 2 * kMs);
      k->set_end_ns(k->start_ns() + (s == 0 ? 1 * kMs : 10 * kUs * (rank + 1)));
      k->set_flops(2'000'000'000);
    }
    for (int i = 0; i < 3; ++i) {
      auto* k = b.add_kernels();
      k->set_signature_id(2);
      const int64_t last_start = 25 * kMs + i * kMs + 3 * 10 * kUs;  // rank 3 arrives last
      k->set_issue_ns(25 * kMs + i * kMs);
      k->set_start_ns(25 * kMs + i * kMs + rank * 10 * kUs);
      k->set_end_ns(last_start + (i == 2 ? 200 : 100) * kUs);
      k->set_bytes(1'000'000);
      k->mutable_collective()->set_comm_hash(7);
      k->mutable_collective()->set_seq(static_cast<uint64_t>(i));
      k->mutable_collective()->set_nranks(4);
    }
    job.addBatch(rank, b);
  }
  return job;
}

TEST(JobMetrics, ThroughputTflopsAndBusbwMatchHandComputedValues) {
  const JobModel job = syntheticJob();
  const v1::JobMetrics m = computeJobMetrics(job, nullptr, 0);
  // 3 intervals after the warm-up step: 3/30 ms = 100/s on ranks 0-2, 3/37.5 ms = 80/s on 3.
  EXPECT_EQ(m.steps(), 3u);
  EXPECT_NEAR(m.steps_per_second(), 100.0, 1e-9);
  EXPECT_NEAR(m.samples_per_second(), 3200.0, 1e-6);  // 32 samples per step from the markers
  EXPECT_NEAR(computeJobMetrics(job, nullptr, 1024).samples_per_second(), 102400.0, 1e-6);
  // GEMMs issued after the warm-up step (rank 3's step 1 starts at 12.5 ms; its GEMM of step 1
  // is issued at 13.5 ms): 3 per rank, 2e9 FLOPs in 10 µs·(r+1) = 200/(r+1) TFLOPS.
  ASSERT_EQ(m.rank_tflops_size(), 4);
  double flops = 0, ns = 0;
  for (const auto& r : m.rank_tflops()) {
    EXPECT_NEAR(r.tflops(), 200.0 / (r.rank() + 1), 1e-9) << r.rank();
    flops += 3 * 2e9;
    ns += 3 * 10e3 * (r.rank() + 1);
  }
  EXPECT_NEAR(m.tflops(), flops / ns / 1e3, 1e-9);  // 80 TFLOPS
  // all-reduce busbw = S/t · 2(n−1)/n: 1e6 B / 100 µs · 1.5 = 15 GB/s (the third: 7.5); median.
  ASSERT_EQ(m.busbw_size(), 1);
  EXPECT_EQ(m.busbw(0).kind(), "all_reduce");
  EXPECT_EQ(m.busbw(0).instances(), 3u);
  EXPECT_NEAR(m.busbw(0).busbw_gbps(), 15.0, 1e-9);
  EXPECT_FALSE(m.has_baseline());
  // Volume: each rank's one batch over its 5 step boundaries; ranks' batches differ only in the
  // step times' varint lengths, so the median is one of them.
  std::vector<double> per_rank;
  for (const auto& [rank, r] : job.ranks()) {
    ASSERT_EQ(r.batch_bytes.size(), 1u);
    per_rank.push_back(static_cast<double>(r.batch_bytes[0].second) / 5);
  }
  std::sort(per_rank.begin(), per_rank.end());
  EXPECT_GT(m.bytes_per_rank_step(), 0);
  EXPECT_GE(m.bytes_per_rank_step(), per_rank.front());
  EXPECT_LE(m.bytes_per_rank_step(), per_rank.back());
}

TEST(JobMetrics, PerSignatureBusbwIsTheJobFigureOfEachSignature) {
  // The kernel report's job_busbw_gbps: the same instances as JobMetrics.busbw, keyed by the
  // signature (not by kind), and none for a non-collective.
  const JobModel job = syntheticJob();
  const auto by_sig = signatureBusbw(job);
  ASSERT_EQ(by_sig.size(), 1u);
  v1::Signature ar;
  ar.set_name("ncclAllReduce");
  ar.set_kind(v1::OP_KIND_COLLECTIVE);
  const auto it = by_sig.find(signatureKey(ar));
  ASSERT_NE(it, by_sig.end());
  EXPECT_EQ(it->second.instances, 3u);
  EXPECT_NEAR(it->second.gbps, computeJobMetrics(job, nullptr, 0).busbw(0).busbw_gbps(), 1e-12);
  EXPECT_NEAR(it->second.gbps, 15.0, 1e-9);
}

stats::LatencySketch sketchOf(int64_t first_us, int64_t last_us) {
  stats::LatencySketch s;
  for (int64_t us = first_us; us <= last_us; ++us) s.add(static_cast<double>(us * kUs));
  return s;
}

TEST(History, ClippedW1OfShiftedUniformsMatchesTheIntegral) {
  // a = {0..999} µs, b = a + 50 µs. Unclipped: W1 = 50 µs. Clipped at 500 µs:
  // (450·50 + Σ_{j=1..50} j) / 1000 = 23.775 µs.
  const auto a = sketchOf(1, 1000), b = sketchOf(51, 1050);
  EXPECT_NEAR(clippedW1(a, b, 1e12), 50'000, 50'000 * 0.02);
  EXPECT_NEAR(clippedW1(a, b, 500'000), 23'775, 23'775 * 0.03);
  EXPECT_NEAR(clippedW1(a, a, 500'000), 0, 1e-9);
}

TEST(History, LearnedThresholdsFromTwoBaselineRuns) {
  // Run A: 1000..1999 µs, run B: 100 µs later. Merged median ≈ 1550 µs; clipped there
  // W1(A, B) = (450·100 + Σ_{j=1..100} j) / 1000 = 50.05 µs; threshold 1.5 × that > floor.
  v1::HealthyBaseline a, b;
  const auto sa = sketchOf(1000, 1999).serialize(), sb = sketchOf(1100, 2099).serialize();
  a.set_issue_latency(std::string(sa.begin(), sa.end()));
  b.set_issue_latency(std::string(sb.begin(), sb.end()));
  a.set_rank_spread_w1_ns(10'000);
  b.set_rank_spread_w1_ns(12'000);
  a.set_v_inter_max(0.10);
  b.set_v_inter_max(0.04);
  a.set_v_minority_max(0.02);
  b.set_v_minority_max(0.01);
  a.mutable_metrics()->set_steps(4);
  b.mutable_metrics()->set_steps(4);
  (*a.mutable_api_rate())["x"] = 0.2;
  (*b.mutable_api_rate())["x"] = 0.4;
  HistoryOptions options;
  const History h = buildHistory({&a, &b}, options);
  EXPECT_EQ(h.runs, 2u);
  EXPECT_EQ(h.issue_latency.count(), 2000u);
  EXPECT_NEAR(h.issue_cap_ns, 1'550'000, 1'550'000 * 0.01);
  EXPECT_NEAR(h.issue_w1_threshold_ns, 1.5 * 50'050, 1.5 * 50'050 * 0.05);
  ASSERT_TRUE(h.v_inter_threshold && h.v_minority_threshold);
  EXPECT_NEAR(*h.v_inter_threshold, 0.20, 1e-12);     // max(2·0.10, 0.10 + 0.05)
  EXPECT_NEAR(*h.v_minority_threshold, 0.07, 1e-12);  // max(2·0.02, 0.02 + 0.05)
  EXPECT_NEAR(h.api_rate.at("x"), 0.3, 1e-12);
  // One run: its rank spread sets the threshold (1.5 × 10 µs, below the 20 µs floor here).
  EXPECT_NEAR(buildHistory({&a}, options).issue_w1_threshold_ns, 20'000, 1e-9);
  // An unreadable sketch is skipped, not trusted.
  v1::HealthyBaseline bad;
  bad.set_issue_latency("garbage");
  EXPECT_EQ(buildHistory({&bad}, options).runs, 0u);
}

TEST(History, ACollectivesBusbwIsOverTheRunsThatMeasuredOne) {
  // Four runs of one all-reduce; one measured no complete instance (busbw 0): the median and the
  // lowest are over the other three, and the 0 is not a healthy run's figure.
  std::vector<v1::HealthyBaseline> runs(4);
  const double busbw[] = {100, 0, 80, 90};
  const auto sketch = sketchOf(1000, 1999).serialize();
  for (size_t i = 0; i < runs.size(); ++i) {
    runs[i].set_issue_latency(std::string(sketch.begin(), sketch.end()));
    auto* s = runs[i].add_signatures();
    s->mutable_signature()->set_name("ncclAllReduce");
    s->mutable_signature()->set_kind(v1::OP_KIND_COLLECTIVE);
    s->set_p50_ns(1000);
    s->set_busbw_gbps(busbw[i]);
  }
  const History h = buildHistory({&runs[0], &runs[1], &runs[2], &runs[3]}, HistoryOptions{});
  ASSERT_EQ(h.signatures.size(), 1u);
  const HistorySignature& sig = h.signatures.begin()->second;
  EXPECT_EQ(sig.runs, 4u);
  EXPECT_EQ(sig.busbw_runs, 3u);
  EXPECT_NEAR(sig.busbw_gbps, 90, 1e-9);
  EXPECT_NEAR(sig.busbw_low_gbps, 80, 1e-9);
}

TEST(History, BaselineOfAJobKeepsItsSignaturesAndSketch) {
  const JobModel job = syntheticJob();
  const v1::HealthyBaseline b = makeBaseline(job);
  auto sketch = stats::LatencySketch::deserialize(std::span<const uint8_t>(
      reinterpret_cast<const uint8_t*>(b.issue_latency().data()), b.issue_latency().size()));
  ASSERT_TRUE(sketch);
  // After the warm-up: 3 GEMMs (issue latency 1 ms) and 3 all-reduces (10 µs·rank) per rank.
  EXPECT_EQ(sketch->count(), 4u * 6u);
  EXPECT_EQ(b.signatures_size(), 2);
  for (const auto& s : b.signatures()) {
    if (s.signature().kind() == v1::OP_KIND_GEMM) {
      EXPECT_EQ(s.count(), 12u);
      // Durations 10, 20, 30, 40 µs, 3 each: median (lower of the two middle) 20 or 30 µs.
      EXPECT_GE(s.p50_ns(), 20 * kUs);
      EXPECT_LE(s.p50_ns(), 30 * kUs);
      EXPECT_NEAR(s.tflops(), 2e9 / static_cast<double>(s.p50_ns()) / 1e3, 1e-9);
    } else {
      EXPECT_NEAR(s.busbw_gbps(), 15.0, 1e-9);
    }
  }
}

// One bf16 GEMM shape 4096³ on 3 ranks at 100 TFLOPS: the job's best, so only the device can
// say it is slow. H100 SXM (989.4 bf16 TFLOPS, 132 SMs): expected = 989.4 · 0.75 · wave
// efficiency 1024/1056 = 719.6 TFLOPS (compute-bound), and 100 < 0.3 · 719.6.
JobModel oneGemmJob(const std::string& device) {
  JobModel job;
  const double flops = 2.0 * 4096 * 4096 * 4096;
  for (int rank = 0; rank < 3; ++rank) {
    v1::RecordBatch b;
    auto* gemm = b.add_signatures();
    gemm->set_id(1);
    gemm->set_name("gemm");
    gemm->set_kind(v1::OP_KIND_GEMM);
    gemm->set_dtype(v1::DTYPE_BF16);
    for (int64_t d : {4096, 4096, 4096, 1}) gemm->add_shape(d);
    for (int i = 0; i < 4; ++i) {
      auto* k = b.add_kernels();
      k->set_signature_id(1);
      k->set_issue_ns(i * 10 * kMs);
      k->set_start_ns(i * 10 * kMs + kMs);
      k->set_end_ns(k->start_ns() + static_cast<int64_t>(flops / 100e12 * 1e9));  // 100 TFLOPS
      k->set_flops(static_cast<uint64_t>(flops));
    }
    job.addBatch(rank, b);
    job.setRankInfo(rank, "host", device);
  }
  return job;
}

TEST(UnoptimizedGemm, TheDevicePeakTableFlagsAJobWhoseBestGemmIsSlow) {
  DiagnoseOptions options;
  const auto found = diagnose(oneGemmJob("NVIDIA H100 80GB HBM3"), options);
  ASSERT_EQ(found.size(), 1u);
  EXPECT_EQ(found[0].kind, "unoptimized_gemm");
  ASSERT_EQ(found[0].evidence.size(), 1u);
  EXPECT_NEAR(found[0].evidence[0].value, 100.0, 0.01);
  EXPECT_NEAR(found[0].evidence[0].reference, 989.4 * 0.75 * 1024.0 / 1056.0, 0.5);
  EXPECT_NE(found[0].evidence[0].text.find("H100 SXM"), std::string::npos);
  // Unknown device: only the job's own best, which this GEMM is.
  EXPECT_TRUE(diagnose(oneGemmJob(""), options).empty());
  // A configured entry (flared --device-peak) that matches first: 200 bf16 TFLOPS expects
  // 200 · 0.75 · 0.97 = 145 TFLOPS, and 100 is above 0.3 of it.
  stats::PeakTable table = stats::PeakTable::builtin();
  auto capped = stats::parseDevicePeak("capped:bf16=200,mem_gbps=3350,sms=132,match=h100");
  ASSERT_TRUE(capped);
  table.add(*capped);
  options.peaks = &table;
  EXPECT_TRUE(diagnose(oneGemmJob("NVIDIA H100 80GB HBM3"), options).empty());
  // A shape expected to take less than unoptimized_device_min_expected_ns (4096³ at 719.6
  // TFLOPS: 191 us) is not held to the device: on an idle GPU its event-timed calls hold the
  // library's host work (torch.compile's 1 GFLOP GEMMs on the H200: ~1.5 us expected, 20-25 us
  // timed).
  options.peaks = nullptr;
  options.unoptimized_device_min_expected_ns = 200'000;
  EXPECT_TRUE(diagnose(oneGemmJob("NVIDIA H100 80GB HBM3"), options).empty());
  options.unoptimized_device_min_expected_ns = 150'000;
  EXPECT_EQ(diagnose(oneGemmJob("NVIDIA H100 80GB HBM3"), options).size(), 1u);
}

}  // namespace
}  // namespace flare::engine
