// Cross-rank outliers: Tukey fences over per-member scores, and the score the design uses for a
// group of ranks of the same role — each member's mean 1-Wasserstein distance to the others.
//
//   fences: lower = Q1 − α·IQR, upper = Q3 + α·IQR, IQR = Q3 − Q1 (NumPy's default quantiles)
//   outlier: score > upper (high) or score < lower (low), and further than minExcess from the
//            fence it crossed (a floor so that float noise on identical members is no outlier)
//
// Threading: pure functions, safe from any thread; nothing is retained.
#pragma once

#include <cstddef>
#include <functional>
#include <span>
#include <vector>

#include "src/stats/kde.h"

namespace flare::stats {

struct TukeyFences {
  double q1 = 0;
  double q3 = 0;
  double iqr = 0;
  double lower = 0;
  double upper = 0;
};

// Fences of `scores` (finite values). All zero when empty.
TukeyFences tukeyFences(std::span<const double> scores, double alpha = 1.5);

struct OutlierOptions {
  double alpha = 1.5;
  // A score must pass its fence by more than max(minAbsoluteExcess, minRelativeExcess·|median|).
  double minAbsoluteExcess = 0;
  double minRelativeExcess = 1e-9;
  size_t minMembers = 3;  // smaller groups have no outliers
  // Groups larger than this are scored against a fixed, evenly spaced sample of this many
  // reference members instead of every other member (n·k distances instead of n(n−1)/2; see
  // outliersByMeanDistance; summaryOutliers uses a quantile grid instead). 0: always exact.
  size_t maxReferences = 128;
};

struct OutlierResult {
  std::vector<double> scores;  // per member, input order
  TukeyFences fences;
  std::vector<size_t> high;  // members above the upper fence (slow / divergent), ascending index
  std::vector<size_t> low;   // members below the lower fence
};

// Fences and outliers of precomputed scores.
OutlierResult findOutliers(std::span<const double> scores, const OutlierOptions& options = {});

// Scores member i by the mean of distance(i, j) over j ≠ i (distance symmetric; computed once per
// pair: n(n−1)/2 calls), then findOutliers. When n > options.maxReferences (k), the mean runs
// over k reference members spread evenly over the input order instead (j = ⌊t·n/k⌋, t < k;
// j ≠ i): n·k calls, an unbiased estimate of the same mean whose error shrinks as 1/√k, so 10,000
// ranks cost 2.6 M distances instead of 50 M. The order is the caller's (ranks in rank order),
// so the sample is deterministic.
OutlierResult outliersByMeanDistance(size_t n,
                                     const std::function<double(size_t, size_t)>& distance,
                                     const OutlierOptions& options = {});

// The design's kernel-summary check: members are ranks' summaries of one signature, the
// distance the W1 between their rebuilt mixtures. Above options.maxReferences members the mean
// W1 is computed over a 64-point quantile grid of each mixture (midpoint rule for
// ∫|Q_i − Q_j|): per grid point the references' quantiles are sorted once with prefix sums, and
// each member's Σ_j |Δ| takes one binary search — to all other members up to 1,024, and to 1,024
// references spread evenly over the input order beyond (an unbiased estimate of the same mean).
// O(64·n·log k) instead of n(n−1)/2 exact W1s; scores within 2% of the exact ones in
// outliers_test. 10,000 ranks: ~80 ms per signature (stats_benchmark BM_SummaryOutliers).
OutlierResult summaryOutliers(std::span<const std::vector<DurationCluster>> members,
                              const OutlierOptions& options = {});

// The same with raw samples and the exact empirical W1 (tests, raw mode).
OutlierResult sampleOutliers(std::span<const std::vector<double>> members,
                             const OutlierOptions& options = {});

}  // namespace flare::stats
