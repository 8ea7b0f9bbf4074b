// The simulator's noise model (noise.h): determinism per seed and the dispersion it is
// calibrated to. The end-to-end checks (a whole sim run, per-rank fault targeting) are in
// tests/python/test_sim_noise.py.
#include "src/sim/noise.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <string>
#include <vector>

#include "src/common/config.h"

namespace flare::sim {
namespace {

double robustCv(std::vector<double> xs) {
  std::sort(xs.begin(), xs.end());
  const double med = xs[xs.size() / 2];
  std::vector<double> dev;
  for (double x : xs) dev.push_back(std::fabs(x - med));
  std::sort(dev.begin(), dev.end());
  return 1.4826 * dev[dev.size() / 2] / med;
}

// NoiseParams' defaults (what these tests check the dispersion of) are the declared defaults the
// simulator reads (src/common/config.cc).
TEST(SimNoise, DefaultsAreTheDeclaredOnes) {
  const NoiseParams p;
  auto declared = [](const char* name) {
    return std::strtod(common::declaredDefault(name), nullptr);
  };
  EXPECT_EQ(p.enabled, declared("FLARE_SIM_NOISE") != 0);
  EXPECT_EQ(p.seed, static_cast<uint64_t>(declared("FLARE_SIM_SEED")));
  EXPECT_DOUBLE_EQ(p.kernel_cv, declared("FLARE_SIM_KERNEL_JITTER"));
  EXPECT_DOUBLE_EQ(p.step_cv, declared("FLARE_SIM_STEP_JITTER"));
  EXPECT_DOUBLE_EQ(p.rank_cv, declared("FLARE_SIM_RANK_JITTER"));
  EXPECT_DOUBLE_EQ(p.host_cv, declared("FLARE_SIM_HOST_JITTER"));
  EXPECT_DOUBLE_EQ(p.hiccup_rate, declared("FLARE_SIM_HICCUP_RATE"));
  EXPECT_DOUBLE_EQ(p.hiccup_us, declared("FLARE_SIM_HICCUP_US"));
  EXPECT_DOUBLE_EQ(p.link_cv, declared("FLARE_SIM_LINK_JITTER"));
  EXPECT_DOUBLE_EQ(p.collective_cv, declared("FLARE_SIM_COLLECTIVE_JITTER"));
}

// A collective's draw is the job's, not the rank's: every member of an instance must end at the
// same modelled time (runGroup). Links differ per rank, and both have the declared spread.
TEST(SimNoise, CollectivesDrawTheSameOnEveryRankAndLinksDifferPerRank) {
  NoiseParams p;
  std::vector<double> coll, links;
  for (int rank = 0; rank < 64; ++rank) {
    const Noise n(p, rank), first(p, 0);
    for (uint64_t seq = 1; seq <= 8; ++seq)
      EXPECT_EQ(n.collectiveFactor(42, seq), first.collectiveFactor(42, seq));
    links.push_back(n.linkFactor());
  }
  const Noise n(p, 0);
  for (uint64_t seq = 1; seq <= 2000; ++seq) coll.push_back(n.collectiveFactor(42, seq));
  EXPECT_NE(n.collectiveFactor(42, 1), n.collectiveFactor(43, 1));  // another communicator
  EXPECT_NEAR(robustCv(coll), p.collective_cv, 0.25 * p.collective_cv);
  EXPECT_NEAR(robustCv(links), p.link_cv, 0.4 * p.link_cv);  // 64 draws
  p.enabled = false;
  EXPECT_EQ(Noise(p, 3).collectiveFactor(42, 1), 1.0);
  EXPECT_EQ(Noise(p, 3).linkFactor(), 1.0);
}

TEST(SimNoise, SameSeedSameDrawsOtherSeedOtherDraws) {
  NoiseParams p;
  p.seed = 7;
  const Noise a(p, 3), b(p, 3);
  p.seed = 8;
  const Noise c(p, 3);
  int differ = 0;
  for (uint64_t n = 0; n < 100; ++n) {
    EXPECT_EQ(a.kernelFactor("gemm", n, 5), b.kernelFactor("gemm", n, 5));
    EXPECT_EQ(a.hostFactor(static_cast<int64_t>(n), 0), b.hostFactor(static_cast<int64_t>(n), 0));
    EXPECT_EQ(a.hiccupNs(n), b.hiccupNs(n));
    differ += a.kernelFactor("gemm", n, 5) != c.kernelFactor("gemm", n, 5);
  }
  EXPECT_EQ(differ, 100);
}

TEST(SimNoise, RanksKernelsAndStepsDrawApart) {
  const NoiseParams p;
  const Noise r0(p, 0), r1(p, 1);
  EXPECT_NE(r0.kernelFactor("k", 0, 0), r1.kernelFactor("k", 0, 0));
  EXPECT_NE(r0.kernelFactor("k", 0, 0), r0.kernelFactor("other", 0, 0));
  EXPECT_NE(r0.kernelFactor("k", 0, 0), r0.kernelFactor("k", 0, 1));
  EXPECT_NE(r0.kernelFactor("k", 0, 0), r0.kernelFactor("k", 1, 0));
}

TEST(SimNoise, OffMeansExactModel) {
  NoiseParams p;
  p.enabled = false;
  const Noise n(p, 2);
  for (uint64_t i = 0; i < 1000; ++i) {
    EXPECT_EQ(n.kernelFactor("k", i, static_cast<int64_t>(i)), 1.0);
    EXPECT_EQ(n.hostFactor(static_cast<int64_t>(i), 1), 1.0);
    EXPECT_EQ(n.hiccupNs(i), 0);
  }
}

// The same kernel (one launch position) across steps varies like the fixtures' kernels do:
// robust CV ~ sqrt(kernel_cv^2 + step_cv^2) (tools/sim_noise_calibrate.py's kernel_cv, 0.0117
// over the H200 fixtures); the summed time of many kernels of a step keeps only the step
// factor (step_gpu_cv, 0.0094). Within 15% of the target over 2000 draws.
TEST(SimNoise, DispersionMatchesTheCalibration) {
  const NoiseParams p;
  const Noise n(p, 0);
  std::vector<double> per_position;
  // The n-th launch of a function in step s: launches are numbered through the run, so position
  // pos of step s is launch s * per_step + pos.
  const uint64_t per_step = 100;
  for (uint64_t pos = 0; pos < per_step; ++pos) {
    std::vector<double> xs;
    for (int64_t step = 0; step < 40; ++step)
      xs.push_back(n.kernelFactor("k", static_cast<uint64_t>(step) * per_step + pos, step));
    per_position.push_back(robustCv(xs));
  }
  std::sort(per_position.begin(), per_position.end());
  const double kernel_cv = per_position[per_position.size() / 2];
  const double want = std::sqrt(p.kernel_cv * p.kernel_cv + p.step_cv * p.step_cv);
  EXPECT_NEAR(kernel_cv, want, 0.15 * want);

  std::vector<double> sums;
  for (int64_t step = 0; step < 2000; ++step) {
    double s = 0;
    for (uint64_t pos = 0; pos < per_step; ++pos)
      s += n.kernelFactor("k", static_cast<uint64_t>(step) * per_step + pos, step);
    sums.push_back(s);
  }
  const double want_step = std::sqrt(p.step_cv * p.step_cv + p.kernel_cv * p.kernel_cv / per_step);
  EXPECT_NEAR(robustCv(sums), want_step, 0.15 * want_step);

  std::vector<double> host;
  for (int64_t step = 0; step < 2000; ++step) host.push_back(n.hostFactor(step, 0));
  EXPECT_NEAR(robustCv(host), p.host_cv, 0.15 * p.host_cv);
}

TEST(SimNoise, HiccupsAtTheCalibratedRateAndSize) {
  const NoiseParams p;
  const Noise n(p, 1);
  int count = 0;
  double total_us = 0;
  const int launches = 400000;
  for (uint64_t i = 0; i < static_cast<uint64_t>(launches); ++i) {
    if (int64_t ns = n.hiccupNs(i); ns > 0) {
      count++;
      total_us += static_cast<double>(ns) / 1e3;
    }
  }
  // 400 expected: Poisson sd 20.
  EXPECT_NEAR(count, p.hiccup_rate * launches, 5 * std::sqrt(p.hiccup_rate * launches));
  EXPECT_NEAR(total_us / count, p.hiccup_us, 0.15 * p.hiccup_us);
}

TEST(SimNoise, RankFactorsSpreadAsConfigured) {
  const NoiseParams p;
  std::vector<double> f;
  for (int r = 0; r < 2000; ++r) {
    NoiseParams q = p;
    q.kernel_cv = 0;
    q.step_cv = 0;
    f.push_back(Noise(q, r).kernelFactor("k", 0, 0));
  }
  EXPECT_NEAR(robustCv(f), p.rank_cv, 0.15 * p.rank_cv);
}

}  // namespace
}  // namespace flare::sim
