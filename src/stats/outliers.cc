#include "src/stats/outliers.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <utility>

#include "src/stats/quantile.h"
#include "src/stats/wasserstein.h"

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
  const size_t k = options.maxReferences;
  if (k > 0 && n > k) {
    std::vector<size_t> refs(k);
    for (size_t t = 0; t < k; ++t) refs[t] = t * n / k;
    for (size_t i = 0; i < n; ++i) {
      for (size_t j : refs) {
        if (j == i) continue;
        const double d = distance(i, j);
        if (!std::isfinite(d)) continue;
        sum[i] += d;
        ++pairs[i];
      }
    }
    for (size_t i = 0; i < n; ++i)
      sum[i] = pairs[i] ? sum[i] / static_cast<double>(pairs[i]) : std::nan("");
    return findOutliers(sum, options);
  }
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
  const size_t n = members.size();
  if (options.maxReferences > 0 && n > options.maxReferences) {
    // Mean W1 to all others over a quantile grid: for each grid point the members' values are
    // sorted once, and Σ_j |v_i − v_j| comes from prefix sums (O(G·n·log n), not n² W1s).
    constexpr size_t kGrid = 64;
    std::vector<double> grids(n * kGrid);  // member i's grid at [i·kGrid, (i+1)·kGrid)
    GridScratch scratch;
    std::vector<size_t> with_data;
    for (size_t i = 0; i < n; ++i)
      if (quantileGridOf(members[i], kGrid, &grids[i * kGrid], &scratch)) with_data.push_back(i);
    auto q = [&](size_t i) { return &grids[i * kGrid]; };
    std::vector<double> score(n, std::nan(""));
    const size_t m = with_data.size();
    // References: every member up to kMaxGridReferences, else that many spread evenly over the
    // input order. Per grid point their quantiles are sorted once with prefix sums; each member
    // then needs one binary search per grid point (its own grid is contiguous, the references'
    // columns fit in cache).
    constexpr size_t kMaxGridReferences = 1024;
    const size_t k = std::min(m, kMaxGridReferences);
    if (k >= 2) {
      std::vector<size_t> refs(k);
      std::vector<char> is_ref(m, 0);
      for (size_t t = 0; t < k; ++t) {
        refs[t] = t * m / k;
        is_ref[refs[t]] = 1;
      }
      std::vector<double> sorted(kGrid * k), prefix(kGrid * (k + 1));
      for (size_t g = 0; g < kGrid; ++g) {
        double* col = &sorted[g * k];
        for (size_t t = 0; t < k; ++t) col[t] = q(with_data[refs[t]])[g];
        std::sort(col, col + k);
        double* pre = &prefix[g * (k + 1)];
        pre[0] = 0;
        for (size_t t = 0; t < k; ++t) pre[t + 1] = pre[t] + col[t];
      }
      for (size_t t = 0; t < m; ++t) {
        const double* mine = q(with_data[t]);
        double total = 0;
        for (size_t g = 0; g < kGrid; ++g) {
          const double* col = &sorted[g * k];
          const double* pre = &prefix[g * (k + 1)];
          const double v = mine[g];
          // Branch-free lower bound (a data-dependent branch mispredicts half the time here).
          const double* base = col;
          for (size_t len = k; len > 1;) {
            const size_t half = len / 2;
            base = base[half - 1] < v ? base + half : base;
            len -= half;
          }
          const size_t below = static_cast<size_t>(base - col) + (*base < v ? 1 : 0);
          total += v * static_cast<double>(below) - pre[below] + (pre[k] - pre[below]) -
                   v * static_cast<double>(k - below);
        }
        // A reference's distance to itself is 0 and is left out of its mean.
        const double others = static_cast<double>(is_ref[t] ? k - 1 : k);
        score[with_data[t]] = total / static_cast<double>(kGrid) / others;
      }
    }
    return findOutliers(score, options);
  }
  // Each mixture's CDF steps sorted once; a pair's W1 is then a merge (a sort per pair was most
  // of a 128-rank pass).
  std::vector<std::vector<CdfEvent>> steps;
  steps.reserve(members.size());
  for (const auto& m : members) steps.push_back(cdfEvents(rebuildMixture(m)));
  return outliersByMeanDistance(
      members.size(),
      [&](size_t i, size_t j) {
        return wasserstein1(std::span<const CdfEvent>(steps[i]),
                            std::span<const CdfEvent>(steps[j]));
      },
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
