// Kernel-duration summaries: a Gaussian kernel density estimate (KDE) of log-durations with a
// normal-reference bandwidth, clustering by the valleys of that density, and per-cluster
// (count, p50, p99, sum) of the original durations — the wire's KernelSummary.Cluster.
//
// Why log-durations: the same kernel's durations are multiplicative in spread (clock, contention)
// and its modes (cache-hot/cold, different code paths, a slow rank) are separated by ratios, so
// one bandwidth fits every mode in log space.
//
// Cost: the density is evaluated on a grid (at most KdeOptions::gridSize points). Up to
// exactMaxN values it is summed exactly; above, the values are linearly binned onto the grid
// and the bin counts convolved with a Gaussian truncated at `truncate` bandwidths (O(n + G·L)).
// Clustering then costs O(n) (log, bin, one pass to assign, nth_element per cluster).
// Figures: docs/benchmarks.md ("Statistics").
//
// Threading: pure functions, safe from any thread; nothing is retained.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <vector>

namespace flare::stats {

enum class BandwidthRule {
  kSilverman,  // 0.9 · min(σ, IQR/1.34) · n^(-1/5)  (σ when IQR = 0)
  kScott,      // 1.06 · σ · n^(-1/5)
};

struct KdeOptions {
  BandwidthRule rule = BandwidthRule::kSilverman;
  size_t gridSize = 512;  // grid points at most (≥ 16)
  // Fewer points when the data span few bandwidths: the grid step need not be finer than
  // h/pointsPerBandwidth (linear-binning error ≤ step²/(8h²) of the peak, 0.05% at 16).
  // 0: always gridSize points.
  double pointsPerBandwidth = 16;
  double cutBandwidths = 3;  // the grid spans [min − cut·h, max + cut·h]
  size_t exactMaxN = 64;     // above this, binned KDE
  double truncate = 5;       // binned kernel truncated at this many bandwidths
  // A valley splits two modes only when its density is below valleyRatio × the lower of the
  // two peaks beside it (a dip of at least 1 − valleyRatio); shallower valleys are noise.
  double valleyRatio = 0.9;
  // A cluster holding less than this fraction of the values (isolated tail values, a few
  // points beyond a valley) joins its neighbour across the shallower valley. 0: keep all.
  double minClusterFraction = 0.001;
  size_t maxClusters = 8;    // the shallowest valleys are merged beyond this
  double minDurationNs = 1;  // durations below this (incl. ≤ 0) are taken as this before the log
};

// Normal-reference bandwidth of sample `x` (the log-durations). 0 when n < 2 or σ = 0 (a
// degenerate sample: one point mass, one cluster). σ uses the n−1 denominator, IQR NumPy's
// default quantiles — the same σ as scipy.stats.gaussian_kde.
double kdeBandwidth(std::span<const double> x, BandwidthRule rule);

// Exact Gaussian KDE of `x` with bandwidth h > 0 at point `at`:
//   f(at) = 1/(n·h·√(2π)) · Σ exp(−(at − x_i)² / (2h²)).
double kdeAt(std::span<const double> x, double h, double at);

// The density on an evenly spaced grid.
struct KdeGrid {
  double lo = 0;
  double step = 0;
  double bandwidth = 0;
  bool binned = false;
  std::vector<double> density;
  double x(size_t i) const { return lo + step * static_cast<double>(i); }
};

// Evaluates the KDE of finite values `x` with bandwidth h > 0 on an even grid over
// [min − cut·h, max + cut·h] of min(gridSize, max(16, span/h · pointsPerBandwidth)) points;
// exact or binned per options.exactMaxN. Empty grid when x is empty
// or h ≤ 0.
KdeGrid kdeGrid(std::span<const double> x, double h, const KdeOptions& options = {});

// Grid indices of the density's valleys that separate modes, after the valleyRatio and
// maxClusters merges, ascending.
std::vector<size_t> kdeValleys(const KdeGrid& grid, const KdeOptions& options = {});

// One cluster of durations, in ns. p50/p99 use NumPy's default (linear) quantiles.
struct DurationCluster {
  uint64_t count = 0;
  double p50 = 0;
  double p99 = 0;
  double sum = 0;
  double min = 0;  // not on the wire; handy for reports and tests
  double max = 0;
};

struct Clustering {
  double bandwidth = 0;                   // in log-ns; 0 for a degenerate sample
  std::vector<double> cutsLog;            // ascending cluster boundaries in log-ns
  std::vector<DurationCluster> clusters;  // ascending durations
  uint64_t dropped = 0;                   // non-finite durations ignored
};

// Clusters durations (ns) by the valleys of the KDE of their logs. No duration is lost: every
// finite value lands in exactly one cluster (counts sum to the number of finite inputs).
Clustering clusterDurations(std::span<const double> durationsNs, const KdeOptions& options = {});

}  // namespace flare::stats
