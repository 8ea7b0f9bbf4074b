#include "src/stats/paired.h"

#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <vector>

namespace flare::stats {
namespace {

TEST(Paired, BinomialTailByHand) {
  // P(X ≥ 10), X ~ B(10, 1/2) = 1/1024; P(X ≥ 9) = 11/1024; P(X ≥ 8) = 56/1024.
  EXPECT_NEAR(binomialUpperTail(10, 10), 1.0 / 1024, 1e-15);
  EXPECT_NEAR(binomialUpperTail(10, 9), 11.0 / 1024, 1e-14);
  EXPECT_NEAR(binomialUpperTail(10, 8), 56.0 / 1024, 1e-14);
  EXPECT_DOUBLE_EQ(binomialUpperTail(10, 0), 1.0);
  EXPECT_DOUBLE_EQ(binomialUpperTail(10, 11), 0.0);
  // B(3, 0.2): P(X ≥ 2) = 3·0.04·0.8 + 0.008 = 0.104.
  EXPECT_NEAR(binomialUpperTail(3, 2, 0.2), 0.104, 1e-14);
}

TEST(Paired, SignTestDropsZerosAndNonFinite) {
  const std::vector<double> d = {1.5, 2, 0, 0.1, -0.3, NAN, 4, INFINITY};
  const SignTestResult r = signTest(d);
  EXPECT_EQ(r.n, 5u);
  EXPECT_EQ(r.positive, 4u);
  EXPECT_NEAR(r.p_value, 6.0 / 32, 1e-15);  // P(X ≥ 4), X ~ B(5, 1/2) = (5 + 1)/32
  EXPECT_DOUBLE_EQ(signTest(std::vector<double>{0, 0}).p_value, 1.0);
}

TEST(Paired, WilcoxonExactByHand) {
  // d = 1, 2, 3, -4: ranks 1..4, W+ = 6. Of the 16 sign patterns, the subsets of {1,2,3,4}
  // summing to ≥ 6 are {2,4},{3,4},{1,2,3},{1,2,4},{1,3,4},{2,3,4},{1,2,3,4}: 7 → p = 7/16.
  const WilcoxonResult r = wilcoxonSignedRank(std::vector<double>{1, 2, 3, -4});
  EXPECT_EQ(r.n, 4u);
  EXPECT_DOUBLE_EQ(r.w_plus, 6);
  EXPECT_TRUE(r.exact);
  EXPECT_NEAR(r.p_value, 7.0 / 16, 1e-15);
  // All positive: p = 2^-n.
  EXPECT_NEAR(wilcoxonSignedRank(std::vector<double>{3, 1, 2, 5, 4, 6}).p_value, 1.0 / 64, 1e-15);
}

TEST(Paired, WilcoxonTiesUseAverageRanks) {
  // |d| = 1, 1, 2: ranks 1.5, 1.5, 3. d = 1, -1, 2 → W+ = 4.5. Sign patterns (8): W+ over
  // subsets of {1.5a, 1.5b, 3}: 0, 1.5, 1.5, 3, 3, 4.5, 4.5, 6 → P(W+ ≥ 4.5) = 3/8.
  const WilcoxonResult r = wilcoxonSignedRank(std::vector<double>{1, -1, 2});
  EXPECT_DOUBLE_EQ(r.w_plus, 4.5);
  EXPECT_NEAR(r.p_value, 3.0 / 8, 1e-15);
}

TEST(Paired, WilcoxonNormalApproximationForLargeN) {
  // n = 400 distinct |d|, the odd ones positive.
  std::vector<double> d;
  for (int i = 1; i <= 400; ++i) d.push_back(i % 2 ? i : -i);  // half negative: W+ near its mean
  const WilcoxonResult r = wilcoxonSignedRank(d);
  EXPECT_FALSE(r.exact);
  // W+ = sum of odd ranks 1..399 = 200² = 40000; mean 40100; sd = sqrt(400·401·801/24).
  const double sd = std::sqrt(400.0 * 401 * 801 / 24);
  const double z = (40000 - 40100 - 0.5) / sd;
  EXPECT_NEAR(r.p_value, 0.5 * std::erfc(z / std::sqrt(2.0)), 1e-12);
}

TEST(Paired, ExcessOverPeersPairsBlocks) {
  // Member 1 is 2 above the median of the others in each block; block 2 has only one peer for
  // member 1 (member 2 lacks it) and is skipped with minPeers 2.
  const std::vector<std::vector<double>> v = {
      {10, 20, 30, 40},
      {12, 23, 32, 41},
      {10, 21, NAN},
      {11, 20, 31, 39},
  };
  const auto e = excessOverPeers(v, 1);
  ASSERT_EQ(e.size(), 4u);
  EXPECT_DOUBLE_EQ(e[0], 12 - 10.0);  // median(10, 10, 11)
  EXPECT_DOUBLE_EQ(e[1], 23 - 20.0);  // median(20, 21, 20)
  EXPECT_DOUBLE_EQ(e[2], 32 - 30.5);  // median(30, 31)
  EXPECT_DOUBLE_EQ(e[3], 41 - 39.5);  // median(40, 39): member 2 has no block 3
  EXPECT_EQ(excessOverPeers(v, 1, 3).size(), 2u);
  EXPECT_TRUE(excessOverPeers(v, 9).empty());
}

TEST(Paired, ExcessOverPeersAllEqualsEachMembersOwn) {
  // Ragged members, NaN holes, ties and odd and even peer counts: every member's result is the
  // one-member function's, bit for bit.
  std::mt19937 rng(7);
  std::uniform_int_distribution<int> value(0, 9);  // small range: many ties
  std::uniform_real_distribution<double> hole(0, 1);
  for (size_t n : {2u, 3u, 4u, 7u, 40u, 41u}) {
    std::vector<std::vector<double>> v(n);
    for (size_t m = 0; m < n; ++m) {
      v[m].resize(10 + m % 3);
      for (double& x : v[m]) x = hole(rng) < 0.1 ? NAN : value(rng) + 0.25 * value(rng);
    }
    for (size_t min_peers : {1u, 2u, 5u}) {
      const auto all = excessOverPeersAll(v, min_peers);
      ASSERT_EQ(all.size(), n);
      for (size_t m = 0; m < n; ++m) {
        const auto one = excessOverPeers(v, m, min_peers);
        ASSERT_EQ(all[m].size(), one.size()) << "n " << n << " member " << m;
        for (size_t i = 0; i < one.size(); ++i) EXPECT_EQ(all[m][i], one[i]);
      }
    }
  }
}

}  // namespace
}  // namespace flare::stats
