#include "src/stats/kde.h"

#include <algorithm>
#include <cmath>
#include <utility>

#include "src/stats/quantile.h"

namespace flare::stats {

namespace {

constexpr double kInvSqrt2Pi = 0.3989422804014327;  // 1/√(2π)

}  // namespace

double kdeBandwidth(std::span<const double> x, BandwidthRule rule) {
  const size_t n = x.size();
  if (n < 2) return 0.0;
  const double sigma = stddev(x);
  // σ at round-off level (identical values whose mean is not exact in binary) is degenerate too.
  if (!(sigma > 1e-12 * std::max(1.0, std::fabs(mean(x)))) || !std::isfinite(sigma)) return 0.0;
  const double nf = std::pow(static_cast<double>(n), -0.2);
  if (rule == BandwidthRule::kScott) return 1.06 * sigma * nf;
  std::vector<double> copy(x.begin(), x.end());
  const double q3 = quantileInPlace(copy, 0.75);
  const double q1 = quantileInPlace(copy, 0.25);
  const double iqr = q3 - q1;
  double a = std::min(sigma, iqr / 1.34);
  if (!(a > 0)) a = sigma;  // IQR = 0 (over half the sample tied): fall back to σ
  return 0.9 * a * nf;
}

double kdeAt(std::span<const double> x, double h, double at) {
  if (x.empty() || !(h > 0)) return 0.0;
  double s = 0;
  for (double v : x) {
    const double z = (at - v) / h;
    s += std::exp(-0.5 * z * z);
  }
  return s * kInvSqrt2Pi / (static_cast<double>(x.size()) * h);
}

KdeGrid kdeGrid(std::span<const double> x, double h, const KdeOptions& options) {
  KdeGrid grid;
  if (x.empty() || !(h > 0)) return grid;
  const auto [mn, mx] = std::minmax_element(x.begin(), x.end());
  grid.bandwidth = h;
  grid.lo = *mn - options.cutBandwidths * h;
  const double hi = *mx + options.cutBandwidths * h;
  size_t g = std::max<size_t>(options.gridSize, 16);
  if (options.pointsPerBandwidth > 0) {
    const double wanted = std::ceil((hi - grid.lo) / h * options.pointsPerBandwidth) + 1;
    if (wanted < static_cast<double>(g)) g = std::max<size_t>(16, static_cast<size_t>(wanted));
  }
  grid.step = (hi - grid.lo) / static_cast<double>(g - 1);
  grid.density.assign(g, 0.0);
  const double n = static_cast<double>(x.size());
  const double norm = kInvSqrt2Pi / (n * h);
  if (x.size() <= options.exactMaxN) {
    for (size_t i = 0; i < g; ++i) {
      double s = 0;
      const double at = grid.x(i);
      for (double v : x) {
        const double z = (at - v) / h;
        s += std::exp(-0.5 * z * z);
      }
      grid.density[i] = s * norm;
    }
    return grid;
  }
  grid.binned = true;
  // Linear binning: each value splits its unit weight between the two grid points around it.
  std::vector<double> counts(g + 1, 0.0);
  const double inv_step = 1.0 / grid.step;
  for (double v : x) {
    const double pos = (v - grid.lo) * inv_step;
    const double fl = std::floor(pos);
    size_t j = static_cast<size_t>(std::max(0.0, fl));
    if (j > g - 1) j = g - 1;
    const double frac = std::clamp(pos - static_cast<double>(j), 0.0, 1.0);
    counts[j] += 1.0 - frac;
    counts[j + 1] += frac;
  }
  counts[g - 1] += counts[g];  // only reached at the upper edge by rounding
  // Convolution with the Gaussian sampled on the grid, truncated at `truncate` bandwidths.
  const size_t half =
      std::min<size_t>(g - 1, static_cast<size_t>(std::ceil(options.truncate * h * inv_step)));
  std::vector<double> kernel(half + 1);
  for (size_t l = 0; l <= half; ++l) {
    const double z = static_cast<double>(l) * grid.step / h;
    kernel[l] = std::exp(-0.5 * z * z);
  }
  for (size_t j = 0; j < g; ++j) {
    const double c = counts[j];
    if (c == 0.0) continue;
    const size_t from = j >= half ? j - half : 0;
    const size_t to = std::min(g - 1, j + half);
    for (size_t i = from; i <= to; ++i) grid.density[i] += c * kernel[i > j ? i - j : j - i];
  }
  for (double& d : grid.density) d *= norm;
  return grid;
}

std::vector<size_t> kdeValleys(const KdeGrid& grid, const KdeOptions& options) {
  const auto& y = grid.density;
  std::vector<size_t> peaks, valleys;
  if (y.size() < 3) return valleys;
  const double tol = 1e-12 * *std::max_element(y.begin(), y.end());
  // Walk the grid; a flat run at a turning point counts as one extremum at its middle.
  int dir = +1;
  size_t flat_start = 0;
  for (size_t i = 1; i < y.size(); ++i) {
    const double d = y[i] - y[i - 1];
    const int s = (d > tol) - (d < -tol);
    if (s == 0) continue;
    if (s != dir) {
      const size_t ext = (flat_start + (i - 1)) / 2;
      (dir > 0 ? peaks : valleys).push_back(ext);
      dir = s;
    }
    flat_start = i;
  }
  if (dir > 0) peaks.push_back((flat_start + y.size() - 1) / 2);
  if (peaks.empty()) return {};
  valleys.resize(std::min(valleys.size(), peaks.size() - 1));
  // Merge the modes whose valley is too shallow, shallowest first, and beyond maxClusters.
  std::vector<double> peak_h;
  for (size_t p : peaks) peak_h.push_back(y[p]);
  const size_t max_clusters = std::max<size_t>(options.maxClusters, 1);
  while (!valleys.empty()) {
    size_t worst = 0;
    double worst_ratio = -1;
    for (size_t v = 0; v < valleys.size(); ++v) {
      const double lower_peak = std::min(peak_h[v], peak_h[v + 1]);
      const double ratio = lower_peak > 0 ? y[valleys[v]] / lower_peak : 1.0;
      if (ratio > worst_ratio) {
        worst_ratio = ratio;
        worst = v;
      }
    }
    if (worst_ratio < options.valleyRatio && valleys.size() + 1 <= max_clusters) break;
    peak_h[worst] = std::max(peak_h[worst], peak_h[worst + 1]);
    peak_h.erase(peak_h.begin() + static_cast<std::ptrdiff_t>(worst) + 1);
    valleys.erase(valleys.begin() + static_cast<std::ptrdiff_t>(worst));
  }
  return valleys;
}

Clustering clusterDurations(std::span<const double> durationsNs, const KdeOptions& options) {
  Clustering out;
  std::vector<double> logs;
  logs.reserve(durationsNs.size());
  const double floor_ns = options.minDurationNs > 0 ? options.minDurationNs : 1.0;
  for (double d : durationsNs) {
    if (!std::isfinite(d)) {
      ++out.dropped;
      continue;
    }
    logs.push_back(std::log(std::max(d, floor_ns)));
  }
  if (logs.empty()) return out;
  out.bandwidth = kdeBandwidth(logs, options.rule);
  std::vector<double> valley_height;
  if (out.bandwidth > 0) {
    const KdeGrid grid = kdeGrid(logs, out.bandwidth, options);
    for (size_t v : kdeValleys(grid, options)) {
      out.cutsLog.push_back(grid.x(v));
      valley_height.push_back(grid.density[v]);
    }
  }
  // Cluster of each value, and the counts.
  std::vector<uint32_t> which(logs.size());
  std::vector<size_t> counts(out.cutsLog.size() + 1, 0);
  for (size_t i = 0; i < logs.size(); ++i) {
    const auto c = static_cast<uint32_t>(
        std::upper_bound(out.cutsLog.begin(), out.cutsLog.end(), logs[i]) - out.cutsLog.begin());
    which[i] = c;
    ++counts[c];
  }
  // Clusters below minClusterFraction (isolated tail values) join the neighbour across the
  // shallower valley, smallest first.
  std::vector<uint32_t> remap(counts.size());
  {
    struct Group {
      size_t count;
      uint32_t last;  // last original cluster in the group
    };
    std::vector<Group> groups;
    for (size_t c = 0; c < counts.size(); ++c)
      groups.push_back({counts[c], static_cast<uint32_t>(c)});
    std::vector<double> cuts = out.cutsLog, heights = valley_height;
    const double min_count = options.minClusterFraction * static_cast<double>(logs.size());
    while (groups.size() > 1) {
      size_t g = 0;
      for (size_t i = 1; i < groups.size(); ++i)
        if (groups[i].count < groups[g].count) g = i;
      if (static_cast<double>(groups[g].count) >= min_count) break;
      // Merge g with g−1 (cut g−1) or g+1 (cut g), whichever valley is higher.
      const bool left = g > 0 && (g + 1 == groups.size() || heights[g - 1] >= heights[g]);
      const size_t keep = left ? g - 1 : g;  // the group that absorbs the other
      const size_t cut = left ? g - 1 : g;
      groups[keep].count += groups[keep + 1].count;
      groups[keep].last = groups[keep + 1].last;
      groups.erase(groups.begin() + static_cast<std::ptrdiff_t>(keep) + 1);
      cuts.erase(cuts.begin() + static_cast<std::ptrdiff_t>(cut));
      heights.erase(heights.begin() + static_cast<std::ptrdiff_t>(cut));
    }
    uint32_t c = 0;
    for (size_t gi = 0; gi < groups.size(); ++gi)
      for (; c <= groups[gi].last; ++c) remap[c] = static_cast<uint32_t>(gi);
    out.cutsLog = std::move(cuts);
  }
  // Counting sort of the finite durations by cluster, then per-cluster order statistics.
  const size_t k = out.cutsLog.size() + 1;
  std::vector<size_t> offset(k + 1, 0);
  for (uint32_t& w : which) {
    w = remap[w];
    ++offset[w + 1];
  }
  for (size_t c = 0; c < k; ++c) offset[c + 1] += offset[c];
  std::vector<double> sorted_by_cluster(logs.size());
  {
    std::vector<size_t> fill(offset.begin(), offset.end() - 1);
    size_t i = 0;
    for (double d : durationsNs) {
      if (!std::isfinite(d)) continue;
      sorted_by_cluster[fill[which[i++]]++] = d;
    }
  }
  std::vector<double> cuts;  // the cuts between the non-empty clusters
  for (size_t c = 0; c < k; ++c) {
    std::span<double> part(sorted_by_cluster.data() + offset[c], offset[c + 1] - offset[c]);
    if (part.empty()) continue;  // a valley with no value beside it: nothing to report
    if (!out.clusters.empty()) cuts.push_back(out.cutsLog[c - 1]);
    DurationCluster cl;
    cl.count = part.size();
    double sum = 0;
    double mn = part[0], mx = part[0];
    for (double v : part) {
      sum += v;
      mn = std::min(mn, v);
      mx = std::max(mx, v);
    }
    cl.sum = sum;
    cl.min = mn;
    cl.max = mx;
    cl.p99 = quantileInPlace(part, 0.99);
    cl.p50 = quantileInPlace(part, 0.50);
    out.clusters.push_back(cl);
  }
  out.cutsLog = std::move(cuts);
  return out;
}

}  // namespace flare::stats
