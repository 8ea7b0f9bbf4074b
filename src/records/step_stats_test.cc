// Tests of the per-step statistics against values computed by hand.
#include "src/records/step_stats.h"

#include <gtest/gtest.h>

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

}  // namespace
}  // namespace flare::records
