#include "src/engine/stats/outliers.h"

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

}  // namespace
}  // namespace flare::stats
