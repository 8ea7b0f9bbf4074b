// MODE_SUMMARY: the Tracer (with the fake GPU) feeding a SpoolSink that summarises compute ops,
// and the SummaryAggregator's window.
#include <gtest/gtest.h>
#include <stdlib.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <initializer_list>
#include <map>
#include <optional>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "flare/step.h"
#include "src/common/clock.h"
#include "src/records/spool_format.h"
#include "src/timing/batch_builder.h"
#include "src/timing/spool_sink.h"
#include "src/timing/step_sampling.h"
#include "src/timing/summary_aggregator.h"
#include "src/timing/testing/fake_device_timer.h"
#include "src/timing/timing.h"

namespace flare::timing {
namespace {

namespace fs = std::filesystem;

class SummaryModeTest : public ::testing::Test {
 protected:
  void SetUp() override {
    std::string pattern = (fs::temp_directory_path() / "flare-summary-XXXXXX").string();
    ASSERT_NE(mkdtemp(pattern.data()), nullptr);
    dir_ = pattern;
  }
  void TearDown() override {
    std::error_code ec;
    fs::remove_all(dir_, ec);
  }
  std::string dir_;
};

Signature makeSig(std::string name, OpKind kind) {
  Signature sig;
  sig.name = std::move(name);
  sig.kind = kind;
  return sig;
}

OpInfo info(uint32_t sig, OpKind kind) {
  OpInfo i;
  i.signature_id = sig;
  i.kind = kind;
  return i;
}

// Nearest-rank-free check: the median of a sorted vector (odd or even) within `tol`.
double medianOf(std::vector<int64_t> v) {
  std::sort(v.begin(), v.end());
  const size_t n = v.size();
  return n % 2 ? static_cast<double>(v[n / 2]) : 0.5 * static_cast<double>(v[n / 2 - 1] + v[n / 2]);
}

TEST_F(SummaryModeTest, ComputeOpsAreSummarisedCollectivesStayRaw) {
  common::FakeClock clock(1'000'000);
  testing::FakeDeviceTimer timer(&clock);
  void* const compute = reinterpret_cast<void*>(0x10);
  void* const comm = reinterpret_cast<void*>(0x20);
  std::string path;
  // Truth, computed here from the durations the fake GPU is told.
  std::vector<int64_t> fast, slow, small;
  {
    SpoolSinkOptions options;
    options.summary = true;
    options.summary_window_ns = int64_t{1} << 50;  // one window: cut by the drain's flush
    options.clock_map = [] { return common::ClockMap(0, 1'700'000'000'000'000'000); };
    SpoolSink sink(dir_, "job", 0, 1, options);
    path = sink.path();
    Tracer tracer(&timer, &clock, &sink, TracerOptions{});
    const uint32_t gemm = tracer.intern(makeSig("cublasGemmEx", OpKind::kGemm));
    const uint32_t ew = tracer.intern(makeSig("elementwise", OpKind::kKernel));
    const uint32_t ar = tracer.intern(makeSig("ncclAllReduce", OpKind::kCollective));
    auto launch = [&](void* stream, OpInfo info) {
      Tracer::Ticket ticket;
      ASSERT_TRUE(tracer.begin(stream, &ticket));
      tracer.end(&ticket, info);
    };
    for (int i = 0; i < 1000; ++i) launch(compute, info(gemm, OpKind::kGemm));
    for (int i = 0; i < 100; ++i) launch(compute, info(ew, OpKind::kKernel));
    for (uint64_t i = 0; i < 20; ++i) {
      OpInfo coll = info(ar, OpKind::kCollective);
      coll.bytes = 1 << 20;
      coll.comm_hash = 77;
      coll.seq = i;
      coll.nranks = 8;
      launch(comm, coll);
    }
    int64_t t = 10'000'000;
    // GEMMs: 900 near 10 µs, 100 near 100 µs (two modes); elementwise: ~2 µs.
    for (int i = 0; i < 1000; ++i) {
      const int64_t d = i % 10 == 9 ? 100'000 + (i % 7) * 500 : 10'000 + (i % 13) * 40;
      (i % 10 == 9 ? slow : fast).push_back(d);
      ASSERT_TRUE(timer.completeOp(compute, t, t + d));
      t += d + 1'000;
    }
    for (int i = 0; i < 100; ++i) {
      const int64_t d = 2'000 + (i % 5) * 10;
      small.push_back(d);
      ASSERT_TRUE(timer.completeOp(compute, t, t + d));
      t += d + 1'000;
    }
    for (int i = 0; i < 20; ++i) {
      ASSERT_TRUE(timer.completeOp(comm, t, t + 50'000));
      t += 60'000;
    }
    ASSERT_TRUE(tracer.drain(10'000'000'000));
  }
  std::vector<flare::v1::RecordBatch> batches;
  std::string error;
  ASSERT_TRUE(records::readSpoolFile(path, &batches, &error)) << error;
  std::map<std::string, uint32_t> ids;
  std::map<uint32_t, std::vector<flare::v1::KernelSummary>> summaries;
  std::vector<flare::v1::KernelRecord> raw;
  for (const auto& b : batches) {
    for (const auto& s : b.signatures()) ids[s.name()] = s.id();
    for (const auto& s : b.summaries()) summaries[s.signature_id()].push_back(s);
    for (const auto& k : b.kernels()) raw.push_back(k);
  }
  // Collectives: one raw record each, with their identity.
  ASSERT_EQ(raw.size(), 20u);
  for (size_t i = 0; i < raw.size(); ++i) {
    EXPECT_EQ(raw[i].signature_id(), ids["ncclAllReduce"]);
    EXPECT_EQ(raw[i].collective().seq(), i);
    EXPECT_EQ(raw[i].collective().comm_hash(), 77u);
  }
  EXPECT_EQ(summaries.count(ids["ncclAllReduce"]), 0u);
  // GEMM: one summary, two clusters whose counts and sums are the two modes'.
  ASSERT_EQ(summaries[ids["cublasGemmEx"]].size(), 1u);
  const auto& g = summaries[ids["cublasGemmEx"]][0];
  EXPECT_EQ(g.stream_id(), 0x10u);
  ASSERT_EQ(g.clusters_size(), 2);
  int64_t fast_sum = 0, slow_sum = 0;
  for (int64_t d : fast) fast_sum += d;
  for (int64_t d : slow) slow_sum += d;
  EXPECT_EQ(g.clusters(0).count(), fast.size());
  EXPECT_EQ(g.clusters(0).sum_ns(), fast_sum);
  EXPECT_EQ(g.clusters(1).count(), slow.size());
  EXPECT_EQ(g.clusters(1).sum_ns(), slow_sum);
  EXPECT_NEAR(static_cast<double>(g.clusters(0).p50_ns()), medianOf(fast), 1.0);
  EXPECT_NEAR(static_cast<double>(g.clusters(1).p50_ns()), medianOf(slow), 1.0);
  EXPECT_GE(g.clusters(1).p99_ns(), g.clusters(1).p50_ns());
  EXPECT_LE(g.clusters(1).p99_ns(), *std::max_element(slow.begin(), slow.end()));
  EXPECT_LT(g.window_start_ns(), g.window_end_ns());
  // Elementwise: one cluster with all 100.
  ASSERT_EQ(summaries[ids["elementwise"]].size(), 1u);
  const auto& e = summaries[ids["elementwise"]][0];
  ASSERT_EQ(e.clusters_size(), 1);
  int64_t small_sum = 0;
  for (int64_t d : small) small_sum += d;
  EXPECT_EQ(e.clusters(0).count(), 100u);
  EXPECT_EQ(e.clusters(0).sum_ns(), small_sum);
}

CompletedOp opAt(uint32_t sig, int64_t start, int64_t dur, uint64_t stream = 1) {
  CompletedOp op;
  op.info.signature_id = sig;
  op.info.kind = OpKind::kKernel;
  op.stream_id = stream;
  op.start_ns = start;
  op.end_ns = start + dur;
  return op;
}

TEST(SummaryAggregatorTest, WindowIsDueAfterWindowNsAndTakeResets) {
  SummaryAggregator agg(1'000'000);
  EXPECT_TRUE(agg.empty());
  EXPECT_TRUE(agg.take().empty());
  agg.add(opAt(1, 0, 100));
  agg.add(opAt(1, 500'000, 100, 2));  // another stream: another summary
  EXPECT_FALSE(agg.due());
  agg.add(opAt(2, 999'000, 1'000));
  EXPECT_TRUE(agg.due());
  auto out = agg.take();
  ASSERT_EQ(out.size(), 3u);
  EXPECT_EQ(out[0].signature_id, 1u);
  EXPECT_EQ(out[0].stream_id, 1u);
  EXPECT_EQ(out[1].stream_id, 2u);
  EXPECT_EQ(out[2].signature_id, 2u);
  EXPECT_EQ(out[2].window_end_ns, 1'000'000);
  EXPECT_TRUE(agg.empty());
  EXPECT_FALSE(agg.due());
  // Keys idle in a window are not reported (and forgotten).
  agg.add(opAt(2, 2'000'000, 300));
  out = agg.take();
  ASSERT_EQ(out.size(), 1u);
  EXPECT_EQ(out[0].signature_id, 2u);
  ASSERT_EQ(out[0].clusters.size(), 1u);
  EXPECT_EQ(out[0].clusters[0].count, 1u);
  EXPECT_EQ(out[0].clusters[0].sum_ns, 300);
}

// 1-in-N sampled launches (FLARE_SAMPLE_KERNELS): a cluster stands for its share of the
// weights, its quantiles are the timed ops', the counts sum to the weights exactly, and the
// summary says how many ops were timed. Unsampled keys are unchanged (sampled_ops 0).
TEST(SummaryAggregatorTest, SampledOpsScaleCountsSumsFlopsToTheirWeights) {
  SummaryAggregator agg(1'000'000'000);
  uint64_t weights = 0;
  for (int i = 0; i < 30; ++i) {  // two modes: 20 ops at ~10 us, 10 at ~40 us, weights 7 or 9
    CompletedOp op = opAt(1, i * 100'000, i < 20 ? 10'000 + i : 40'000 + i);
    op.info.weight = static_cast<uint16_t>(i % 2 == 0 ? 7 : 9);
    op.info.flops = 1000;
    weights += op.info.weight;
    agg.add(op);
  }
  agg.add(opAt(2, 0, 5'000));  // weight 1: exact
  auto out = agg.take();
  ASSERT_EQ(out.size(), 2u);
  const OpSummary& s = out[0];
  EXPECT_EQ(s.sampled_ops, 30u);
  ASSERT_EQ(s.clusters.size(), 2u);
  EXPECT_EQ(s.clusters[0].count + s.clusters[1].count, weights);  // 240
  EXPECT_EQ(s.clusters[0].count, 160u);                           // 20 of 30 timed ops
  EXPECT_EQ(s.clusters[1].count, 80u);
  EXPECT_NEAR(s.clusters[0].p50_ns, 10'010, 10);  // quantiles of the timed ops
  EXPECT_NEAR(static_cast<double>(s.clusters[0].sum_ns), 8.0 * (20 * 10'000 + 190), 1.0);
  EXPECT_EQ(s.flops, 1000 * weights);
  EXPECT_EQ(out[1].sampled_ops, 0u);
  ASSERT_EQ(out[1].clusters.size(), 1u);
  EXPECT_EQ(out[1].clusters[0].count, 1u);
}

TEST(SummaryAggregatorTest, WhatIsSummarised) {
  EXPECT_TRUE(SummaryAggregator::shouldSummarize(OpKind::kGemm));
  EXPECT_TRUE(SummaryAggregator::shouldSummarize(OpKind::kKernel));
  EXPECT_TRUE(SummaryAggregator::shouldSummarize(OpKind::kMemcpy));
  EXPECT_FALSE(SummaryAggregator::shouldSummarize(OpKind::kCollective));
  EXPECT_FALSE(SummaryAggregator::shouldSummarize(OpKind::kP2P));
  EXPECT_FALSE(SummaryAggregator::shouldSummarize(OpKind::kSync));
}

}  // namespace
}  // namespace flare::timing

namespace flare::timing {
namespace {

constexpr const char* kLoaderNext = "torch.utils.data.dataloader._BaseDataLoaderIter@__next__";

// A MODE_SUMMARY builder whose batches are kept, with the spans and step counts the step-rule
// tests need.
struct SummaryRig {
  static BatchBuilderOptions options() {
    BatchBuilderOptions opts;
    opts.summary_mode = [] { return true; };
    return opts;
  }
  std::vector<flare::v1::RecordBatch> out;
  BatchBuilder builder{0, options(),
                       [this](flare::v1::RecordBatch&& b) { out.push_back(std::move(b)); }};
  uint64_t span_id = 0;

  CompletedSpan span(uint32_t api, int64_t start, int64_t length, uint64_t thread = 7) {
    CompletedSpan s;
    s.id = ++span_id;
    s.api_id = api;
    s.thread_id = static_cast<uint32_t>(thread);
    s.start_ns = start;
    s.end_ns = start + length;
    return s;
  }
  int steps() const {
    int n = 0;
    for (const auto& b : out) n += b.step_stats_size();
    return n;
  }
};

// The poller hands a pass's spans over before its ops: DataLoader calls seen before the rank's
// first op are step boundaries all the same (they were dropped, and the warm-up steps with them,
// until the first addOps set the mode).
TEST(BatchBuilderSummary, LoaderSpansBeforeTheFirstOpAreStepBoundaries) {
  SummaryRig rig;
  BatchBuilder& builder = rig.builder;
  builder.addApiName(1, kLoaderNext);
  builder.addSignature(1, makeSig("elementwise_kernel", OpKind::kKernel));
  const int64_t t0 = common::monotonicNs();
  constexpr int64_t kStep = 10'000'000;
  auto loader = [&](int step) { return rig.span(1, t0 + step * kStep, 1'000'000); };
  const CompletedSpan early[] = {loader(0), loader(1), loader(2)};
  builder.addSpans(early);  // before any op
  std::vector<CompletedOp> ops;
  for (int step = 0; step < 5; ++step) {
    CompletedOp op;
    op.info = info(1, OpKind::kKernel);
    op.thread_id = 7;
    op.issue_ns = t0 + step * kStep + 2'000'000;
    op.start_ns = op.issue_ns + 100'000;
    op.end_ns = op.start_ns + 3'000'000;
    ops.push_back(op);
  }
  builder.addOps(ops);
  const CompletedSpan late[] = {loader(3), loader(4)};
  builder.addSpans(late);
  builder.finish();
  EXPECT_EQ(rig.steps(), 4);  // five DataLoader calls: four complete steps
}

// A validation DataLoader read after step 2 (its `__next__` is the training loader's, with no
// backward between its batches) adds no steps: records::StepBoundaryRule, fed in start order
// although a pass hands its spans over thread by thread (here: reversed).
TEST(BatchBuilderSummary, AnEvaluationLoaderAddsNoSteps) {
  SummaryRig rig;
  BatchBuilder& builder = rig.builder;
  builder.addApiName(1, kLoaderNext);
  builder.addApiName(2, "torch.autograd@backward");
  builder.addSignature(1, makeSig("elementwise_kernel", OpKind::kKernel));
  const int64_t t0 = common::monotonicNs();
  constexpr int64_t kStep = 10'000'000;
  auto span = [&](uint32_t api, int64_t start, int64_t length, uint64_t thread = 7) {
    return rig.span(api, start, length, thread);
  };
  constexpr int kTrainingSteps = 6;
  for (int step = 0; step < kTrainingSteps; ++step) {
    const int64_t t = t0 + step * kStep;
    std::vector<CompletedSpan> spans;
    spans.push_back(span(1, t, 500'000));
    spans.push_back(span(2, t + 5'000'000, 2'000'000));
    if (step == 2) {  // evaluation: two batches and the StopIteration call, on another thread
      for (int64_t at : {8'000'000, 8'500'000, 9'000'000})
        spans.push_back(span(1, t + at, 200'000, 9));
    }
    std::reverse(spans.begin(), spans.end());
    builder.addSpans(spans);
    CompletedOp op;
    op.info = info(1, OpKind::kKernel);
    op.thread_id = 7;
    op.issue_ns = t + 1'000'000;
    op.start_ns = op.issue_ns + 100'000;
    op.end_ns = op.start_ns + 3'000'000;
    builder.addOps(std::span<const CompletedOp>(&op, 1));
  }
  const CompletedSpan stop[] = {span(1, t0 + kTrainingSteps * kStep, 100'000)};
  builder.addSpans(stop);  // the training loader's StopIteration ends the last step
  builder.finish();
  EXPECT_EQ(rig.steps(), kTrainingSteps);  // not 9: the evaluation's three calls start no step
}

// A step captured whole in a CUDA graph (torch.cuda.graph): backward and the optimizer ran on
// the host only at warm-up and capture; each step is a DataLoader call and a graph launch. The
// graph launches, handed over before their pass's spans (Sink::onGraphLaunches), are the
// training work that lets each DataLoader call start a step (the H200 fixture
// tests/fixtures/gpu/cuda-graph held no step before).
TEST(BatchBuilderSummary, GraphLaunchesAreTrainingWorkForTheStepRule) {
  for (const bool with_graphs : {true, false}) {
    SummaryRig rig;
    BatchBuilder& builder = rig.builder;
    builder.addApiName(1, kLoaderNext);
    builder.addApiName(2, "torch.autograd@backward");
    builder.addSignature(1, makeSig("cudaGraphLaunch", OpKind::kGraph));
    const int64_t t0 = common::monotonicNs();
    constexpr int64_t kStep = 10'000'000;
    auto span = [&](uint32_t api, int64_t start) { return rig.span(api, start, 200'000); };
    const CompletedSpan capture[] = {span(2, t0 - kStep)};  // warm-up and capture's backward
    builder.addSpans(capture);
    constexpr int kSteps = 6;
    for (int step = 0; step <= kSteps; ++step) {
      const int64_t t = t0 + step * kStep;
      CompletedOp graph;
      graph.info = info(1, OpKind::kGraph);
      graph.thread_id = 7;
      graph.issue_ns = t + 1'000'000;
      graph.start_ns = graph.issue_ns + 50'000;
      graph.end_ns = graph.start_ns + 8'000'000;
      // One pass holds this step's DataLoader call and its graph launch: the launch is handed
      // over first, the call (which ended earlier) with the pass's spans, the op after them.
      if (with_graphs) builder.addGraphLaunches(std::span<const int64_t>(&graph.issue_ns, 1));
      const CompletedSpan next[] = {span(1, t)};
      builder.addSpans(next);
      builder.addOps(std::span<const CompletedOp>(&graph, 1));
    }
    builder.finish();
    // Seven DataLoader calls, six steps; without the launches the rule sees training only at
    // capture: one boundary, no step.
    EXPECT_EQ(rig.steps(), with_graphs ? kSteps : 0) << "with graph launches: " << with_graphs;
  }
}

// MODE_RAW: the threads that issue GPU ops are read every raw_run_queue_period_ns and each
// reading goes out as a RunQueueReading (flared places the steps' run-queue wait from them); a
// thread that only synchronizes is not read, one that stopped launching 10 s ago no longer.
TEST(BatchBuilderRaw, IssuingThreadsRunQueueReadingsGoOutEveryPeriod) {
  std::vector<flare::v1::RecordBatch> out;
  int64_t now = 1'000'000'000;
  BatchBuilderOptions opts;
  opts.clock_map = [] { return common::ClockMap(0, 0); };  // monotonic = epoch here
  opts.now_ns = [&] { return now; };
  opts.run_queue_wait = [&](uint32_t tid) -> std::optional<int64_t> {
    return tid * 1000 + now / 1000;
  };
  BatchBuilder builder(0, opts, [&](flare::v1::RecordBatch&& b) { out.push_back(std::move(b)); });
  builder.addSignature(1, makeSig("elementwise_kernel", OpKind::kKernel));
  builder.addSignature(2, makeSig("cudaStreamSynchronize", OpKind::kSync));
  auto pass = [&](std::initializer_list<std::pair<uint32_t, OpKind>> ops) {
    std::vector<CompletedOp> batch;
    for (const auto& [thread, kind] : ops) {
      CompletedOp& op = batch.emplace_back();
      op.info = info(kind == OpKind::kSync ? 2 : 1, kind);
      op.thread_id = thread;
      op.issue_ns = now - 1'000'000;
      op.start_ns = op.issue_ns + 10'000;
      op.end_ns = op.start_ns + 100'000;
    }
    builder.addOps(batch);
  };
  pass({{7, OpKind::kKernel}, {9, OpKind::kSync}});  // read at once: thread 7 only
  now += 5'000'000;
  pass({{7, OpKind::kKernel}});  // within the 10 ms period: not read
  now += 6'000'000;
  pass({{7, OpKind::kKernel}});  // read
  now += 11'000'000'000;
  pass({{8, OpKind::kKernel}});  // thread 7 idle for 11 s: only thread 8 is read
  builder.flush();
  std::vector<std::tuple<uint64_t, int64_t, int64_t>> readings;
  for (const auto& b : out) {
    for (const auto& q : b.run_queue())
      readings.emplace_back(q.thread_id(), q.time_ns(), q.waited_ns());
  }
  const int64_t t0 = 1'000'000'000;
  const std::vector<std::tuple<uint64_t, int64_t, int64_t>> want{
      {7, t0, 7000 + t0 / 1000},
      {7, t0 + 11'000'000, 7000 + (t0 + 11'000'000) / 1000},
      {8, t0 + 11'011'000'000, 8000 + (t0 + 11'011'000'000) / 1000}};
  EXPECT_EQ(readings, want);
}

// One step from `start`: its marker, then one 1 ms kernel per issuing thread, issued 1 ms in.
void addRunQueueStep(BatchBuilder& builder, int64_t start,
                     std::initializer_list<uint32_t> threads) {
  std::vector<CompletedOp> ops(1);
  ops[0].info = info(2, OpKind::kSync);  // the step marker
  ops[0].issue_ns = ops[0].start_ns = ops[0].end_ns = start;
  for (uint32_t thread : threads) {
    CompletedOp& k = ops.emplace_back();
    k.info = info(1, OpKind::kKernel);
    k.thread_id = thread;
    k.issue_ns = start + 1'000'000;
    k.start_ns = k.issue_ns + 100'000;
    k.end_ns = k.start_ns + 1'000'000;
  }
  builder.addOps(ops);
}

// Each step carries its issuing thread's run-queue wait: the thread is read when steps are
// taken (at most every run_queue_period_ns), and the step gets the counter's growth over it.
TEST(BatchBuilderSummary, StepsCarryTheIssuingThreadsRunQueueWait) {
  std::vector<flare::v1::RecordBatch> out;
  const int64_t t0 = common::monotonicNs();
  constexpr int64_t kStep = 10'000'000;
  int64_t now = t0;
  std::vector<uint32_t> read;
  BatchBuilderOptions opts;
  opts.summary_mode = [] { return true; };
  opts.now_ns = [&] { return now; };
  opts.run_queue_wait = [&](uint32_t tid) -> std::optional<int64_t> {
    read.push_back(tid);
    if (tid != 7) return std::nullopt;
    return (now - t0) / 5;  // thread 7 waits a fifth of the time: 2 ms a step
  };
  BatchBuilder builder(0, opts, [&](flare::v1::RecordBatch&& b) { out.push_back(std::move(b)); });
  builder.addSignature(1, makeSig("elementwise_kernel", OpKind::kKernel));
  builder.addSignature(2, makeSig("flare_step", OpKind::kSync));
  for (int step = 0; step < 8; ++step) {
    now = t0 + step * kStep + 3'000'000;
    addRunQueueStep(builder, t0 + step * kStep, {7, 8});
  }
  builder.finish();
  // Seven steps: the first not measured (its thread was first read inside it), the others
  // 2 ms each (the epoch conversion of the bounds may round by a nanosecond).
  std::vector<std::optional<int64_t>> waits;
  for (const auto& b : out) {
    for (const auto& st : b.step_stats()) {
      waits.push_back(st.has_run_queue_wait_ns() ? std::optional(st.run_queue_wait_ns())
                                                 : std::nullopt);
    }
  }
  ASSERT_EQ(waits.size(), 7u);
  EXPECT_FALSE(waits[0].has_value());
  for (size_t i = 1; i < waits.size(); ++i) {
    ASSERT_TRUE(waits[i].has_value()) << i;
    EXPECT_NEAR(*waits[i], 2'000'000, 2) << i;
  }
  EXPECT_NE(std::find(read.begin(), read.end(), 8u), read.end());  // both issuing threads read
}

// A machine whose schedstat cannot be read (the reader turned itself off): every step sent
// without run-queue wait from then on is counted in the batch's drop counters, so that flare
// status shows why cpu_contention is never told apart there. A working reader counts nothing,
// not even the first step (its thread was first read inside it: unmeasured, not unreadable).
TEST(BatchBuilderSummary, StepsSentWhileRunQueueIsUnreadableAreCounted) {
  auto run = [](bool readable) {
    std::vector<flare::v1::RecordBatch> out;
    const int64_t t0 = common::monotonicNs();
    constexpr int64_t kStep = 10'000'000;
    int64_t now = t0;
    int failures = 0;
    BatchBuilderOptions opts;
    opts.summary_mode = [] { return true; };
    opts.now_ns = [&] { return now; };
    opts.run_queue_wait = [&](uint32_t) -> std::optional<int64_t> {
      if (readable) return (now - t0) / 5;
      ++failures;
      return std::nullopt;
    };
    opts.run_queue_off = [&] { return failures >= 2; };
    BatchBuilder builder(0, opts, [&](flare::v1::RecordBatch&& b) { out.push_back(std::move(b)); });
    builder.addSignature(1, makeSig("elementwise_kernel", OpKind::kKernel));
    builder.addSignature(2, makeSig("flare_step", OpKind::kSync));
    for (int step = 0; step < 8; ++step) {
      now = t0 + step * kStep + 3'000'000;
      addRunQueueStep(builder, t0 + step * kStep, {7});
    }
    builder.finish();
    size_t steps = 0;
    for (const auto& b : out) steps += static_cast<size_t>(b.step_stats_size());
    EXPECT_EQ(steps, 7u);
    EXPECT_FALSE(out.empty());
    return out.empty() ? uint64_t{999} : out.back().drops().run_queue_unmeasured();
  };
  EXPECT_EQ(run(true), 0u);
  // Off from the second failed reading on; the first step is taken with the second step's ops at
  // the earliest, after that reading: all seven counted.
  EXPECT_EQ(run(false), 7u);
}

// The hook's step decisions for steps of `step_ns` from `t0`, `measured[s]` saying whether step s
// was timed (a measured step stands for itself and the sampled-out steps before it).
std::vector<StepDecision> stepDecisions(const std::vector<bool>& measured, int64_t t0,
                                        int64_t step_ns) {
  std::vector<StepDecision> out;
  uint32_t since = 0;
  for (size_t s = 0; s < measured.size(); ++s) {
    ++since;
    StepDecision d{t0 + static_cast<int64_t>(s) * step_ns, measured[s], 1};
    if (measured[s]) d.weight = std::exchange(since, 0);
    out.push_back(d);
  }
  return out;
}

// A summarizing BatchBuilder that takes `pending` as the hook's step decisions and emits into
// `out`.
BatchBuilder stepSampledBuilder(std::vector<StepDecision>& pending,
                                std::vector<flare::v1::RecordBatch>& out) {
  BatchBuilderOptions opts;
  opts.summary_mode = [] { return true; };
  opts.clock_map = [] { return common::ClockMap(0, 0); };
  opts.run_queue_wait = [](uint32_t) -> std::optional<int64_t> { return std::nullopt; };
  opts.step_decisions = [&pending] { return std::exchange(pending, {}); };
  return BatchBuilder(0, opts, [&out](flare::v1::RecordBatch&& b) { out.push_back(std::move(b)); });
}

// A step's ops at boundary `b`: its marker, and its all-reduce (signature 3, timed in every
// step) at b + 600 us.
CompletedOp stepMarker(int64_t b) {
  CompletedOp marker;
  marker.info = info(2, OpKind::kSync);
  marker.issue_ns = marker.start_ns = marker.end_ns = b;
  return marker;
}
CompletedOp stepAllReduce(int64_t b, uint64_t step) {
  CompletedOp coll;
  coll.info = info(3, OpKind::kCollective);
  coll.info.comm_hash = 9;
  coll.info.seq = step;
  coll.info.nranks = 2;
  coll.issue_ns = b + 600'000;
  coll.start_ns = coll.issue_ns + 1'000;
  coll.end_ns = coll.start_ns + 100'000;
  return coll;
}

// Step sampling (FLARE_SAMPLE_STEPS, step_sampling.h): the hook's decisions at the step
// boundaries say which steps were timed. A sampled-out step leaves with its times only
// (sampled_out, GPU figures 0); a measured step's figures are its own ops' (exact); the kernel
// summaries weight a measured step's ops by the steps it stands for, so that their counts
// estimate every step's; collectives, timed in every step, are neither weighted nor dropped.
TEST(BatchBuilderSummary, StepSamplingSendsSampledOutStepsWithTheirTimesOnly) {
  std::vector<flare::v1::RecordBatch> out;
  const int64_t t0 = 1'000'000'000;
  constexpr int64_t kStep = 1'000'000;
  constexpr int kSteps = 10, kKernels = 5;
  // Steps 0-3 measured, 4 and 5 sampled out, 6 measured (for 3 steps), 7 out, 8 (for 2), 9.
  const std::vector<bool> measured = {true,  true, true,  true, false,
                                      false, true, false, true, true};
  std::vector<StepDecision> pending = stepDecisions(measured, t0, kStep);
  BatchBuilder builder = stepSampledBuilder(pending, out);
  builder.addSignature(1, makeSig("elementwise_kernel", OpKind::kKernel));
  builder.addSignature(2, makeSig(FLARE_STEP_MARKER_NAME, OpKind::kSync));
  builder.addSignature(3, makeSig("ncclAllReduce", OpKind::kCollective));
  for (int s = 0; s <= kSteps; ++s) {
    const int64_t b = t0 + s * kStep;
    std::vector<CompletedOp> ops = {stepMarker(b)};
    if (s < kSteps) {
      if (measured[s]) {  // a sampled-out step's kernels were never timed: no op reaches here
        for (int k = 0; k < kKernels; ++k) {
          CompletedOp op;
          op.info = info(1, OpKind::kKernel);
          op.issue_ns = b + 10'000 + k * 50'000;
          op.start_ns = op.issue_ns + 5'000;
          op.end_ns = op.start_ns + 20'000;
          ops.push_back(op);
        }
      }
      ops.push_back(stepAllReduce(b, static_cast<uint64_t>(s)));
    }
    builder.addOps(ops);
  }
  builder.finish();
  std::vector<const flare::v1::StepStats*> steps;
  uint64_t count = 0, timed = 0;
  size_t collectives = 0;
  for (const auto& b : out) {
    for (const auto& st : b.step_stats()) steps.push_back(&st);
    for (const auto& ks : b.summaries()) {
      if (ks.signature_id() != 1) continue;
      uint64_t n = 0;
      for (const auto& c : ks.clusters()) n += c.count();
      count += n;
      timed += ks.sampled_ops() != 0 ? ks.sampled_ops() : n;
    }
    for (const auto& cb : b.collective_blocks()) collectives += cb.duration_ns_size();
  }
  ASSERT_EQ(steps.size(), static_cast<size_t>(kSteps));
  for (int s = 0; s < kSteps; ++s) {
    const auto& st = *steps[static_cast<size_t>(s)];
    EXPECT_EQ(st.end_ns() - st.start_ns(), kStep) << s;  // every step present, with its time
    EXPECT_EQ(st.sampled_out(), !measured[static_cast<size_t>(s)]) << s;
    if (st.sampled_out()) {
      EXPECT_EQ(st.gpu_ops(), 0u) << s;
      EXPECT_EQ(st.gpu_busy_ns(), 0) << s;
      EXPECT_EQ(st.causes_size(), 0) << s;
    } else {
      EXPECT_EQ(st.gpu_ops(), static_cast<uint64_t>(kKernels + 1)) << s;  // exact: weight 1
      EXPECT_EQ(st.gpu_ops_estimated(), 0u) << s;
      EXPECT_EQ(st.gpu_busy_ns(), kKernels * 20'000 + 100'000) << s;
      EXPECT_EQ(st.minority_ns(), kKernels * 20'000) << s;
    }
  }
  // 7 measured steps of 5 kernels timed; they stand for all 10 steps' 50 launches.
  EXPECT_EQ(timed, 7u * kKernels);
  EXPECT_EQ(count, static_cast<uint64_t>(kSteps * kKernels));
  EXPECT_EQ(collectives, static_cast<size_t>(kSteps));
}

// A GEMM shape that runs in two steps only (an evaluation pass): its calls are its signature's
// first on the thread (kOpFirstCalls), timed in any step, and each stands for itself — in the
// sampled-out step 4 and in step 6, which stands for steps 4-6 for every other op.
TEST(BatchBuilderSummary, StepSamplingCountsASignaturesFirstCallsOnce) {
  std::vector<flare::v1::RecordBatch> out;
  const int64_t t0 = 1'000'000'000;
  constexpr int64_t kStep = 1'000'000;
  const std::vector<bool> measured = {true, true, true, true, false, false, true, true};
  std::vector<StepDecision> pending = stepDecisions(measured, t0, kStep);
  BatchBuilder builder = stepSampledBuilder(pending, out);
  builder.addSignature(2, makeSig(FLARE_STEP_MARKER_NAME, OpKind::kSync));
  builder.addSignature(4, makeSig("eval_gemm", OpKind::kGemm));
  for (size_t s = 0; s <= measured.size(); ++s) {
    const int64_t b = t0 + static_cast<int64_t>(s) * kStep;
    std::vector<CompletedOp> ops = {stepMarker(b)};
    for (bool first : {true, false}) {
      if (s != 4 && s != 6) break;
      if (!first && s == 4) break;  // a sampled-out step times only the first calls
      CompletedOp op;
      op.info = info(4, OpKind::kGemm);
      if (first) op.info.flags = kOpFirstCalls;
      op.issue_ns = b + (first ? 10'000 : 60'000);
      op.start_ns = op.issue_ns + 5'000;
      op.end_ns = op.start_ns + 20'000;
      ops.push_back(op);
    }
    builder.addOps(ops);
  }
  builder.finish();
  uint64_t count = 0;
  for (const auto& b : out) {
    for (const auto& ks : b.summaries()) {
      if (ks.signature_id() != 4) continue;
      for (const auto& c : ks.clusters()) count += c.count();
    }
  }
  // Steps 4 and 6's first calls once each; step 6's later call for the 3 steps it stands for,
  // less the call step 4's first call already counted (its signature's credit).
  EXPECT_EQ(count, 1u + 1u + (3u - 1u));
}

// As the hook decides: at every boundary, the last one included. Steps 0-3 measured, 4-5 out, 6
// measured (for 3), 7-9 out, then the last boundary, sampled out or measured (for 4), after which
// runs either the loop's last step (flare_step() at each step's start: 5 kernels and the step's
// all-reduce, timed in every step) or what follows a loop (2 kernels of its own, no all-reduce).
// Each measured step's kernels count for the steps before it once the next boundary confirms it a
// step; the steps after step 6 are stood for by step 6 at the last flush, in a window after every
// one already sent; what follows a loop counts once, and only where measured. The decisions come
// as the hook takes them (one per boundary) or all at once.
TEST(BatchBuilderSummary, StepSamplingCountsEveryStepWhereverTheJobEnds) {
  const int64_t t0 = 1'000'000'000;
  constexpr int64_t kStep = 1'000'000;
  constexpr int kSteps = 10, kKernels = 5;
  const std::vector<bool> steps_measured = {true,  true, true,  true,  false,
                                            false, true, false, false, false};
  for (const bool last_is_step : {false, true}) {
    for (const bool last_measured : {false, true}) {
      for (const bool one_at_a_time : {true, false}) {
        SCOPED_TRACE(::testing::Message()
                     << "last boundary starts a step " << last_is_step << ", measured "
                     << last_measured << "; decisions one at a time " << one_at_a_time);
        std::vector<bool> measured = steps_measured;
        measured.push_back(last_measured);
        std::vector<StepDecision> all = stepDecisions(measured, t0, kStep), pending;
        if (!one_at_a_time) pending = all;
        std::vector<flare::v1::RecordBatch> out;
        BatchBuilder builder = stepSampledBuilder(pending, out);
        builder.addSignature(1, makeSig("elementwise_kernel", OpKind::kKernel));
        builder.addSignature(2, makeSig(FLARE_STEP_MARKER_NAME, OpKind::kSync));
        builder.addSignature(3, makeSig("ncclAllReduce", OpKind::kCollective));
        builder.addSignature(5, makeSig("after_the_loop", OpKind::kKernel));
        for (int s = 0; s <= kSteps; ++s) {
          const auto i = static_cast<size_t>(s);
          if (one_at_a_time) pending.push_back(all[i]);
          const int64_t b = t0 + s * kStep;
          const bool a_step = s < kSteps || last_is_step;
          std::vector<CompletedOp> ops = {stepMarker(b)};
          for (int k = 0; measured[i] && k < (a_step ? kKernels : 2); ++k) {
            CompletedOp op;
            op.info = info(a_step ? 1 : 5, OpKind::kKernel);
            op.info.flops = 100;
            op.issue_ns = b + 10'000 + k * 50'000;
            op.start_ns = op.issue_ns + 5'000;
            op.end_ns = op.start_ns + 20'000;
            ops.push_back(op);
          }
          if (a_step) ops.push_back(stepAllReduce(b, i));
          builder.addOps(ops);
          builder.flush();  // every step's window sent before the next
        }
        const size_t sent = out.size();
        builder.finish();
        std::map<uint32_t, uint64_t> count, flops;
        uint64_t at_finish = 0;
        int64_t tail_start = INT64_MAX;
        for (size_t n = 0; n < out.size(); ++n) {
          for (const auto& ks : out[n].summaries()) {
            uint64_t c = 0;
            for (const auto& cl : ks.clusters()) c += cl.count();
            count[ks.signature_id()] += c;
            flops[ks.signature_id()] += ks.flops();
            if (n >= sent && ks.signature_id() == 1) {
              at_finish += c;
              tail_start = std::min(tail_start, ks.window_start_ns());
            }
          }
        }
        const uint64_t steps = kSteps + (last_is_step ? 1 : 0);
        EXPECT_EQ(count[1], steps * kKernels);
        EXPECT_EQ(flops[1], 100u * steps * kKernels);
        EXPECT_EQ(count[5], !last_is_step && last_measured ? 2u : 0u);  // after the loop: once
        // Steps 7-9 (and the last one, sampled out), from step 6's kernels.
        EXPECT_EQ(at_finish, (3u + (last_is_step && !last_measured ? 1u : 0u)) * kKernels);
        EXPECT_GE(tail_start, t0 + 7 * kStep);
      }
    }
  }
}

// MeasuredStepOps: a measured step counts once until the next boundary confirms it, the steps
// no measured step stands for at the end, a signature's first calls in a sampled-out step
// credited, decisions pulled out of order, a step too large to keep.
TEST(StepDecisions, AMeasuredStepStandsForTheStepsBeforeItOnceConfirmed) {
  auto op = [](int64_t start, uint32_t signature = 7) {
    CompletedOp o;
    o.info.kind = OpKind::kKernel;
    o.info.signature_id = signature;
    o.info.weight = 2;  // 1-in-N sampled: stands for 2 launches
    o.issue_ns = start - 1;
    o.start_ns = start;
    o.end_ns = start + 10;
    return o;
  };
  MeasuredStepOps m;
  std::vector<CompletedOp> now;
  const StepDecision m100{100, true, 1}, o200{200, false, 1}, o300{300, false, 1},
      m400{400, true, 3}, o500{500, false, 1};
  m.noteDecision(m100, &now);
  EXPECT_EQ(m.offer(op(150), &m100), 2u);  // not confirmed: its own weight
  EXPECT_EQ(m.offer(op(150), nullptr), 2u);
  m.noteDecision(o300, &now);  // confirms step 100 (weight 1: nothing more to add)
  EXPECT_TRUE(now.empty());
  m.noteDecision(o200, &now);              // pulled late: another step after step 100
  EXPECT_EQ(m.offer(op(250), &o200), 2u);  // a sampled-out step's op stands for itself
  EXPECT_EQ(m.offer(op(160), &m100), 2u);  // confirmed, weight 1
  EXPECT_EQ(m.keptOps(), 2u);
  // Ending here: steps 200 and 300's boundaries follow step 100; 300's is the last (no step).
  EXPECT_EQ(m.tailSteps(), 1u);
  {
    MeasuredStepOps ending = m;
    auto tail = ending.tailOps();
    ASSERT_EQ(tail.size(), 2u);
    EXPECT_EQ(tail[0].info.weight, 2u);  // its weight 2, for 1 step
    EXPECT_EQ(tail[0].start_ns, 250);    // step 100's op at +50, moved to the first step after it
    EXPECT_EQ(tail[1].start_ns, 260);
  }
  // Signature 7's first call in step 300 (weight 1) and signature 8's (which step 400 lacks).
  CompletedOp first = op(350);
  first.info.weight = 1;
  m.credit(first, &o300);
  m.credit(op(350, 8), &o300);
  m.credit(op(150), &m100);    // a first call in a measured step stands for itself: no credit
  m.noteDecision(m400, &now);  // measured, standing for 200, 300 and itself once confirmed
  EXPECT_EQ(m.offer(op(450), &m400), 2u);
  EXPECT_EQ(m.tailSteps(), 2u);  // ending here: 200 and 300 stood for by step 100
  m.noteDecision(o500, &now);    // confirms step 400: its op again for the 2 steps before it
  ASSERT_EQ(now.size(), 1u);
  EXPECT_EQ(now[0].info.weight, 3u);  // 2 steps of weight 2, less the first call already counted
  EXPECT_EQ(now[0].start_ns, 450);    // where it ran
  EXPECT_EQ(m.offer(op(460), &m400), 6u);  // confirmed: for its 3 steps at once, no credit left
  EXPECT_EQ(m.tailSteps(), 0u);            // 500's boundary is the last: no step after step 400
  m.noteEveryStepOp(&m400);                // step 400's all-reduce and synchronization
  m.noteEveryStepOp(&m400);
  m.noteEveryStepOp(&o500);  // one after the last boundary: half as many, a step
  EXPECT_TRUE(m.lastIsStep());
  EXPECT_EQ(m.tailSteps(), 1u);
  m.noteEveryStepOp(&m400);  // 1 of 3: what follows a loop
  EXPECT_FALSE(m.lastIsStep());
  EXPECT_EQ(m.tailSteps(), 0u);
  for (size_t i = 0; i <= MeasuredStepOps::kMaxOps; ++i) m.offer(op(470), &m400);
  EXPECT_FALSE(m.complete());
  m.reset();
  const StepDecision m600{600, true, 3};
  m.noteDecision(m600, &now);
  for (size_t i = 0; i < MeasuredStepOps::kMaxOps; ++i) EXPECT_EQ(m.offer(op(650), &m600), 2u);
  EXPECT_EQ(m.offer(op(650), &m600), 6u);  // full, not confirmed: counted as if confirmed
}

// The steps an op issued at `t` stands for by the decision in force (MeasuredStepOps::offer's
// factor before confirmation and credit): the measured step's weight, else 1.
uint32_t weightAt(const StepDecisions& d, int64_t t) {
  const StepDecision* at = d.inForceAt(t);
  return at != nullptr && at->measured ? std::max<uint32_t>(at->weight, 1) : 1;
}

TEST(StepDecisions, AStepIsMeasuredOnlyIfNoPartOfItWasSampledOut) {
  StepDecisions d;
  EXPECT_TRUE(d.measured(0, 100));  // no decision: everything timed
  EXPECT_EQ(weightAt(d, 50), 1u);
  d.add({{100, true, 1}, {200, false, 1}, {300, true, 2}, {400, true, 1}});
  EXPECT_TRUE(d.measured(0, 100));     // before the first decision
  EXPECT_TRUE(d.measured(100, 200));   // its own decision
  EXPECT_FALSE(d.measured(200, 300));  // sampled out
  EXPECT_FALSE(d.measured(150, 250));  // boundaries that disagree: partly sampled out
  EXPECT_FALSE(d.measured(250, 350));
  EXPECT_TRUE(d.measured(300, 400));
  EXPECT_EQ(weightAt(d, 150), 1u);
  EXPECT_EQ(weightAt(d, 250), 1u);  // an op timed in a sampled-out step stands for itself
  EXPECT_EQ(weightAt(d, 300), 2u);
  EXPECT_EQ(weightAt(d, 399), 2u);
  EXPECT_EQ(weightAt(d, 1000), 1u);
  d.forgetBefore(350);  // the decision in force at 350 stays
  EXPECT_EQ(d.size(), 2u);
  EXPECT_EQ(weightAt(d, 360), 2u);
  d.add({{500, false, 1}});
  EXPECT_FALSE(d.measured(450, 550));
}

// FLARE_TIMING_BUDGET_PCT: the smallest power of 2 that brings the cost of timing every op
// within the budget, never below the floor (rounded up to a power of 2) nor above 1024.
TEST(StepDecisions, TheBudgetPicksThePowerOfTwoThatKeepsTheCostWithinIt) {
  EXPECT_EQ(stepsForBudget(0.10, 0.5, 1), 32u);  // 10% for a 0.5% budget: 20 -> 32
  EXPECT_EQ(stepsForBudget(0.004, 0.5, 1), 1u);  // within the budget: every step
  EXPECT_EQ(stepsForBudget(0.004, 0.5, 3), 4u);  // the floor, a power of 2
  EXPECT_EQ(stepsForBudget(0.01, 0.5, 1), 2u);   // exactly twice the budget
  EXPECT_EQ(stepsForBudget(0.5, 0.01, 1), kMaxSampleSteps);
  EXPECT_EQ(stepsForBudget(0.1, 0, 1), 1u);  // no budget: the floor
  EXPECT_EQ(stepsForBudget(std::nan(""), 0.5, 8), 8u);
}

// A budget's K rises at once and falls only with a margin: a cost that wanders about the
// boundary between two K keeps the higher one.
TEST(StepDecisions, TheBudgetsKRisesAtOnceAndFallsOnlyWithAMargin) {
  EXPECT_EQ(nextStepsForBudget(0.1325, 0.5, 1, 0), 32u);   // the first choice: as it is
  EXPECT_EQ(nextStepsForBudget(0.1647, 0.5, 1, 32), 64u);  // over 16%: up at once
  EXPECT_EQ(nextStepsForBudget(0.1528, 0.5, 1, 64), 64u);  // 15.28% x 1.25 > 16%: held
  EXPECT_EQ(nextStepsForBudget(0.1325, 0.5, 1, 64), 64u);
  EXPECT_EQ(nextStepsForBudget(0.12, 0.5, 1, 64), 32u);  // 15% with the margin: down
  EXPECT_EQ(nextStepsForBudget(0.004, 0.5, 1, 64), 1u);  // far within: all the way down
  EXPECT_EQ(nextStepsForBudget(0.004, 0.5, 4, 64), 4u);  // never below the floor
}

// The cost estimate behind the budget: a step whose launching threads were preempted inside the
// Tracer reads high (wall time) and does not set K; the host share is the least of the last 4
// steps', the GPU share a moving average; no estimate before 2 steps.
TEST(StepDecisions, ThePreemptedStepsReadingDoesNotSetK) {
  TimingCostEstimate e;
  EXPECT_FALSE(e.ready());
  e.addStep(0.0898, 0.0);  // the first measured step, on a loaded host: 8.98%
  EXPECT_FALSE(e.ready());
  e.addStep(0.0030, 0.0);
  ASSERT_TRUE(e.ready());
  EXPECT_DOUBLE_EQ(e.hostFraction(), 0.0030);
  EXPECT_EQ(nextStepsForBudget(e.hostFraction() + e.gpuFraction(), 0.5, 1, 0), 1u);
  // A steady host reading rises with the job (a new phase): once every step of the window shows
  // it, the estimate follows.
  for (int i = 0; i < 3; ++i) e.addStep(0.02, 0.0);
  EXPECT_DOUBLE_EQ(e.hostFraction(), 0.0030);  // the window still holds the 0.30%
  e.addStep(0.02, 0.0);
  EXPECT_DOUBLE_EQ(e.hostFraction(), 0.02);
  // The GPU share: a moving average, weight 0.3 to the newest.
  TimingCostEstimate g;
  g.addStep(0.001, 0.02);
  g.addStep(0.001, 0.03);
  EXPECT_DOUBLE_EQ(g.gpuFraction(), 0.7 * 0.02 + 0.3 * 0.03);
}

}  // namespace
}  // namespace flare::timing
