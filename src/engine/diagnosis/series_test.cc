// The plot series (series.h) of a hand-built two-rank job whose step times, void percentages,
// issue latencies and FLOPS are worked out by hand in the comments below.
#include "src/engine/diagnosis/series.h"

#include <gtest/gtest.h>

#include <cmath>

#include "src/stats/json.h"

namespace flare::engine {
namespace {

constexpr uint32_t kGemm = 1, kKernel = 2, kLoader = 1;

flare::v1::RecordBatch tables(int rank) {
  flare::v1::RecordBatch b;
  b.set_rank(rank);
  auto* g = b.add_signatures();
  g->set_id(kGemm);
  g->set_name("cublasGemmEx");
  g->set_kind(flare::v1::OP_KIND_GEMM);
  g->set_dtype(flare::v1::DTYPE_BF16);
  for (int d : {1, 64, 64, 512}) g->add_shape(d);
  g->set_flops_per_call(4'000'000);
  auto* k = b.add_signatures();
  k->set_id(kKernel);
  k->set_name("layer_norm_kernel");
  k->set_kind(flare::v1::OP_KIND_KERNEL);
  auto* a = b.add_api_names();
  a->set_id(kLoader);
  a->set_qualified_name("torch.utils.data.dataloader._BaseDataLoaderIter@__next__");
  return b;
}

void loader(flare::v1::RecordBatch* b, int64_t start, int64_t end) {
  auto* s = b->add_spans();
  s->set_id(static_cast<uint64_t>(b->spans_size()));
  s->set_api_id(kLoader);
  s->set_start_ns(start);
  s->set_end_ns(end);
}

void op(flare::v1::RecordBatch* b, uint32_t sig, int64_t start, int64_t end, int64_t latency) {
  auto* k = b->add_kernels();
  k->set_signature_id(sig);
  k->set_stream_id(7);
  k->set_issue_ns(start - latency);
  k->set_start_ns(start);
  k->set_end_ns(end);
}

// Rank 0: steps start at 0, 1000, 2000, 3000 (DataLoader calls of 100, 200, 100, 50 ns); in each
// step a 400 ns GEMM 50 ns after the loader returns, then a 100 ns minority kernel. Issue
// latency 30 ns (GEMM) and 10 ns (kernel). T_inter is measured inside the step: the GPU idle
// gap opens no earlier than the step's start (docs/metrics.md).
//   step 0: no GPU op before the loader → from 0 to the GEMM at 150 → 0.15; minority 100 / 850
//   step 1: last end 650 (step 0's), so from 1000 to 1250 → 0.25; minority 100 / 750
//   step 2: last end 1750, so from 2000 to 2150 → 0.15; minority 100 / 850
// Rank 1: steps start at 0, 1100, 2300, 3000 (loader 100 ns each), a 500 ns GEMM 50 ns after
// the loader, latency 100 ns (step 2's starts at 3000: no GPU work in step 2); no minority
// kernel.
//   step times 1100, 1200, 700
//   step 0: 150/1100; step 1: from 1100 to 1250 → 150/1200 = 0.125
//   step 2: no GPU op after its loader in the step → idle to its end: 700/700 = 1; its
//   V_minority: nothing outside T_inter → undefined (NaN)
JobModel twoRanks() {
  JobModel job;
  flare::v1::RecordBatch r0 = tables(0);
  const int64_t l0[] = {100, 200, 100, 50};
  for (int s = 0; s < 4; ++s) {
    const int64_t b = 1000 * s, g = b + l0[s] + 50;
    loader(&r0, b, b + l0[s]);
    op(&r0, kGemm, g, g + 400, 30);
    op(&r0, kKernel, g + 400, g + 500, 10);
  }
  job.addBatch(0, r0);
  flare::v1::RecordBatch r1 = tables(1);
  for (int64_t b : {0, 1100, 2300, 3000}) {
    loader(&r1, b, b + 100);
    // Step 2's GEMM is issued in it but starts on the GPU only at the next step's start.
    const int64_t g = b == 2300 ? 3000 : b + 150;
    op(&r1, kGemm, g, g + 500, 100);
  }
  job.addBatch(1, r1);
  return job;
}

TEST(Series, StepTimesAndVoidPercentagesPerRankAndStep) {
  const JobModel job = twoRanks();
  const JobSeries s = computeSeries(job, SeriesOptions{});
  EXPECT_EQ(s.rank_count, 2u);
  EXPECT_EQ(s.total_steps, 3u);
  EXPECT_EQ(s.first_step, 0u);
  EXPECT_EQ(s.step_count, 3u);
  EXPECT_FALSE(s.steps_truncated);
  EXPECT_FALSE(s.ranks_truncated);
  ASSERT_EQ(s.ranks.size(), 2u);
  EXPECT_EQ(s.ranks[0].step_ns, (std::vector<double>{1000, 1000, 1000}));
  EXPECT_EQ(s.ranks[1].step_ns, (std::vector<double>{1100, 1200, 700}));
  EXPECT_EQ(s.ranks[0].v_inter, (std::vector<double>{0.15, 0.25, 0.15}));
  EXPECT_DOUBLE_EQ(s.ranks[0].v_minority[0], 100.0 / 850.0);
  EXPECT_DOUBLE_EQ(s.ranks[0].v_minority[1], 100.0 / 750.0);
  EXPECT_DOUBLE_EQ(s.ranks[0].v_minority[2], 100.0 / 850.0);
  EXPECT_EQ(s.ranks[1].v_inter, (std::vector<double>{150.0 / 1100.0, 0.125, 1.0}));
  EXPECT_DOUBLE_EQ(s.ranks[1].v_minority[0], 0);
  EXPECT_DOUBLE_EQ(s.ranks[1].v_minority[1], 0);
  EXPECT_TRUE(std::isnan(s.ranks[1].v_minority[2]));
}

TEST(Series, IssueLatencyQuantilesAfterWarmUp) {
  // Ops issued before each rank's second step start are warm-up: rank 0 keeps 30,10 ×3 (steps
  // 1-3), rank 1 keeps 100 ×3.
  SeriesOptions opt;
  opt.quantile_points = 3;  // 0, 0.5, 1
  const JobSeries s = computeSeries(twoRanks(), opt);
  EXPECT_EQ(s.probabilities, (std::vector<double>{0, 0.5, 1}));
  EXPECT_EQ(s.latency.samples, 9u);
  EXPECT_EQ(s.latency.ns, (std::vector<double>{10, 30, 100}));
  ASSERT_EQ(s.rank_latency.size(), 2u);
  EXPECT_EQ(s.rank_latency[0].second.ns, (std::vector<double>{10, 20, 30}));  // 10,10,10,30,30,30
  EXPECT_EQ(s.rank_latency[1].second.ns, (std::vector<double>{100, 100, 100}));
  EXPECT_FALSE(s.baseline_latency.has_value());
}

TEST(Series, BaselineDistributionAndW1) {
  // Baseline: one rank, 4 steps, every op issued 50 ns ahead. W1 between the job's sample
  // {10,10,10,30,30,30,100,100,100} and a point mass at 50 is E|X-50| = (120+60+150)/9.
  JobModel base;
  flare::v1::RecordBatch b = tables(0);
  for (int64_t t : {0, 1000, 2000, 3000}) {
    loader(&b, t, t + 100);
    op(&b, kGemm, t + 150, t + 550, 50);
  }
  base.addBatch(0, b);
  SeriesOptions opt;
  opt.quantile_points = 2;
  const JobSeries s = computeSeries(twoRanks(), opt, &base);
  ASSERT_TRUE(s.baseline_latency.has_value());
  EXPECT_EQ(s.baseline_latency->samples, 3u);
  EXPECT_EQ(s.baseline_latency->ns, (std::vector<double>{50, 50}));
  EXPECT_NEAR(s.baseline_w1_ns, 330.0 / 9.0, 1e-9);
}

TEST(Series, SignaturesByGpuTimeWithPerRankTflops) {
  const JobSeries s = computeSeries(twoRanks(), SeriesOptions{});
  ASSERT_EQ(s.signatures.size(), 2u);
  const SignatureSeries& gemm = s.signatures[0];  // 4×400 + 4×500 ns, before 4×100 ns
  EXPECT_EQ(gemm.count, 8u);
  EXPECT_DOUBLE_EQ(gemm.total_ns, 3600);
  EXPECT_NEAR(gemm.tflops, 8 * 4e6 / 3600 / 1e3, 1e-9);
  ASSERT_EQ(gemm.ranks.size(), 2u);
  EXPECT_EQ(gemm.ranks[0].count, 4u);
  EXPECT_DOUBLE_EQ(gemm.ranks[0].p50_ns, 400);
  EXPECT_DOUBLE_EQ(gemm.ranks[0].tflops, 10);  // 4e6 flop / 400 ns
  EXPECT_DOUBLE_EQ(gemm.ranks[1].p50_ns, 500);
  EXPECT_DOUBLE_EQ(gemm.ranks[1].tflops, 8);
  EXPECT_EQ(s.signatures[1].count, 4u);
  EXPECT_DOUBLE_EQ(s.signatures[1].tflops, 0);  // a minority kernel has no FLOP count
}

TEST(Series, BoundsKeepTheLastStepsAndThePriorityRanks) {
  SeriesOptions opt;
  opt.max_steps = 2;
  opt.max_ranks = 1;
  opt.max_signatures = 1;
  opt.priority_ranks = {1, 99};  // 99 is not in the job
  const JobSeries s = computeSeries(twoRanks(), opt);
  EXPECT_TRUE(s.steps_truncated);
  EXPECT_TRUE(s.ranks_truncated);
  EXPECT_TRUE(s.signatures_truncated);
  EXPECT_EQ(s.first_step, 1u);
  EXPECT_EQ(s.step_count, 2u);
  ASSERT_EQ(s.ranks.size(), 1u);
  EXPECT_EQ(s.ranks[0].rank, 1);
  EXPECT_EQ(s.ranks[0].step_ns, (std::vector<double>{1200, 700}));
  ASSERT_EQ(s.signatures.size(), 1u);
  EXPECT_EQ(s.signature_count, 2u);
  // Job-wide figures still count every rank; per-rank rows only the included one.
  EXPECT_EQ(s.latency.samples, 9u);
  ASSERT_EQ(s.signatures[0].ranks.size(), 1u);
  EXPECT_EQ(s.signatures[0].ranks[0].rank, 1);
}

TEST(Series, SummaryModeCountsAndWeightedMedian) {
  JobModel job;
  flare::v1::RecordBatch b = tables(2);
  auto* w = b.add_summaries();
  w->set_signature_id(kGemm);
  w->set_window_start_ns(0);
  w->set_window_end_ns(1'000'000);
  for (auto [count, p50] : {std::pair<uint64_t, int64_t>{10, 300}, {30, 500}}) {
    auto* c = w->add_clusters();
    c->set_count(count);
    c->set_p50_ns(p50);
    c->set_p99_ns(p50 + 10);
    c->set_sum_ns(static_cast<int64_t>(count) * p50);
  }
  job.addBatch(2, b);
  const JobSeries s = computeSeries(job, SeriesOptions{});
  ASSERT_EQ(s.signatures.size(), 1u);
  ASSERT_EQ(s.signatures[0].ranks.size(), 1u);
  const SignatureRankStat& st = s.signatures[0].ranks[0];
  EXPECT_EQ(st.count, 40u);
  EXPECT_DOUBLE_EQ(st.total_ns, 18000);
  EXPECT_DOUBLE_EQ(st.p50_ns, 500);                     // 20th of 40 lies in the 500 ns cluster
  EXPECT_DOUBLE_EQ(st.tflops, 40 * 4e6 / 18000 / 1e3);  // count × flops_per_call
  EXPECT_EQ(s.total_steps, 0u);                         // no step boundaries: no rows of values
}

TEST(Series, JsonIsValidWithNullForUndefinedValues) {
  const JobModel job = twoRanks();
  const JobSeries s = computeSeries(job, SeriesOptions{});
  std::string error;
  const auto doc = stats::json::parse(seriesToJson("job \"x\"", job, s), &error);
  ASSERT_TRUE(doc.has_value()) << error;
  EXPECT_EQ(doc->get("jobId")->string, "job \"x\"");
  const auto* vm = doc->get("vMinority");
  ASSERT_NE(vm, nullptr);
  ASSERT_EQ(vm->array.size(), 2u);
  EXPECT_EQ(vm->array[1].array[2].type, stats::json::Value::Type::kNull);
  EXPECT_EQ(doc->get("stepTimeNs")->array[1].array[1].number, 1200);
  const auto* sig = &doc->get("signatures")->array[0];
  EXPECT_EQ(sig->get("name")->string, "cublasGemmEx");
  EXPECT_EQ(sig->get("kind")->string, "OP_KIND_GEMM");
  EXPECT_EQ(sig->get("dtype")->string, "DTYPE_BF16");
  EXPECT_EQ(sig->get("shape")->array.size(), 4u);
  EXPECT_EQ(doc->get("issueLatency")->get("baseline")->type, stats::json::Value::Type::kNull);
}

}  // namespace
}  // namespace flare::engine
