#include "src/engine/stats/outliers.h"

#include <algorithm>
#include <cmath>

#include "src/engine/stats/quantile.h"
#include "src/engine/stats/wasserstein.h"

namespace flare::stats {

TukeyFences tukeyFences(std::span<const double> scores, double alpha) {
  TukeyFences f;
  std::vector<double> v;
  for (double s : scores)
    if (std::isfinite(s)) v.push_back(s);
  if (v.empty()) return f;
  std::sort(v.begin(), v.end());
  f.q1 = quantileSorted(v, 0.25);
  f.q3 = quantileSorted(v, 0.75);
  f.iqr = f.q3 - f.q1;
  f.lower = f.q1 - alpha * f.iqr;
  f.upper = f.q3 + alpha * f.iqr;
  return f;
}

OutlierResult findOutliers(std::span<const double> scores, const OutlierOptions& options) {
  OutlierResult r;
  r.scores.assign(scores.begin(), scores.end());
  r.fences = tukeyFences(scores, options.alpha);
  size_t finite = 0;
  for (double s : scores) finite += std::isfinite(s) ? 1 : 0;
  if (finite < std::max<size_t>(options.minMembers, 1)) return r;
  std::vector<double> v;
  for (double s : scores)
    if (std::isfinite(s)) v.push_back(s);
  const double median = quantileInPlace(v, 0.5);
  const double floor =
      std::max(options.minAbsoluteExcess, options.minRelativeExcess * std::fabs(median));
  for (size_t i = 0; i < scores.size(); ++i) {
    const double s = scores[i];
    if (!std::isfinite(s)) continue;
    if (s - r.fences.upper > floor) r.high.push_back(i);
    if (r.fences.lower - s > floor) r.low.push_back(i);
  }
  return r;
}

OutlierResult outliersByMeanDistance(size_t n,
                                     const std::function<double(size_t, size_t)>& distance,
                                     const OutlierOptions& options) {
  // A pair whose distance is undefined (a member without data) is left out of both means; a
  // member with no defined distance gets a NaN score and is never an outlier.
  std::vector<double> sum(n, 0.0);
  std::vector<size_t> pairs(n, 0);
  for (size_t i = 0; i < n; ++i)
    for (size_t j = i + 1; j < n; ++j) {
      const double d = distance(i, j);
      if (!std::isfinite(d)) continue;
      sum[i] += d;
      sum[j] += d;
      ++pairs[i];
      ++pairs[j];
    }
  for (size_t i = 0; i < n; ++i)
    sum[i] = pairs[i] ? sum[i] / static_cast<double>(pairs[i]) : std::nan("");
  return findOutliers(sum, options);
}

OutlierResult summaryOutliers(std::span<const std::vector<DurationCluster>> members,
                              const OutlierOptions& options) {
  std::vector<PiecewiseDistribution> rebuilt;
  rebuilt.reserve(members.size());
  for (const auto& m : members) rebuilt.push_back(rebuildMixture(m));
  return outliersByMeanDistance(
      members.size(), [&](size_t i, size_t j) { return wasserstein1(rebuilt[i], rebuilt[j]); },
      options);
}

OutlierResult sampleOutliers(std::span<const std::vector<double>> members,
                             const OutlierOptions& options) {
  return outliersByMeanDistance(
      members.size(),
      [&](size_t i, size_t j) {
        return wasserstein1(std::span<const double>(members[i]),
                            std::span<const double>(members[j]));
      },
      options);
}

}  // namespace flare::stats
