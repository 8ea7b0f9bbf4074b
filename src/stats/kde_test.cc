#include "src/stats/kde.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <numbers>
#include <random>
#include <vector>

namespace flare::stats {
namespace {

TEST(Kde, BandwidthRulesByHand) {
  const std::vector<double> x = {0, 1, 2, 3, 4};
  // σ = √(10/4); IQR = 3 − 1 = 2 → min(σ, 2/1.34) = 2/1.34; n^(−1/5) = 5^(−0.2).
  EXPECT_NEAR(kdeBandwidth(x, BandwidthRule::kSilverman), 0.9 * (2 / 1.34) * std::pow(5, -0.2),
              1e-12);
  EXPECT_NEAR(kdeBandwidth(x, BandwidthRule::kScott), 1.06 * std::sqrt(2.5) * std::pow(5, -0.2),
              1e-12);
  // IQR = 0 but σ > 0: Silverman falls back to σ.
  const std::vector<double> tied = {1, 1, 1, 1, 1, 1, 8};
  const double sigma = std::sqrt((6 * 1.0 + 36.0) / 6);  // mean 2; Σ(x−2)² = 6·1 + 36
  EXPECT_NEAR(kdeBandwidth(tied, BandwidthRule::kSilverman), 0.9 * sigma * std::pow(7, -0.2),
              1e-12);
  // Degenerate samples.
  EXPECT_EQ(kdeBandwidth(std::vector<double>{3}, BandwidthRule::kSilverman), 0);
  EXPECT_EQ(kdeBandwidth(std::vector<double>{3, 3, 3}, BandwidthRule::kScott), 0);
}

TEST(Kde, ExactDensityOfOnePoint) {
  const std::vector<double> x = {0};
  EXPECT_NEAR(kdeAt(x, 1, 0), 1 / std::sqrt(2 * std::numbers::pi), 1e-15);
  EXPECT_NEAR(kdeAt(x, 2, 2), std::exp(-0.5) / (2 * std::sqrt(2 * std::numbers::pi)), 1e-15);
}

TEST(Kde, BinnedGridMatchesExactSum) {
  std::mt19937_64 rng(7);
  std::normal_distribution<double> a(0, 1), b(5, 0.5);
  std::vector<double> x;
  for (int i = 0; i < 3000; ++i) x.push_back(i % 3 ? a(rng) : b(rng));
  const double h = kdeBandwidth(x, BandwidthRule::kSilverman);
  const KdeGrid grid = kdeGrid(x, h);
  ASSERT_TRUE(grid.binned);
  // The grid step is h/16 (fewer than 512 points needed) or the span over 511 steps.
  ASSERT_LE(grid.density.size(), 512u);
  EXPECT_LE(grid.step, h / 16 * (1 + 1e-12));
  KdeOptions full;
  full.pointsPerBandwidth = 0;
  EXPECT_EQ(kdeGrid(x, h, full).density.size(), 512u);
  double peak = 0, worst = 0, integral = 0;
  for (size_t i = 0; i < grid.density.size(); ++i) {
    const double exact = kdeAt(x, h, grid.x(i));
    peak = std::max(peak, exact);
    worst = std::max(worst, std::fabs(exact - grid.density[i]));
    integral += grid.density[i] * grid.step;
  }
  EXPECT_LT(worst, 1e-3 * peak);
  EXPECT_NEAR(integral, 1.0, 0.01);  // the grid covers ±3h beyond the data
}

std::vector<double> twoGroups() {
  // Group A: 1000, 1001, ..., 1299 ns; group B: 100000, 100010, ..., 101990 ns; interleaved.
  std::vector<double> x;
  for (int i = 0; i < 300; ++i) {
    x.push_back(1000 + i);
    if (i < 200) x.push_back(100000 + 10 * i);
  }
  std::shuffle(x.begin(), x.end(), std::mt19937(3));
  return x;
}

TEST(Kde, TwoSeparatedGroupsGiveTwoExactClusters) {
  const Clustering c = clusterDurations(twoGroups());
  ASSERT_EQ(c.clusters.size(), 2u);
  ASSERT_EQ(c.cutsLog.size(), 1u);
  EXPECT_GT(c.cutsLog[0], std::log(1299.0));
  EXPECT_LT(c.cutsLog[0], std::log(100000.0));
  const DurationCluster& a = c.clusters[0];
  const DurationCluster& b = c.clusters[1];
  EXPECT_EQ(a.count, 300u);
  EXPECT_DOUBLE_EQ(a.p50, 1149.5);   // position 149.5 of 1000..1299
  EXPECT_DOUBLE_EQ(a.p99, 1296.01);  // position 296.01
  EXPECT_DOUBLE_EQ(a.sum, 300 * 1000 + 299 * 300 / 2);
  EXPECT_EQ(a.min, 1000);
  EXPECT_EQ(a.max, 1299);
  EXPECT_EQ(b.count, 200u);
  EXPECT_DOUBLE_EQ(b.p50, 100995);     // position 99.5 of 100000 + 10i
  EXPECT_NEAR(b.p99, 101970.1, 1e-9);  // position 197.01
  EXPECT_DOUBLE_EQ(b.sum, 200 * 100000.0 + 10 * 199 * 200 / 2);
}

TEST(Kde, ExactAndBinnedPathsAgree) {
  KdeOptions exact;
  exact.exactMaxN = 1u << 30;
  KdeOptions binned;
  binned.exactMaxN = 0;
  const auto x = twoGroups();
  const Clustering ce = clusterDurations(x, exact), cb = clusterDurations(x, binned);
  ASSERT_EQ(ce.clusters.size(), 2u);
  ASSERT_EQ(cb.clusters.size(), 2u);
  EXPECT_EQ(ce.clusters[0].count, cb.clusters[0].count);
}

TEST(Kde, ThreeGroupsAndTheClusterCap) {
  std::vector<double> x;
  std::mt19937_64 rng(11);
  std::normal_distribution<double> noise(0, 0.02);
  for (int i = 0; i < 400; ++i) x.push_back(1e3 * std::exp(noise(rng)));
  for (int i = 0; i < 300; ++i) x.push_back(1e4 * std::exp(noise(rng)));
  for (int i = 0; i < 100; ++i) x.push_back(1e5 * std::exp(noise(rng)));
  const Clustering c = clusterDurations(x);
  ASSERT_EQ(c.clusters.size(), 3u);
  EXPECT_EQ(c.clusters[0].count, 400u);
  EXPECT_EQ(c.clusters[1].count, 300u);
  EXPECT_EQ(c.clusters[2].count, 100u);
  KdeOptions two;
  two.maxClusters = 2;
  const Clustering c2 = clusterDurations(x, two);
  ASSERT_EQ(c2.clusters.size(), 2u);
  uint64_t total = 0;
  for (const auto& cl : c2.clusters) total += cl.count;
  EXPECT_EQ(total, 800u);
}

TEST(Kde, OneModeStaysOneCluster) {
  std::mt19937_64 rng(5);
  std::lognormal_distribution<double> d(std::log(5e4), 0.1);
  for (size_t n : {10u, 100u, 10000u}) {
    std::vector<double> x;
    for (size_t i = 0; i < n; ++i) x.push_back(d(rng));
    const Clustering c = clusterDurations(x);
    EXPECT_EQ(c.clusters.size(), 1u) << "n=" << n;
  }
}

TEST(Kde, IsolatedTailValuesJoinTheirNeighbour) {
  std::vector<double> x;
  for (int i = 0; i < 2000; ++i) x.push_back(1e4 + (i % 100));
  x.push_back(1e6);  // one stall: 1/2001 < 0.1%
  const Clustering merged = clusterDurations(x);
  ASSERT_EQ(merged.clusters.size(), 1u);
  EXPECT_EQ(merged.clusters[0].count, 2001u);
  EXPECT_EQ(merged.clusters[0].max, 1e6);
  EXPECT_DOUBLE_EQ(merged.clusters[0].sum, 2000 * 1e4 + 20 * (99 * 100 / 2) + 1e6);
  KdeOptions keep_all;
  keep_all.minClusterFraction = 0;
  const Clustering split = clusterDurations(x, keep_all);
  ASSERT_EQ(split.clusters.size(), 2u);
  EXPECT_EQ(split.clusters[1].count, 1u);
  EXPECT_EQ(split.clusters[1].p50, 1e6);
}

TEST(Kde, DegenerateAndBadInput) {
  EXPECT_TRUE(clusterDurations(std::vector<double>{}).clusters.empty());
  const Clustering one = clusterDurations(std::vector<double>{42});
  ASSERT_EQ(one.clusters.size(), 1u);
  EXPECT_EQ(one.clusters[0].count, 1u);
  EXPECT_EQ(one.clusters[0].p50, 42);
  EXPECT_EQ(one.clusters[0].p99, 42);
  const Clustering same = clusterDurations(std::vector<double>(50, 7.0));
  ASSERT_EQ(same.clusters.size(), 1u);
  EXPECT_EQ(same.clusters[0].count, 50u);
  EXPECT_EQ(same.clusters[0].sum, 350);
  EXPECT_EQ(same.bandwidth, 0);
  // Non-finite values are dropped and counted; zero and negative durations are kept.
  const Clustering bad = clusterDurations(std::vector<double>{NAN, INFINITY, 0, -5, 10, 10});
  EXPECT_EQ(bad.dropped, 2u);
  uint64_t total = 0;
  for (const auto& cl : bad.clusters) total += cl.count;
  EXPECT_EQ(total, 4u);
}

}  // namespace
}  // namespace flare::stats
