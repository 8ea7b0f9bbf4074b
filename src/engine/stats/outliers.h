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

#include "src/engine/stats/kde.h"

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
// pair: n(n−1)/2 calls), then findOutliers.
OutlierResult outliersByMeanDistance(size_t n,
                                     const std::function<double(size_t, size_t)>& distance,
                                     const OutlierOptions& options = {});

// The design's kernel-summary check: members are ranks' summaries of one signature, the
// distance the W1 between their rebuilt mixtures.
OutlierResult summaryOutliers(std::span<const std::vector<DurationCluster>> members,
                              const OutlierOptions& options = {});

// The same with raw samples and the exact empirical W1 (tests, raw mode).
OutlierResult sampleOutliers(std::span<const std::vector<double>> members,
                             const OutlierOptions& options = {});

}  // namespace flare::stats
