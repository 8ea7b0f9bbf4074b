#include "src/stats/quantile.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <random>
#include <vector>

namespace flare::stats {
namespace {

TEST(Quantile, LinearInterpolationLikeNumpy) {
  const std::vector<double> x = {1, 2, 3, 4};
  EXPECT_DOUBLE_EQ(quantileSorted(x, 0.5), 2.5);    // position 1.5
  EXPECT_DOUBLE_EQ(quantileSorted(x, 0.25), 1.75);  // position 0.75
  EXPECT_DOUBLE_EQ(quantileSorted(x, 0.0), 1);
  EXPECT_DOUBLE_EQ(quantileSorted(x, 1.0), 4);
  EXPECT_DOUBLE_EQ(quantileSorted(x, 7.0), 4);  // clamped
  std::vector<double> shuffled = {4, 1, 3, 2};
  EXPECT_DOUBLE_EQ(quantileInPlace(shuffled, 0.25), 1.75);
  std::vector<double> big;
  for (int i = 0; i < 1000; ++i) big.push_back((i * 389) % 1000);  // a permutation of 0..999
  EXPECT_DOUBLE_EQ(quantileInPlace(big, 0.99), 989.01);            // position 989.01
  EXPECT_TRUE(std::isnan(quantileSorted({}, 0.5)));
}

TEST(Quantile, MeanAndSampleStddev) {
  const std::vector<double> x = {2, 4, 4, 4, 5, 5, 7, 9};
  EXPECT_DOUBLE_EQ(mean(x), 5);
  EXPECT_DOUBLE_EQ(stddev(x), std::sqrt(32.0 / 7));  // Σ(x−5)² = 32, n−1 = 7
  EXPECT_EQ(stddev(std::vector<double>{3}), 0);
}

TEST(Quantile, WeightedMedianEqualsSortAndScan) {
  std::mt19937 rng(3);
  std::uniform_int_distribution<int> value(0, 50), count(0, 9);
  for (size_t n : {1u, 2u, 3u, 10u, 101u, 5000u}) {
    std::vector<std::pair<double, uint64_t>> v(n);
    uint64_t total = 0;
    for (auto& [x, c] : v) {
      x = value(rng) * 0.5;
      c = static_cast<uint64_t>(count(rng));
      total += c;
    }
    auto sorted = v;
    std::sort(sorted.begin(), sorted.end());
    double want = 0;
    uint64_t seen = 0;
    for (const auto& [x, c] : sorted) {
      seen += c;
      if (2 * seen >= total) {
        want = x;
        break;
      }
    }
    EXPECT_EQ(weightedMedian(v, total), want) << n;
  }
  std::vector<std::pair<double, uint64_t>> none;
  EXPECT_EQ(weightedMedian(none, 0), 0.0);
}

}  // namespace
}  // namespace flare::stats
