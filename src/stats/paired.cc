#include "src/stats/paired.h"

#include <algorithm>
#include <cmath>
#include <numeric>

#include "src/stats/quantile.h"

namespace flare::stats {
namespace {

constexpr size_t kExactWilcoxonMaxN = 200;

std::vector<double> nonZeroFinite(std::span<const double> d) {
  std::vector<double> out;
  for (double x : d) {
    if (std::isfinite(x) && x != 0) out.push_back(x);
  }
  return out;
}

}  // namespace

double binomialUpperTail(size_t n, size_t k, double p) {
  if (k == 0) return 1.0;
  if (k > n) return 0.0;
  if (p <= 0) return 0.0;
  if (p >= 1) return 1.0;
  // Sum of the pmf from k to n in log space (lgamma), largest term first for accuracy.
  const double lp = std::log(p), lq = std::log1p(-p);
  const double ln_n = std::lgamma(static_cast<double>(n) + 1);
  double total = 0;
  for (size_t i = k; i <= n; ++i) {
    const double di = static_cast<double>(i);
    const double log_pmf = ln_n - std::lgamma(di + 1) -
                           std::lgamma(static_cast<double>(n - i) + 1) + di * lp +
                           static_cast<double>(n - i) * lq;
    total += std::exp(log_pmf);
  }
  return std::min(1.0, total);
}

SignTestResult signTest(std::span<const double> differences) {
  SignTestResult r;
  for (double x : nonZeroFinite(differences)) {
    ++r.n;
    if (x > 0) ++r.positive;
  }
  r.p_value = r.n == 0 ? 1.0 : binomialUpperTail(r.n, r.positive, 0.5);
  return r;
}

WilcoxonResult wilcoxonSignedRank(std::span<const double> differences) {
  WilcoxonResult r;
  std::vector<double> d = nonZeroFinite(differences);
  r.n = d.size();
  if (d.empty()) return r;
  // Average ranks of |d| (1-based), doubled so that ties' half ranks stay integers.
  std::vector<size_t> order(d.size());
  std::iota(order.begin(), order.end(), 0);
  std::sort(order.begin(), order.end(),
            [&](size_t a, size_t b) { return std::abs(d[a]) < std::abs(d[b]); });
  std::vector<size_t> rank2(d.size());  // doubled ranks
  double tie_term = 0;                  // sum over tie groups of t³ − t
  for (size_t i = 0; i < order.size();) {
    size_t j = i;
    while (j + 1 < order.size() && std::abs(d[order[j + 1]]) == std::abs(d[order[i]])) ++j;
    const size_t doubled = (i + 1) + (j + 1);  // 2 × the average of ranks i+1..j+1
    for (size_t t = i; t <= j; ++t) rank2[order[t]] = doubled;
    const double t = static_cast<double>(j - i + 1);
    tie_term += t * t * t - t;
    i = j + 1;
  }
  size_t w2 = 0;  // doubled W+
  for (size_t i = 0; i < d.size(); ++i) {
    if (d[i] > 0) w2 += rank2[i];
  }
  r.w_plus = static_cast<double>(w2) / 2.0;
  const double n = static_cast<double>(d.size());
  if (d.size() <= kExactWilcoxonMaxN) {
    // Exact: each difference's sign is + or − with probability 1/2 independently; the doubled
    // W+ is the sum of the doubled ranks of the + ones. prob[s] = P(doubled W+ == s).
    const size_t total = std::accumulate(rank2.begin(), rank2.end(), size_t{0});
    std::vector<double> prob(total + 1, 0.0);
    prob[0] = 1.0;
    size_t reach = 0;
    for (size_t r2 : rank2) {
      reach += r2;
      // Descending, so that prob[s − r2] is still the value before this rank (r2 ≥ 2).
      for (size_t s = reach + 1; s-- > 0;)
        prob[s] = 0.5 * (prob[s] + (s >= r2 ? prob[s - r2] : 0.0));
    }
    double tail = 0;
    for (size_t s = w2; s <= total; ++s) tail += prob[s];
    r.p_value = std::min(1.0, tail);
    r.exact = true;
    return r;
  }
  // Normal approximation with the tie correction of the variance and a continuity correction.
  const double mean = n * (n + 1) / 4.0;
  const double var = n * (n + 1) * (2 * n + 1) / 24.0 - tie_term / 48.0;
  const double z = var > 0 ? (r.w_plus - mean - 0.5) / std::sqrt(var) : 0.0;
  r.p_value = 0.5 * std::erfc(z / std::sqrt(2.0));
  r.exact = false;
  return r;
}

std::vector<double> excessOverPeers(std::span<const std::vector<double>> values, size_t m,
                                    size_t minPeers) {
  std::vector<double> out;
  if (m >= values.size()) return out;
  const std::vector<double>& own = values[m];
  std::vector<double> peers;
  for (size_t b = 0; b < own.size(); ++b) {
    if (!std::isfinite(own[b])) continue;
    peers.clear();
    for (size_t j = 0; j < values.size(); ++j) {
      if (j != m && b < values[j].size() && std::isfinite(values[j][b]))
        peers.push_back(values[j][b]);
    }
    if (peers.size() < std::max<size_t>(minPeers, 1)) continue;
    out.push_back(own[b] - quantileInPlace(peers, 0.5));
  }
  return out;
}

std::vector<std::vector<double>> excessOverPeersAll(std::span<const std::vector<double>> values,
                                                    size_t minPeers) {
  std::vector<std::vector<double>> out(values.size());
  size_t blocks = 0;
  for (const auto& v : values) blocks = std::max(blocks, v.size());
  std::vector<std::pair<double, size_t>> column;  // (value, member), sorted
  for (size_t b = 0; b < blocks; ++b) {
    column.clear();
    for (size_t j = 0; j < values.size(); ++j) {
      if (b < values[j].size() && std::isfinite(values[j][b])) column.emplace_back(values[j][b], j);
    }
    // Every member with a value here has column.size() − 1 peers.
    if (column.size() < 2 || column.size() - 1 < std::max<size_t>(minPeers, 1)) continue;
    std::sort(column.begin(), column.end());
    const size_t peers = column.size() - 1;
    const double pos = 0.5 * static_cast<double>(peers - 1);
    const auto lo = static_cast<size_t>(std::floor(pos));
    const size_t hi = std::min(lo + 1, peers - 1);
    const double frac = pos - static_cast<double>(lo);
    for (size_t k = 0; k < column.size(); ++k) {
      // The peers in order: the column without entry k (ties leave the same values).
      auto peer = [&](size_t i) { return column[i < k ? i : i + 1].first; };
      const double a = peer(lo);
      const double median = frac == 0.0 ? a : a + (peer(hi) - a) * frac;
      out[column[k].second].push_back(column[k].first - median);
    }
  }
  return out;
}

}  // namespace flare::stats
