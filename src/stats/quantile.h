// Order statistics shared by the stats library: quantiles with NumPy's default definition
// (linear interpolation between order statistics, Hyndman & Fan type 7), mean and standard
// deviation.
//
// Threading: pure functions, safe from any thread. Nothing here keeps a reference to its input.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <utility>
#include <vector>

namespace flare::stats {

// The q-quantile (0 ≤ q ≤ 1, clamped) of an ascending-sorted sample: the value at position
// q·(n−1), interpolated linearly between its neighbours — numpy.quantile(x, q) with the
// default method. Returns NaN for an empty sample.
double quantileSorted(std::span<const double> sorted, double q);

// The same for an unsorted sample, in O(n) with nth_element. Reorders `values`.
double quantileInPlace(std::vector<double>& values, double q);
double quantileInPlace(std::span<double> values, double q);

// The weighted (lower) median of (value, count) pairs whose counts sum to `total`: the smallest
// value whose cumulative count (in ascending order) reaches half of `total` — what sorting and
// scanning gives, by weighted selection in O(n) expected. Reorders `v`; 0 when empty.
double weightedMedian(std::vector<std::pair<double, uint64_t>>& v, uint64_t total);

// Arithmetic mean (NaN when empty).
double mean(std::span<const double> x);

// Standard deviation with the n−1 denominator (numpy.std(x, ddof=1)); 0 when n < 2.
double stddev(std::span<const double> x);

}  // namespace flare::stats
