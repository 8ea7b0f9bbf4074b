#include "src/stats/quantile.h"

#include <algorithm>
#include <cmath>
#include <limits>

namespace flare::stats {

namespace {

double clampQ(double q) {
  return std::isnan(q) ? 0.5 : std::clamp(q, 0.0, 1.0);
}

}  // namespace

double quantileSorted(std::span<const double> sorted, double q) {
  if (sorted.empty()) return std::numeric_limits<double>::quiet_NaN();
  const double pos = clampQ(q) * static_cast<double>(sorted.size() - 1);
  const size_t lo = static_cast<size_t>(std::floor(pos));
  const size_t hi = std::min(lo + 1, sorted.size() - 1);
  const double frac = pos - static_cast<double>(lo);
  return sorted[lo] + (sorted[hi] - sorted[lo]) * frac;
}

double quantileInPlace(std::span<double> values, double q) {
  if (values.empty()) return std::numeric_limits<double>::quiet_NaN();
  const double pos = clampQ(q) * static_cast<double>(values.size() - 1);
  const size_t lo = static_cast<size_t>(std::floor(pos));
  const double frac = pos - static_cast<double>(lo);
  auto lo_it = values.begin() + static_cast<std::ptrdiff_t>(lo);
  std::nth_element(values.begin(), lo_it, values.end());
  const double a = *lo_it;
  if (frac == 0.0 || lo + 1 >= values.size()) return a;
  // The next order statistic is the smallest element of the upper part.
  const double b = *std::min_element(lo_it + 1, values.end());
  return a + (b - a) * frac;
}

double quantileInPlace(std::vector<double>& values, double q) {
  return quantileInPlace(std::span<double>(values), q);
}

double mean(std::span<const double> x) {
  if (x.empty()) return std::numeric_limits<double>::quiet_NaN();
  double s = 0;
  for (double v : x) s += v;
  return s / static_cast<double>(x.size());
}

double stddev(std::span<const double> x) {
  if (x.size() < 2) return 0.0;
  const double m = mean(x);
  double ss = 0;
  for (double v : x) ss += (v - m) * (v - m);
  return std::sqrt(ss / static_cast<double>(x.size() - 1));
}

double weightedMedian(std::vector<std::pair<double, uint64_t>>& v, uint64_t total) {
  uint64_t need = (total + 1) / 2;  // 2·seen ≥ total
  size_t lo = 0, hi = v.size();
  while (lo < hi) {
    const size_t mid = lo + (hi - lo) / 2;
    const auto first = v.begin() + static_cast<std::ptrdiff_t>(lo);
    std::nth_element(first, v.begin() + static_cast<std::ptrdiff_t>(mid),
                     v.begin() + static_cast<std::ptrdiff_t>(hi));
    uint64_t left = 0;
    for (size_t i = lo; i < mid; ++i) left += v[i].second;
    if (left >= need) {
      hi = mid;
    } else if (left + v[mid].second >= need) {
      return v[mid].first;
    } else {
      need -= left + v[mid].second;
      lo = mid + 1;
    }
  }
  return v.empty() ? 0 : v[std::min(lo, v.size() - 1)].first;
}

}  // namespace flare::stats
