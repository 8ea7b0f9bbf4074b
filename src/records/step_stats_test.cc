// Tests of the per-step statistics against values computed by hand.
#include "src/records/step_stats.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <vector>

namespace flare::records {
namespace {

// Two steps [0,100) and [100,200). Ops (issue, start, end, kernel):
//   A (5, 10, 30, no), B (20, 25, 50, yes), C (60, 80, 120, yes)  — issued in step 0
//   D (150, 150, 190, no)                                          — issued in step 1
// DataLoader spans [55,70] (step 0) and [130,140] (step 1).
TEST(StepStats, HandComputedTwoSteps) {
  const std::vector<StepOp> ops = {
      {150, 150, 190, false}, {5, 10, 30, false}, {60, 80, 120, true}, {20, 25, 50, true}};
  const std::vector<StepSpan> loader = {{130, 140}, {55, 70}};
  const std::vector<int64_t> starts = {0, 100, 200};
  const auto s = computeStepStats(ops, loader, starts);
  ASSERT_EQ(s.size(), 2u);

  // Step 0: last GPU end before the loader start 55 is B's 50; first GPU start after 70 is C's 80.
  EXPECT_EQ(s[0].inter_ns, 30);
  // Busy: [10,50] ∪ [80,100] = 40 + 20; kernels: [25,50] ∪ [80,100] = 25 + 20.
  EXPECT_EQ(s[0].gpu_busy_ns, 60);
  EXPECT_EQ(s[0].minority_ns, 45);
  EXPECT_EQ(s[0].gpu_ops, 3u);
  EXPECT_DOUBLE_EQ(s[0].issue_latency_sum_ns, 5 + 5 + 20);
  EXPECT_DOUBLE_EQ(s[0].issue_offset_sum_ns, 5 + 20 + 60);
  EXPECT_DOUBLE_EQ(s[0].vInter(), 0.3);
  EXPECT_DOUBLE_EQ(s[0].vMinority(), 45.0 / 70.0);
  EXPECT_EQ(s[0].latency.count(), 3u);
  EXPECT_NEAR(s[0].latency.max(), 20, 20 * 0.02);

  // Step 1: C (issued in step 0) ends at 120 before the loader start 130; D starts at 150.
  EXPECT_EQ(s[1].inter_ns, 30);
  EXPECT_EQ(s[1].gpu_busy_ns, 20 + 40);  // [100,120] ∪ [150,190]
  EXPECT_EQ(s[1].minority_ns, 20);       // C's tail
  EXPECT_EQ(s[1].gpu_ops, 1u);
  EXPECT_DOUBLE_EQ(s[1].issue_latency_sum_ns, 0);
  EXPECT_DOUBLE_EQ(s[1].issue_offset_sum_ns, 50);
}

TEST(StepStats, NoLoaderNoInterAndDegenerateBoundaries) {
  const std::vector<StepOp> ops = {{0, 10, 20, false}};
  const std::vector<int64_t> starts = {0, 100, 100, 50};  // non-positive steps skipped
  const auto s = computeStepStats(ops, {}, starts);
  ASSERT_EQ(s.size(), 1u);
  EXPECT_EQ(s[0].inter_ns, 0);
  EXPECT_EQ(s[0].gpu_busy_ns, 10);
  EXPECT_TRUE(computeStepStats(ops, {}, std::vector<int64_t>{5}).empty());
}

// Merged step sketches give the distribution of all the steps' ops (the daemon merges them).
TEST(StepStats, SketchesMerge) {
  const std::vector<StepOp> ops = {{0, 100, 110, false}, {100, 400, 410, false}};
  const auto s = computeStepStats(ops, {}, std::vector<int64_t>{0, 50, 200});
  ASSERT_EQ(s.size(), 2u);
  stats::LatencySketch all(StepStats::kStepSketchAccuracy);
  for (const auto& st : s) ASSERT_TRUE(all.merge(st.latency));
  EXPECT_EQ(all.count(), 2u);
  EXPECT_NEAR(all.min(), 100, 2);
  EXPECT_NEAR(all.max(), 300, 6);
}

TEST(StepBoundaries, WhatEachTracedCallMeans) {
  EXPECT_EQ(stepCallKind("torch.utils.data.dataloader._BaseDataLoaderIter@__next__"),
            StepCallKind::kLoader);
  EXPECT_EQ(stepCallKind("torch.autograd@backward"), StepCallKind::kTraining);
  EXPECT_EQ(stepCallKind("torch.optim.Optimizer@step"), StepCallKind::kTraining);
  EXPECT_EQ(stepCallKind("megatron.core.pipeline_parallel.schedules@backward_step"),
            StepCallKind::kTraining);
  EXPECT_EQ(stepCallKind("torch@Tensor.backward"), StepCallKind::kTraining);
  EXPECT_EQ(stepCallKind("megatron.core.pipeline_parallel.schedules@forward_step"),
            StepCallKind::kOther);
  EXPECT_EQ(stepCallKind("torch.cuda@synchronize"), StepCallKind::kOther);
  EXPECT_EQ(stepCallKind("mylib@step"), StepCallKind::kOther);  // only the optimizer's step
  EXPECT_EQ(stepCallKind("mylib@my_backward"), StepCallKind::kOther);
}

// A training loop: per step a DataLoader call at 100·i ms, then backward, then the optimizer.
std::vector<StepCall> trainingSteps(int first, int count, bool optimizer = true) {
  std::vector<StepCall> calls;
  for (int i = first; i < first + count; ++i) {
    const int64_t t = int64_t{i} * 100;
    calls.push_back({t, StepCallKind::kLoader});
    calls.push_back({t + 40, StepCallKind::kTraining});
    if (optimizer) calls.push_back({t + 70, StepCallKind::kTraining});
  }
  return calls;
}

TEST(StepBoundaries, WithoutTrainingCallsEveryDataLoaderCallStartsAStep) {
  std::vector<StepCall> calls;
  for (int64_t t : {0, 100, 150, 160, 300}) calls.push_back({t, StepCallKind::kLoader});
  calls.push_back({120, StepCallKind::kOther});
  EXPECT_EQ(stepBoundaries(calls), (std::vector<int64_t>{0, 100, 150, 160, 300}));
}

// An evaluation over a validation DataLoader after step 4: its batches and its StopIteration
// call (the same `__next__`, no backward between them) stay inside the step its first batch
// starts; the training steps keep their count.
TEST(StepBoundaries, AnEvaluationLoopAddsNoSteps) {
  std::vector<StepCall> calls = trainingSteps(0, 5);
  for (int64_t t : {480, 485, 490, 495}) calls.push_back({t, StepCallKind::kLoader});
  std::vector<StepCall> rest = trainingSteps(5, 5);
  calls.insert(calls.end(), rest.begin(), rest.end());
  calls.push_back({1000, StepCallKind::kLoader});  // the training loader's StopIteration
  // In any order: the calls are compared by start time.
  std::reverse(calls.begin(), calls.end());
  EXPECT_EQ(stepBoundaries(calls),
            (std::vector<int64_t>{0, 100, 200, 300, 400, 480, 600, 700, 800, 900, 1000}));
}

// The StopIteration call that ends an epoch starts the step of the next epoch's first batch:
// one boundary per training step, not one more per epoch.
TEST(StepBoundaries, AnEpochsEndAddsNoStep) {
  std::vector<StepCall> calls = trainingSteps(0, 3);
  calls.push_back({290, StepCallKind::kLoader});  // StopIteration
  std::vector<StepCall> next = trainingSteps(3, 3);
  calls.insert(calls.end(), next.begin(), next.end());
  EXPECT_EQ(stepBoundaries(calls), (std::vector<int64_t>{0, 100, 200, 290, 400, 500}));
}

// Gradient accumulation: each micro-batch's DataLoader call follows a backward, so each starts a
// step as before; a step that reads two loaders counts once.
TEST(StepBoundaries, MicroBatchesStayStepsAndTwoLoadersCountOnce) {
  EXPECT_EQ(stepBoundaries(trainingSteps(0, 4, /*optimizer=*/false)),
            (std::vector<int64_t>{0, 100, 200, 300}));
  std::vector<StepCall> calls = trainingSteps(0, 3);
  // (Before the first backward every DataLoader call starts a step: step 0's second is one.)
  for (int64_t t : {10, 110, 210}) calls.push_back({t, StepCallKind::kLoader});
  EXPECT_EQ(stepBoundaries(calls), (std::vector<int64_t>{0, 10, 100, 200}));
}

// Fed one call at a time, as the rank does: a DataLoader call that starts before the previous
// boundary (a late thread's) starts no step once training has been seen.
TEST(StepBoundaries, TheRuleFedCallByCall) {
  StepBoundaryRule rule;
  EXPECT_TRUE(rule.add(StepCallKind::kLoader, 0));
  EXPECT_TRUE(rule.add(StepCallKind::kLoader, 10));  // no training seen yet
  EXPECT_FALSE(rule.add(StepCallKind::kTraining, 20));
  EXPECT_TRUE(rule.add(StepCallKind::kLoader, 30));
  EXPECT_FALSE(rule.add(StepCallKind::kLoader, 40));
  EXPECT_FALSE(rule.add(StepCallKind::kOther, 45));
  EXPECT_FALSE(rule.add(StepCallKind::kTraining, 50));
  EXPECT_FALSE(rule.add(StepCallKind::kLoader, 25));
  EXPECT_TRUE(rule.add(StepCallKind::kLoader, 60));
}

}  // namespace
}  // namespace flare::records
