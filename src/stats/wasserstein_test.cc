#include "src/stats/wasserstein.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <random>
#include <vector>

#include "src/stats/quantile.h"

namespace flare::stats {
namespace {

// One member against the pool without it (the issue-stall detector's leave-one-out) equals
// building the others' values and comparing with them: ties between members included.
TEST(Wasserstein, LeaveOneOutEqualsTheOthersBuilt) {
  std::mt19937_64 rng(5);
  for (int trial = 0; trial < 20; ++trial) {
    std::vector<std::vector<double>> members(2 + trial % 6);
    for (auto& m : members) {
      m.resize(1 + rng() % 300);
      // Values on a coarse grid (many ties, as sketch bucket midpoints are), shifted per member.
      for (double& v : m) v = static_cast<double>(rng() % 40) + static_cast<double>(trial % 3);
      std::sort(m.begin(), m.end());
    }
    std::vector<double> pool;
    for (const auto& m : members) pool.insert(pool.end(), m.begin(), m.end());
    std::sort(pool.begin(), pool.end());
    for (size_t i = 0; i < members.size(); ++i) {
      std::vector<double> others;
      for (size_t j = 0; j < members.size(); ++j) {
        if (j != i) others.insert(others.end(), members[j].begin(), members[j].end());
      }
      std::sort(others.begin(), others.end());
      EXPECT_NEAR(wasserstein1LeaveOneOut(pool, members[i]), wasserstein1(members[i], others), 1e-9)
          << trial << " " << i;
      for (double q : {0.0, 0.05, 0.5, 0.9, 1.0}) {
        EXPECT_DOUBLE_EQ(quantileLeaveOneOut(pool, members[i], q), quantileSorted(others, q))
            << trial << " " << i << " " << q;
      }
    }
  }
  // Nothing left once the member is the whole pool.
  const std::vector<double> only{1, 2, 3};
  EXPECT_TRUE(std::isnan(wasserstein1LeaveOneOut(only, only)));
  EXPECT_TRUE(std::isnan(quantileLeaveOneOut(only, only, 0.5)));
}

TEST(Wasserstein, EmpiricalByHand) {
  EXPECT_DOUBLE_EQ(wasserstein1(std::vector<double>{1}, std::vector<double>{4}), 3);
  EXPECT_DOUBLE_EQ(wasserstein1(std::vector<double>{0, 1, 3}, std::vector<double>{5, 6, 8}), 5);
  // |F_a − F_b| over [1.4,3.4) .5, [3.4,3.9) .25, [3.9,4.5) 0, [4.5,7.5) .5, [7.5,7.8) .25.
  EXPECT_NEAR(wasserstein1(std::vector<double>{3.4, 3.9, 7.5, 7.8}, std::vector<double>{4.5, 1.4}),
              0.5 * 2 + 0.25 * 0.5 + 0.5 * 3 + 0.25 * 0.3, 1e-12);
  // Different sizes: {0} vs {0, 2}: F differs by 1/2 over [0, 2).
  EXPECT_DOUBLE_EQ(wasserstein1(std::vector<double>{0}, std::vector<double>{0, 2}), 1);
  EXPECT_TRUE(std::isnan(wasserstein1(std::vector<double>{}, std::vector<double>{1})));
  EXPECT_TRUE(std::isnan(wasserstein1(std::vector<double>{NAN}, std::vector<double>{1})));
}

// The part of W1 where the first distribution lies lower: a shifted down by 2 is all below, a
// shifted up none; the two parts add up to W1.
TEST(Wasserstein, BelowIsThePartWhereTheFirstLiesLower) {
  const std::vector<double> b{3, 5, 6, 9};
  std::vector<double> down, up;
  for (double v : b) {
    down.push_back(v - 2);
    up.push_back(v + 2);
  }
  EXPECT_DOUBLE_EQ(wasserstein1Below(down, b), 2);
  EXPECT_DOUBLE_EQ(wasserstein1Below(up, b), 0);
  EXPECT_DOUBLE_EQ(wasserstein1Below(b, up), 2);
  // Crossing: {1, 5} against {3}: F_a above over [1, 3) by 1/2, below over [3, 5) by 1/2.
  const std::vector<double> a{1, 5}, c{3};
  EXPECT_DOUBLE_EQ(wasserstein1Below(a, c), 1);
  EXPECT_DOUBLE_EQ(wasserstein1Below(c, a), 1);
  EXPECT_DOUBLE_EQ(wasserstein1(a, c), 2);
  const std::vector<double> d{3.4, 3.9, 7.5, 7.8}, e{4.5, 1.4, 2.0, 8.1};
  EXPECT_NEAR(wasserstein1Below(d, e) + wasserstein1Below(e, d), wasserstein1(d, e), 1e-12);
  EXPECT_TRUE(std::isnan(wasserstein1Below(std::vector<double>{}, b)));
}

TEST(Wasserstein, ShiftedSampleIsTheShift) {
  std::mt19937_64 rng(1);
  std::lognormal_distribution<double> d(3, 0.5);
  std::vector<double> a, b;
  for (int i = 0; i < 500; ++i) {
    a.push_back(d(rng));
    b.push_back(a.back() + 2.5);
  }
  std::shuffle(b.begin(), b.end(), rng);
  EXPECT_NEAR(wasserstein1(a, b), 2.5, 1e-9);
  EXPECT_NEAR(wasserstein1(b, a), 2.5, 1e-9);
  EXPECT_EQ(wasserstein1(a, a), 0);
}

PiecewiseDistribution uniform(double lo, double hi) {
  return {{{lo, hi, 1}}};
}

TEST(Wasserstein, PiecewiseByHand) {
  EXPECT_NEAR(wasserstein1(uniform(0, 1), uniform(0, 1)), 0, 1e-15);
  EXPECT_NEAR(wasserstein1(uniform(0, 1), uniform(1, 2)), 1, 1e-15);
  EXPECT_NEAR(wasserstein1(uniform(0, 1), uniform(0, 0)), 0.5, 1e-15);  // ∫(1 − x)
  // E|U(0,2) − 1| = 1/2; the CDFs cross at 1.
  EXPECT_NEAR(wasserstein1(uniform(0, 2), uniform(1, 1)), 0.5, 1e-15);
  // Masses need not be normalized.
  PiecewiseDistribution heavy{{{0, 1, 7}}};
  EXPECT_NEAR(wasserstein1(heavy, uniform(1, 2)), 1, 1e-15);
  EXPECT_TRUE(std::isnan(wasserstein1(PiecewiseDistribution{}, uniform(0, 1))));
}

TEST(Wasserstein, PointMassPiecesEqualTheEmpiricalDistance) {
  std::mt19937_64 rng(2);
  std::normal_distribution<double> d(0, 1);
  std::vector<double> a, b;
  PiecewiseDistribution pa, pb;
  for (int i = 0; i < 200; ++i) {
    a.push_back(d(rng));
    pa.pieces.push_back({a.back(), a.back(), 1});
  }
  for (int i = 0; i < 130; ++i) {
    b.push_back(d(rng) * 1.5 + 0.3);
    pb.pieces.push_back({b.back(), b.back(), 1});
  }
  EXPECT_NEAR(wasserstein1(pa, pb), wasserstein1(a, b), 1e-12);
}

DurationCluster pointCluster(uint64_t count, double v) {
  return {count, v, v, v * static_cast<double>(count), v, v};
}

TEST(Wasserstein, MixturesOfPointMasses) {
  const std::vector<DurationCluster> a = {pointCluster(100, 100)};
  const std::vector<DurationCluster> b = {pointCluster(5, 200)};
  EXPECT_NEAR(wasserstein1(a, b), 100, 1e-9);
  // 3/4 at 10 and 1/4 at 20 against all at 10: a quarter of the mass moves by 10.
  const std::vector<DurationCluster> mix = {pointCluster(3, 10), pointCluster(1, 20)};
  const std::vector<DurationCluster> ten = {pointCluster(1, 10)};
  EXPECT_NEAR(wasserstein1(mix, ten), 2.5, 1e-12);
  EXPECT_TRUE(std::isnan(wasserstein1(std::vector<DurationCluster>{}, ten)));
}

TEST(Wasserstein, RebuiltClusterKeepsTheMeanAndScales) {
  const DurationCluster c{1000, 100, 150, 105000, 0, 0};
  const PiecewiseDistribution d = rebuildMixture(std::vector<DurationCluster>{c});
  EXPECT_NEAR(d.mean(), 105, 1e-9);
  // Knots: Q(0.5) = p50 and Q(0.99) = p99.
  ASSERT_EQ(d.pieces.size(), 3u);
  EXPECT_EQ(d.pieces[0].hi, 100);
  EXPECT_EQ(d.pieces[1].lo, 100);
  EXPECT_EQ(d.pieces[1].hi, 150);
  EXPECT_NEAR(d.pieces[0].lo, 100 * std::pow(100.0 / 150, 0.5 / 0.49), 1e-9);
  // Y = 2X: Q_Y ≥ Q_X everywhere, so W1 = E[Y] − E[X] = mean = sum/count.
  const DurationCluster c2{1000, 200, 300, 210000, 0, 0};
  EXPECT_NEAR(wasserstein1(std::vector<DurationCluster>{c}, std::vector<DurationCluster>{c2}), 105,
              1e-9);
  // A mean below what the body implies lowers the bottom knot instead of the top one.
  const DurationCluster low{1000, 100, 150, 90000, 0, 0};
  EXPECT_NEAR(rebuildMixture(std::vector<DurationCluster>{low}).mean(), 90, 1e-9);
}

TEST(Wasserstein, SummaryDistanceTracksTheExactOne) {
  // Two ranks' durations, one 10% slower: the W1 of the rebuilt summaries is close to the exact
  // W1 of the raw durations.
  std::mt19937_64 rng(9);
  std::lognormal_distribution<double> fast(std::log(1e5), 0.05), slow(std::log(1e6), 0.05);
  std::vector<double> a, b;
  for (int i = 0; i < 5000; ++i) {
    const double v = (i % 4 == 0) ? slow(rng) : fast(rng);
    a.push_back(v);
    b.push_back(v * 1.1);
  }
  const double exact = wasserstein1(a, b);
  const double summary = wasserstein1(clusterDurations(a).clusters, clusterDurations(b).clusters);
  EXPECT_NEAR(summary, exact, 0.05 * exact);
}

TEST(Wasserstein, SketchDistanceWithinItsBound) {
  std::mt19937_64 rng(4);
  std::lognormal_distribution<double> d(std::log(2e4), 0.8);
  std::vector<double> a, b;
  LatencySketch sa, sb;
  double ma = 0, mb = 0;
  for (int i = 0; i < 4000; ++i) {
    a.push_back(d(rng));
    b.push_back(d(rng) * 0.7 - 3);
    sa.add(a.back());
    sb.add(b.back());
    ma += std::fabs(a.back()) / 4000;
    mb += std::fabs(b.back()) / 4000;
  }
  const double exact = wasserstein1(a, b);
  const double bound = (sa.gamma() - 1) * (ma + mb) + 2 * sa.zeroThreshold();
  EXPECT_NEAR(wasserstein1(sa, sb), exact, bound);
  EXPECT_NEAR(wasserstein1(sa, sa), 0, 1e-9 * ma);  // float round-off only
  EXPECT_TRUE(std::isnan(wasserstein1(sa, LatencySketch())));
}

TEST(Wasserstein, QuantileGridByHand) {
  // Uniform on [0, 10] with mass 3, a point mass 1 at 20: F rises linearly to 0.75 at 10, jumps
  // to 1 at 20. Midpoints of G = 4: u = 1/8, 3/8, 5/8 -> 10u/0.75; u = 7/8 -> 20.
  PiecewiseDistribution p;
  p.pieces = {{0, 10, 3}, {20, 20, 1}};
  const std::vector<double> q = quantileGrid(p, 4);
  ASSERT_EQ(q.size(), 4u);
  EXPECT_NEAR(q[0], 10 * 0.125 / 0.75, 1e-12);
  EXPECT_NEAR(q[1], 10 * 0.375 / 0.75, 1e-12);
  EXPECT_NEAR(q[2], 10 * 0.625 / 0.75, 1e-12);
  EXPECT_DOUBLE_EQ(q[3], 20);
  // Overlapping pieces: [0, 2] and [1, 3], mass 1 each: F = x/4 on [0,1], (2x−1)/4 on [1,2],
  // (x+1)/4 on [2,3]. u = 1/8 -> 0.5; 3/8 -> 1.25; 5/8 -> 1.75; 7/8 -> 2.5.
  PiecewiseDistribution o;
  o.pieces = {{0, 2, 1}, {1, 3, 1}};
  const std::vector<double> r = quantileGrid(o, 4);
  ASSERT_EQ(r.size(), 4u);
  EXPECT_NEAR(r[0], 0.5, 1e-12);
  EXPECT_NEAR(r[1], 1.25, 1e-12);
  EXPECT_NEAR(r[2], 1.75, 1e-12);
  EXPECT_NEAR(r[3], 2.5, 1e-12);
  // The grid's mean |Δ| converges to the exact W1 between the two.
  const std::vector<double> a = quantileGrid(p, 4096), b = quantileGrid(o, 4096);
  double mean = 0;
  for (size_t g = 0; g < a.size(); ++g) mean += std::fabs(a[g] - b[g]) / 4096;
  EXPECT_NEAR(mean, wasserstein1(p, o), 1e-3);
  EXPECT_TRUE(quantileGrid(PiecewiseDistribution{}, 8).empty());
}

// The summary detector's fast forms: a pair's W1 from each side's CDF steps sorted once (checked
// against the mean |Q_p − Q_q| over a fine quantile grid, an independent computation), and a
// member's quantile grid written into reused buffers (equal to quantileGrid), with point
// masses, shared boundaries and empty members among them.
TEST(Wasserstein, SortedStepsAndReusedGridsEqualThePlainForms) {
  std::mt19937_64 rng(11);
  std::uniform_real_distribution<double> p50(1e3, 5e3), spread(1.0, 1.5);
  std::uniform_int_distribution<int> nclusters(0, 6), count(1, 500);
  auto member = [&] {
    std::vector<DurationCluster> m;
    const int n = nclusters(rng);
    for (int i = 0; i < n; ++i) {
      DurationCluster c;
      c.count = static_cast<uint64_t>(count(rng));
      c.p50 = i == 1 && !m.empty() ? m[0].p50 : p50(rng);  // a boundary shared with another
      c.p99 = i == 2 ? c.p50 : c.p50 * spread(rng);        // and a point mass
      c.sum = i == 2 ? c.p50 * static_cast<double>(c.count) : 0;
      m.push_back(c);
    }
    return m;
  };
  std::vector<std::vector<DurationCluster>> members;
  for (int i = 0; i < 60; ++i) members.push_back(member());
  GridScratch scratch;
  for (size_t i = 0; i < members.size(); ++i) {
    const PiecewiseDistribution pi = rebuildMixture(members[i]);
    const std::vector<CdfEvent> ei = cdfEvents(pi);
    const std::vector<double> plain = quantileGrid(pi, 64);
    std::vector<double> reused(64, -1.0);
    EXPECT_EQ(quantileGridOf(members[i], 64, reused.data(), &scratch), !plain.empty());
    if (!plain.empty()) {
      for (size_t g = 0; g < 64; ++g) EXPECT_DOUBLE_EQ(reused[g], plain[g]) << i << " " << g;
    } else {
      EXPECT_EQ(reused[0], -1.0);  // untouched
    }
    for (size_t j = 0; j < members.size(); ++j) {
      const PiecewiseDistribution pj = rebuildMixture(members[j]);
      const double got =
          wasserstein1(std::span<const CdfEvent>(ei), std::span<const CdfEvent>(cdfEvents(pj)));
      const std::vector<double> a = quantileGrid(pi, 8192), b = quantileGrid(pj, 8192);
      if (a.empty() || b.empty()) {
        EXPECT_TRUE(std::isnan(got)) << i << " " << j;
        continue;
      }
      double want = 0;
      for (size_t g = 0; g < a.size(); ++g) want += std::fabs(a[g] - b[g]) / 8192;
      // The midpoint rule's error: at most the integrand's total variation (both quantile
      // functions' ranges, < 20 µs here) over the grid's 8,192 points.
      EXPECT_NEAR(got, want, 5.0) << i << " " << j;
      EXPECT_DOUBLE_EQ(got, wasserstein1(pi, pj));
    }
  }
}

}  // namespace
}  // namespace flare::stats
