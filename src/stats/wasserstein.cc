#include "src/stats/wasserstein.h"

#include <algorithm>
#include <cmath>
#include <limits>

namespace flare::stats {

namespace {

constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();

// ∫_0^w |d0 + (d1 − d0)·t/w| dt.
double absLinearIntegral(double d0, double d1, double w) {
  if (w <= 0) return 0;
  if ((d0 >= 0 && d1 >= 0) || (d0 <= 0 && d1 <= 0))
    return 0.5 * (std::fabs(d0) + std::fabs(d1)) * w;
  return 0.5 * (d0 * d0 + d1 * d1) / (std::fabs(d0) + std::fabs(d1)) * w;
}

using Event = CdfEvent;

// p's CDF steps, normalized by its mass and ascending, into `ev` (cleared first): a piece over
// [lo, hi] is a slope from lo to hi, a point piece a jump. Empty when p has no mass.
void sortedEvents(const PiecewiseDistribution& p, std::vector<Event>& ev) {
  ev.clear();
  const double total = p.totalMass();
  if (!(total > 0)) return;
  ev.reserve(2 * p.pieces.size());
  for (const Piece& piece : p.pieces) {
    if (!(piece.mass > 0) || !std::isfinite(piece.lo) || !std::isfinite(piece.hi)) continue;
    const double m = piece.mass / total;
    const double lo = std::min(piece.lo, piece.hi), hi = std::max(piece.lo, piece.hi);
    if (hi - lo <= 0) {
      ev.push_back({lo, m, 0});
    } else {
      const double s = m / (hi - lo);
      ev.push_back({lo, 0, s});
      ev.push_back({hi, 0, -s});
    }
  }
  std::sort(ev.begin(), ev.end(), [](const Event& l, const Event& r) { return l.x < r.x; });
}

}  // namespace

namespace {

// W1 between the empirical distributions, or (below) only the part where a's CDF is above b's.
double w1Samples(std::span<const double> a, std::span<const double> b, bool below) {
  std::vector<double> x, y;
  x.reserve(a.size());
  y.reserve(b.size());
  for (double v : a)
    if (std::isfinite(v)) x.push_back(v);
  for (double v : b)
    if (std::isfinite(v)) y.push_back(v);
  if (x.empty() || y.empty()) return kNaN;
  std::sort(x.begin(), x.end());
  std::sort(y.begin(), y.end());
  const double nx = static_cast<double>(x.size()), ny = static_cast<double>(y.size());
  size_t i = 0, j = 0;
  double cur = std::min(x[0], y[0]);
  double total = 0;
  while (i < x.size() || j < y.size()) {
    // Advance past every value equal to the current point, then integrate to the next one.
    while (i < x.size() && x[i] <= cur) ++i;
    while (j < y.size() && y[j] <= cur) ++j;
    if (i == x.size() && j == y.size()) break;
    const double next = std::min(i < x.size() ? x[i] : std::numeric_limits<double>::infinity(),
                                 j < y.size() ? y[j] : std::numeric_limits<double>::infinity());
    const double diff = static_cast<double>(i) / nx - static_cast<double>(j) / ny;
    total += (below ? std::max(diff, 0.0) : std::fabs(diff)) * (next - cur);
    cur = next;
  }
  return total;
}

}  // namespace

double wasserstein1(std::span<const double> a, std::span<const double> b) {
  return w1Samples(a, b, /*below=*/false);
}

double wasserstein1Below(std::span<const double> a, std::span<const double> b) {
  return w1Samples(a, b, /*below=*/true);
}

double wasserstein1LeaveOneOut(std::span<const double> pool, std::span<const double> own) {
  if (own.empty() || pool.size() <= own.size()) return kNaN;
  const double na = static_cast<double>(own.size());
  const double nb = static_cast<double>(pool.size() - own.size());
  // Walk the pool's distinct values; at each, count the pool's values (all members) and own's
  // up to it: the others' count is the difference. Integrate |F_own − F_others| in between.
  size_t i = 0, j = 0;
  double cur = pool[0];
  double total = 0;
  while (i < pool.size()) {
    while (i < pool.size() && pool[i] <= cur) ++i;
    while (j < own.size() && own[j] <= cur) ++j;
    if (i == pool.size()) break;
    const double next = pool[i];
    const double fa = static_cast<double>(j) / na;
    const double fb = static_cast<double>(i - j) / nb;
    total += std::fabs(fa - fb) * (next - cur);
    cur = next;
  }
  return total;
}

double quantileLeaveOneOut(std::span<const double> pool, std::span<const double> own, double q) {
  if (pool.size() <= own.size()) return kNaN;
  const size_t n = pool.size() - own.size();
  const double pos = std::clamp(q, 0.0, 1.0) * static_cast<double>(n - 1);
  const auto lo = static_cast<size_t>(std::floor(pos));
  const size_t hi = std::min(lo + 1, n - 1);
  // The others' k-th value: the pool's values in order, own's matched ones skipped.
  double at_lo = kNaN, at_hi = kNaN;
  size_t k = 0, j = 0;
  for (size_t i = 0; i < pool.size() && k <= hi; ++i) {
    if (j < own.size() && own[j] == pool[i]) {
      ++j;
      continue;
    }
    if (k == lo) at_lo = pool[i];
    if (k == hi) at_hi = pool[i];
    ++k;
  }
  return at_lo + (at_hi - at_lo) * (pos - static_cast<double>(lo));
}

double PiecewiseDistribution::totalMass() const {
  double m = 0;
  for (const Piece& p : pieces)
    if (p.mass > 0 && std::isfinite(p.lo) && std::isfinite(p.hi)) m += p.mass;
  return m;
}

double PiecewiseDistribution::mean() const {
  double m = 0, s = 0;
  for (const Piece& p : pieces) {
    if (!(p.mass > 0) || !std::isfinite(p.lo) || !std::isfinite(p.hi)) continue;
    m += p.mass;
    s += p.mass * 0.5 * (p.lo + p.hi);
  }
  return m > 0 ? s / m : kNaN;
}

std::vector<CdfEvent> cdfEvents(const PiecewiseDistribution& p) {
  std::vector<Event> ev;
  sortedEvents(p, ev);
  return ev;
}

double wasserstein1(std::span<const CdfEvent> p, std::span<const CdfEvent> q) {
  if (p.empty() || q.empty()) return kNaN;
  // D(x) = F_p(x) − F_q(x) is piecewise linear between steps; integrate |D| exactly, walking the
  // two sorted lists as one (q's steps negated).
  double d = 0, slope = 0, x = std::min(p.front().x, q.front().x), total = 0;
  size_t i = 0, j = 0;
  while (i < p.size() || j < q.size()) {
    const double x0 = std::min(i < p.size() ? p[i].x : std::numeric_limits<double>::infinity(),
                               j < q.size() ? q[j].x : std::numeric_limits<double>::infinity());
    const double w = x0 - x;
    const double d1 = d + slope * w;
    total += absLinearIntegral(d, d1, w);
    d = d1;
    for (; i < p.size() && p[i].x == x0; ++i) {
      d += p[i].jump;
      slope += p[i].dslope;
    }
    for (; j < q.size() && q[j].x == x0; ++j) {
      d -= q[j].jump;
      slope -= q[j].dslope;
    }
    x = x0;
  }
  return total;
}

double wasserstein1(const PiecewiseDistribution& p, const PiecewiseDistribution& q) {
  return wasserstein1(std::span<const CdfEvent>(cdfEvents(p)),
                      std::span<const CdfEvent>(cdfEvents(q)));
}

namespace {

// quantileGrid into out[0, G) with `ev` as scratch; false when p has no mass.
bool quantileGridInto(const PiecewiseDistribution& p, size_t G, double* out,
                      std::vector<Event>& ev) {
  if (G == 0) return false;
  sortedEvents(p, ev);
  if (ev.empty()) return false;
  // F is piecewise linear between events (slope `slope`) and jumps at point masses; walk it once
  // while the targets u_g rise.
  double f = 0, slope = 0, x = ev.front().x;
  size_t i = 0, g = 0;
  auto target = [G](size_t k) { return (static_cast<double>(k) + 0.5) / static_cast<double>(G); };
  while (g < G) {
    const bool more = i < ev.size();
    const double x1 = more ? ev[i].x : x;
    const double f1 = f + slope * (x1 - x);
    // Targets reached inside the linear stretch [x, x1).
    while (g < G && target(g) <= f1 && slope > 0) {
      out[g] = x + (target(g) - f) / slope;
      ++g;
    }
    if (!more) break;
    f = f1;
    x = x1;
    for (; i < ev.size() && ev[i].x == x1; ++i) {
      f += ev[i].jump;
      slope += ev[i].dslope;
    }
    // Targets inside a jump (a point mass) sit at the jump.
    while (g < G && target(g) <= f) {
      out[g] = x;
      ++g;
    }
  }
  // Rounding can leave the last targets just above F's final value: they sit at the maximum.
  for (; g < G; ++g) out[g] = x;
  return true;
}

void rebuildMixtureInto(std::span<const DurationCluster> clusters, PiecewiseDistribution* mix) {
  std::vector<Piece>& out = mix->pieces;
  out.clear();
  out.reserve(3 * clusters.size());
  for (const DurationCluster& c : clusters) {
    if (c.count == 0 || !std::isfinite(c.p50) || !std::isfinite(c.p99)) continue;
    const double w = static_cast<double>(c.count);
    const double p50 = c.p50;
    const double p99 = std::max(c.p99, c.p50);
    double a = (p50 > 0) ? p50 * std::pow(p50 / p99, 0.5 / 0.49) : p50 - (p99 - p50) * (0.5 / 0.49);
    double b;
    const double m = c.sum / w;
    if (c.sum > 0 && std::isfinite(m)) {
      // mean of the quantile function = 0.25(a+p50) + 0.245(p50+p99) + 0.005(p99+b)
      b = (m - 0.25 * (a + p50) - 0.245 * (p50 + p99)) / 0.005 - p99;
      if (!(b >= p99)) {
        b = p99;
        a = (m - 0.245 * (p50 + p99) - 0.01 * p99) / 0.25 - p50;
        a = std::min(a, p50);
        if (p50 > 0) a = std::max(a, 0.0);
      }
    } else {
      b = p99 + (p99 - p50) * (0.01 / 0.49);
    }
    if (!std::isfinite(a) || !std::isfinite(b)) continue;
    out.push_back({a, p50, 0.50 * w});
    out.push_back({p50, p99, 0.49 * w});
    out.push_back({p99, b, 0.01 * w});
  }
}

}  // namespace

std::vector<double> quantileGrid(const PiecewiseDistribution& p, size_t G) {
  std::vector<double> out(G);
  std::vector<Event> ev;
  if (!quantileGridInto(p, G, out.data(), ev)) out.clear();
  return out;
}

bool quantileGridOf(std::span<const DurationCluster> clusters, size_t G, double* out,
                    GridScratch* scratch) {
  rebuildMixtureInto(clusters, &scratch->mixture);
  return quantileGridInto(scratch->mixture, G, out, scratch->events);
}

PiecewiseDistribution rebuildMixture(std::span<const DurationCluster> clusters) {
  PiecewiseDistribution out;
  rebuildMixtureInto(clusters, &out);
  return out;
}

double wasserstein1(std::span<const DurationCluster> a, std::span<const DurationCluster> b) {
  return wasserstein1(rebuildMixture(a), rebuildMixture(b));
}

double wasserstein1(const LatencySketch& a, const LatencySketch& b) {
  if (a.count() == 0 || b.count() == 0) return kNaN;
  auto rebuild = [](const LatencySketch& s) {
    PiecewiseDistribution d;
    d.pieces.reserve(s.bucketCount());
    s.forEachBucket([&](double lo, double hi, uint64_t c) {
      d.pieces.push_back({lo, hi, static_cast<double>(c)});
    });
    return d;
  };
  return wasserstein1(rebuild(a), rebuild(b));
}

}  // namespace flare::stats
