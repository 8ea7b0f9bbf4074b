// Paired comparisons of one member of a group against its peers, block by block: one rank
// against the other ranks of the same job, step by step. A small fault that repeats in every
// step (a 2 ms host stall in a 30 ms step) hides in a pooled distribution under run-to-run and
// rank-to-rank noise; pairing each step of the suspect with the same step of its peers removes
// what the step shares (load, the collective's pace), and a rank-free test over the steps asks
// whether the suspect is on the same side in (nearly) every step.
//
//   excessOverPeers: d_b = x[m][b] − median_{j≠m} x[j][b] for every block b where member m and
//                    at least `minPeers` peers have a finite value
//   signTest:        one-sided exact sign test, zeros dropped: p = P(X ≥ #positive),
//                    X ~ Binomial(n_nonzero, 1/2) (H1: the differences' median is > 0)
//   wilcoxonSignedRank: one-sided Wilcoxon signed-rank test, zeros dropped, average ranks for
//                    ties: W+ = sum of the ranks of |d| over positive d; p = P(W ≥ W+) under
//                    the exact permutation distribution (every sign equally likely), computed by
//                    dynamic programming over doubled ranks (exact with ties, n ≤ 200), else
//                    the normal approximation with tie correction and continuity correction
//
// Threading: pure functions, safe from any thread; nothing is retained.
#pragma once

#include <cstddef>
#include <span>
#include <vector>

namespace flare::stats {

// P(X ≥ k) for X ~ Binomial(n, p); 1 when k == 0, 0 when k > n. p in [0, 1].
double binomialUpperTail(size_t n, size_t k, double p = 0.5);

struct SignTestResult {
  size_t n = 0;         // non-zero differences
  size_t positive = 0;  // of them > 0
  double p_value = 1;   // one-sided, H1: median > 0 (1 when n == 0)
};

// Non-finite values are ignored.
SignTestResult signTest(std::span<const double> differences);

struct WilcoxonResult {
  size_t n = 0;        // non-zero differences
  double w_plus = 0;   // sum of the (average) ranks of |d| over d > 0
  double p_value = 1;  // one-sided, H1: the differences are shifted above 0
  bool exact = true;   // false: normal approximation (n > 200)
};

// Non-finite values are ignored.
WilcoxonResult wilcoxonSignedRank(std::span<const double> differences);

// `values[member][block]`, NaN where a member has no value for a block (members may have
// different lengths: missing blocks count as NaN). Returns member `m`'s excess over the median of
// its peers, one entry per block where both exist (block order kept).
std::vector<double> excessOverPeers(std::span<const std::vector<double>> values, size_t m,
                                    size_t minPeers = 2);

// excessOverPeers for every member at once: out[m] == excessOverPeers(values, m, minPeers), the
// same numbers, in O(blocks · n log n) instead of O(blocks · n²) (each block is sorted once and
// a member's peers' median read from it with the member left out): 10,000 ranks of 120 steps in
// well under a second instead of minutes.
std::vector<std::vector<double>> excessOverPeersAll(std::span<const std::vector<double>> values,
                                                    size_t minPeers);

}  // namespace flare::stats
