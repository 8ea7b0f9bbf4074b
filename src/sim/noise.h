// The simulated GPU's noise: how a healthy run's kernel durations and host times vary, the way a
// real GPU and its host do (issue 21, item 7). Calibrated on the H200 PyTorch traces of
// tests/fixtures/gpu/ by tools/sim_noise_calibrate.py (docs/testing.md, "The simulator's noise").
//
// Every draw is a pure function of (seed, rank, what is drawn, which occurrence), so a run is
// reproducible for a given FLARE_SIM_SEED, and runs with different seeds differ. Factors are
// log-normal with median 1 (a log-normal factor exp(sigma * z) has a coefficient of variation
// close to sigma for the small sigmas used here):
//
//   kernel duration = model duration x rank factor x step factor x launch factor
//     rank factor   per rank, for the whole run (GPUs of one model differ slightly)
//     step factor   per (rank, step): what every kernel of a step shares (clocks, memory)
//     launch factor per (rank, kernel function, n-th launch of it)
//   host time      = the workload's per-step host work (its DataLoader wait) x host factor
//                    per (rank, step, site)
//   host hiccup    before the n-th kernel launch of a rank, with probability hiccup_rate: an
//                  exponential pause of mean hiccup_us on the launching thread
//   link           per rank, for the whole run: its network link's bandwidth factor (links of
//                  one fabric differ slightly; a collective runs at its slowest member's)
//   collective     per collective instance (communicator, sequence number): its transfer time,
//                  the same draw on every member (a fabric's bandwidth varies call to call); the
//                  communicator key nccl.cc passes is per run, so this draw does not repeat
//                  for a seed (docs/testing.md)
//
// The kernel, step, rank and host figures are calibrated on real traces; the link and
// collective ones are assumed (the fixtures are one GPU: no fabric), to be replaced by figures
// from a multi-GPU capture (docs/testing.md, "The simulator's noise").
//
// Pure and thread-safe: no state but the parameters.
#pragma once

#include <cstdint>
#include <string_view>

namespace flare::sim {

// The defaults are the declared ones (src/common/config.cc; sim_noise_test checks they agree).
struct NoiseParams {
  bool enabled = true;          // FLARE_SIM_NOISE
  uint64_t seed = 1;            // FLARE_SIM_SEED
  double kernel_cv = 0.008;     // FLARE_SIM_KERNEL_JITTER
  double step_cv = 0.009;       // FLARE_SIM_STEP_JITTER
  double rank_cv = 0.005;       // FLARE_SIM_RANK_JITTER
  double host_cv = 0.05;        // FLARE_SIM_HOST_JITTER
  double hiccup_rate = 0.001;   // FLARE_SIM_HICCUP_RATE: per kernel launch
  double hiccup_us = 80;        // FLARE_SIM_HICCUP_US: mean pause
  double link_cv = 0.01;        // FLARE_SIM_LINK_JITTER
  double collective_cv = 0.02;  // FLARE_SIM_COLLECTIVE_JITTER
};

class Noise {
 public:
  Noise(const NoiseParams& params, int rank);

  // Multiplies the model duration of the `n`-th launch (0-based) of the kernel function named
  // `name` in `step`. 1.0 when the noise is off.
  double kernelFactor(std::string_view name, uint64_t n, int64_t step) const;
  // Multiplies the workload's host work of `step` at `site` (a small integer naming the place).
  double hostFactor(int64_t step, uint64_t site) const;
  // Host pause in ns before this rank's `n`-th kernel launch (0 almost always).
  int64_t hiccupNs(uint64_t n) const;
  // This rank's link bandwidth factor for the whole run.
  double linkFactor() const;
  // Multiplies the transfer time of collective `seq` of the communicator keyed `comm`: the same
  // for every rank (it does not depend on the rank this Noise was made for).
  double collectiveFactor(uint64_t comm, uint64_t seq) const;

  const NoiseParams& params() const { return p_; }

 private:
  double normal(uint64_t a, uint64_t b, uint64_t c) const;   // a standard normal draw
  double uniform(uint64_t a, uint64_t b, uint64_t c) const;  // in (0, 1)

  NoiseParams p_;
  uint64_t rank_key_;
  uint64_t job_key_;  // the seed alone: draws every rank shares
  double rank_factor_;
};

// A 64-bit hash of a name (FNV-1a), stable across processes and runs.
uint64_t nameHash(std::string_view name);

}  // namespace flare::sim
