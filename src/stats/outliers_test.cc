#include "src/stats/outliers.h"

#include <gtest/gtest.h>

#include <cmath>
#include <vector>

namespace flare::stats {
namespace {

TEST(Outliers, TukeyFencesByHand) {
  const std::vector<double> s = {1, 2, 3, 4, 5, 6, 7, 8, 9, 100};
  const TukeyFences f = tukeyFences(s, 1.5);
  EXPECT_DOUBLE_EQ(f.q1, 3.25);  // position 2.25
  EXPECT_DOUBLE_EQ(f.q3, 7.75);  // position 6.75
  EXPECT_DOUBLE_EQ(f.iqr, 4.5);
  EXPECT_DOUBLE_EQ(f.upper, 7.75 + 1.5 * 4.5);
  EXPECT_DOUBLE_EQ(f.lower, 3.25 - 1.5 * 4.5);
  const OutlierResult r = findOutliers(s);
  EXPECT_EQ(r.high, std::vector<size_t>{9});
  EXPECT_TRUE(r.low.empty());
  // α = 3 ("far out"): 7.75 + 13.5 = 21.25, 100 still beyond.
  EXPECT_DOUBLE_EQ(tukeyFences(s, 3).upper, 21.25);
  const OutlierResult low = findOutliers(std::vector<double>{10, 10.5, 11, 11.5, 12, -40});
  EXPECT_EQ(low.low, std::vector<size_t>{5});
}

TEST(Outliers, MeanW1ScoresFlagTheSlowRank) {
  // Eight ranks; seven run a kernel at 100 µs, rank 5 at 130 µs (point masses).
  std::vector<std::vector<double>> ranks(8, std::vector<double>(20, 100.0));
  ranks[5].assign(20, 130.0);
  const OutlierResult r = sampleOutliers(ranks);
  ASSERT_EQ(r.scores.size(), 8u);
  EXPECT_NEAR(r.scores[5], 30, 1e-9);           // 30 to each of the 7 others
  EXPECT_NEAR(r.scores[0], 30.0 / 7, 1e-9);     // 30 to rank 5, 0 to the 6 others
  EXPECT_NEAR(r.fences.upper, 30.0 / 7, 1e-9);  // Q1 = Q3 = 30/7
  EXPECT_EQ(r.high, std::vector<size_t>{5});
  EXPECT_TRUE(r.low.empty());
  // The same from summaries.
  std::vector<std::vector<DurationCluster>> sums(8, {{20, 100, 100, 2000, 100, 100}});
  sums[5] = {{20, 130, 130, 2600, 130, 130}};
  const OutlierResult rs = summaryOutliers(sums);
  EXPECT_EQ(rs.high, std::vector<size_t>{5});
  EXPECT_NEAR(rs.scores[5], 30, 1e-9);
}

TEST(Outliers, IdenticalAndSmallGroupsHaveNoOutliers) {
  std::vector<std::vector<double>> same(6, {1.0, 2.0, 3.0});
  EXPECT_TRUE(sampleOutliers(same).high.empty());
  std::vector<std::vector<double>> two = {{1.0}, {100.0}};
  EXPECT_TRUE(sampleOutliers(two).high.empty());
  // A member without data gets a NaN score and does not poison the others.
  std::vector<std::vector<double>> with_empty(8, std::vector<double>{100.0});
  with_empty[2].clear();
  with_empty[6] = {200.0};
  const OutlierResult r = sampleOutliers(with_empty);
  EXPECT_TRUE(std::isnan(r.scores[2]));
  EXPECT_EQ(r.high, std::vector<size_t>{6});
}

TEST(Outliers, LargeGroupsUseEvenlySpacedReferences) {
  // 2,000 ranks with durations spread over [100, 110) µs, rank 1234 at 150 µs. Scored against 64
  // references instead of 1,999 peers: n·k distance calls, scores within a few percent of the
  // exact mean, and the same outlier.
  const size_t n = 2000;
  std::vector<double> value(n);
  for (size_t i = 0; i < n; ++i) value[i] = 100.0 + static_cast<double>((i * 7919) % 1000) / 100;
  value[1234] = 150.0;
  size_t calls = 0;
  auto dist = [&](size_t i, size_t j) {
    ++calls;
    return std::fabs(value[i] - value[j]);
  };
  OutlierOptions exact_opt;
  exact_opt.maxReferences = 0;
  const OutlierResult exact = outliersByMeanDistance(n, dist, exact_opt);
  EXPECT_EQ(calls, n * (n - 1) / 2);
  calls = 0;
  OutlierOptions sampled_opt;
  sampled_opt.maxReferences = 64;
  const OutlierResult sampled = outliersByMeanDistance(n, dist, sampled_opt);
  EXPECT_LE(calls, n * 64);
  EXPECT_EQ(exact.high, std::vector<size_t>{1234});
  EXPECT_EQ(sampled.high, std::vector<size_t>{1234});
  double worst = 0;
  for (size_t i = 0; i < n; ++i)
    worst = std::max(worst, std::fabs(sampled.scores[i] / exact.scores[i] - 1));
  EXPECT_LT(worst, 0.10);
  // References are every (n/k)-th member: rank 0 is one of them and is not compared with itself.
  EXPECT_TRUE(std::isfinite(sampled.scores[0]));
  // At or below the bound the computation is the exact one.
  std::vector<std::vector<double>> ranks(8, std::vector<double>(20, 100.0));
  ranks[5].assign(20, 130.0);
  OutlierOptions small;
  small.maxReferences = 8;
  EXPECT_NEAR(sampleOutliers(ranks, small).scores[0], 30.0 / 7, 1e-9);
}

TEST(Outliers, LargeSummaryGroupsUseTheQuantileGrid) {
  // 600 ranks' two-cluster summaries with spread medians, rank 321 30% slower. Above
  // maxReferences (here 100) the scores come from the quantile grid: within 2% of the exact
  // pairwise mean W1 and the same outlier.
  std::vector<std::vector<DurationCluster>> members;
  for (size_t i = 0; i < 600; ++i) {
    const double base = 100 + static_cast<double>((i * 37) % 100) / 20;  // 100..105
    const double f = i == 321 ? 1.3 : 1.0;
    members.push_back({{80, base * f, base * f * 1.04, 80 * base * f * 1.005, 0, 0},
                       {20, 2 * base * f, 2.1 * base * f, 20 * 2.02 * base * f, 0, 0}});
  }
  OutlierOptions exact_opt;
  exact_opt.maxReferences = 0;
  OutlierOptions grid_opt;
  grid_opt.maxReferences = 100;
  const OutlierResult exact = summaryOutliers(members, exact_opt);
  const OutlierResult grid = summaryOutliers(members, grid_opt);
  EXPECT_EQ(exact.high, std::vector<size_t>{321});
  EXPECT_EQ(grid.high, std::vector<size_t>{321});
  double worst = 0;
  for (size_t i = 0; i < members.size(); ++i)
    worst = std::max(worst, std::fabs(grid.scores[i] / exact.scores[i] - 1));
  EXPECT_LT(worst, 0.02);
  // A member without data: NaN, the others unaffected.
  members[7].clear();
  const OutlierResult holes = summaryOutliers(members, grid_opt);
  EXPECT_TRUE(std::isnan(holes.scores[7]));
  EXPECT_EQ(holes.high, std::vector<size_t>{321});
}

}  // namespace
}  // namespace flare::stats
