// 1-Wasserstein (earth mover's) distances, W1(P, Q) = ∫ |F_P(x) − F_Q(x)| dx:
//   - between two empirical samples, exactly (sorted merge of the two step CDFs; equals
//     scipy.stats.wasserstein_distance);
//   - between two piecewise-uniform distributions, exactly (a sweep over their breakpoints);
//   - between two kernel-duration summaries, each rebuilt as a piecewise-uniform mixture from
//     its clusters (rebuildMixture below; docs/metrics.md "Kernel summaries" says why);
//   - between two issue-latency sketches (each bucket uniform over its value range).
//
// Threading: pure functions, safe from any thread; nothing is retained.
#pragma once

#include <span>
#include <vector>

#include "src/stats/kde.h"
#include "src/stats/sketch.h"

namespace flare::stats {

// Exact W1 between the empirical distributions of `a` and `b` (each value weight 1/n). Non-finite
// values are ignored. NaN when either side has no finite value.
double wasserstein1(std::span<const double> a, std::span<const double> b);
// The part of that W1 where `a` lies below `b`: the integral of max(0, F_a(x) - F_b(x)), where
// a's distribution function is above b's. wasserstein1Below(a, b) + wasserstein1Below(b, a) ==
// wasserstein1(a, b); 0 when a is b shifted up. NaN as wasserstein1.
double wasserstein1Below(std::span<const double> a, std::span<const double> b);

// One member against the others without building the others: `pool` holds every member's
// values and `own` is one member's (a sub-multiset of `pool`), both ascending and finite.
// wasserstein1LeaveOneOut(pool, own) == wasserstein1(own, pool \ own) and
// quantileLeaveOneOut(pool, own, q) == quantileSorted(pool \ own, q), in O(|pool|) instead of
// building and sorting pool \ own for every member: n members of m values in O(n²·m), not
// O(n²·m·log). NaN when either side is empty.
double wasserstein1LeaveOneOut(std::span<const double> pool, std::span<const double> own);
double quantileLeaveOneOut(std::span<const double> pool, std::span<const double> own, double q);

// Mass `mass` spread uniformly over [lo, hi]; a point mass when lo == hi.
struct Piece {
  double lo = 0;
  double hi = 0;
  double mass = 0;
};

// A distribution made of uniform pieces (they may overlap). Masses need not sum to 1: the
// distance normalizes each side by its total.
struct PiecewiseDistribution {
  std::vector<Piece> pieces;
  double totalMass() const;
  double mean() const;  // of the normalized distribution
};

// Exact W1 between two piecewise-uniform distributions. Pieces with non-finite bounds or
// non-positive mass are ignored; NaN when either side has no mass left.
double wasserstein1(const PiecewiseDistribution& p, const PiecewiseDistribution& q);

// The quantile function of p at the midpoints u = (g + ½)/G, g = 0..G−1 (p normalized; exact for
// the piecewise-linear CDF). The mean of |Q_p − Q_q| over such a grid is the midpoint rule for
// W1(p, q) = ∫₀¹ |Q_p(u) − Q_q(u)| du. Empty when p has no mass or G = 0.
std::vector<double> quantileGrid(const PiecewiseDistribution& p, size_t G);

// Rebuilds the distribution a kernel summary stands for. Each cluster (count, p50, p99, sum —
// the wire fields; min/max are not used) becomes a piecewise-linear quantile function through
//   Q(0) = a, Q(0.5) = p50, Q(0.99) = p99, Q(1) = b,
// i.e. mass 0.50 uniform on [a, p50], 0.49 on [p50, p99], 0.01 on [p99, b], where
//   a = p50 · (p50/p99)^(0.5/0.49)  (the [p50, p99] log-slope mirrored below the median;
//                                     a = p50 − (p99−p50)·0.5/0.49 when p50 ≤ 0),
//   b chosen so that the cluster's mean equals sum/count (b ≥ p99; when even b = p99 leaves the
//     mean too high, a is lowered instead, down to 0 for positive data).
// With sum unknown (≤ 0), b extends the [p50, p99] slope. A cluster with p50 = p99 = sum/count
// is a point mass. Clusters are weighted by count.
PiecewiseDistribution rebuildMixture(std::span<const DurationCluster> clusters);

// One step of a piecewise-linear CDF (internal to the grid and W1 computations; public only as
// GridScratch's element).
struct CdfEvent {
  double x;
  double jump;
  double dslope;
};

// A distribution's CDF steps (normalized, ascending): built once per member, then the W1 of any
// two by one merge of their lists (no sort per pair). Empty when p has no mass.
std::vector<CdfEvent> cdfEvents(const PiecewiseDistribution& p);
// wasserstein1(p, q) from cdfEvents(p) and cdfEvents(q), equal up to rounding. NaN when either is
// empty.
double wasserstein1(std::span<const CdfEvent> p, std::span<const CdfEvent> q);

// Buffers quantileGridOf reuses between calls.
struct GridScratch {
  PiecewiseDistribution mixture;
  std::vector<CdfEvent> events;
};

// quantileGrid(rebuildMixture(clusters), G) written to out[0, G), without allocating once the
// scratch has grown: the summary detector computes one per rank and signature per pass. False
// (out untouched) when the mixture has no mass.
bool quantileGridOf(std::span<const DurationCluster> clusters, size_t G, double* out,
                    GridScratch* scratch);

// W1 between two summaries' rebuilt mixtures. NaN when either has no count.
double wasserstein1(std::span<const DurationCluster> a, std::span<const DurationCluster> b);

// W1 between two sketches: every bucket uniform over its value range (clipped to the sketch's
// exact min and max), the zero bucket uniform over [−zeroThreshold, zeroThreshold] ∩ [min, max].
// Error against the exact W1 of the underlying samples is at most
// (γ−1)·(E|X| + E|Y|) + 2·zeroThreshold, γ = (1+α)/(1−α). NaN when either sketch is empty.
double wasserstein1(const LatencySketch& a, const LatencySketch& b);

}  // namespace flare::stats
