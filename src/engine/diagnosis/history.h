// Healthy history: jobs an operator marked healthy (`flare baseline add`) kept as compact
// HealthyBaseline records (service.proto), and History — what the detectors compare a new job
// with, built from the baseline runs of the job's backend (device name) and scale (rank count).
//
// Learned thresholds (docs/metrics.md "Healthy history"):
//   issue-latency W1: max(floor, margin × max(the largest W1 between two baseline runs, the
//                     largest W1 of one rank to its own run)); every distribution clipped at the
//                     median of the merged baseline distribution (the lower half is where
//                     stalls show). The margin (1.5) covers what a handful of runs cannot: two
//                     runs give one pairwise sample of the healthy spread.
//   V_inter, V_minority: max(2·v, v + margin), v the largest per-rank value of any baseline run
//
// Threading: plain values and pure functions.
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "flare/v1/service.pb.h"
#include "src/engine/diagnosis/job_model.h"
#include "src/stats/sketch.h"

namespace flare::engine {

// One signature across the baseline runs that have it (medians over the runs).
struct HistorySignature {
  uint32_t runs = 0;
  double p50_ns = 0;
  double tflops = 0;
  // Collectives, over the runs that measured a job busbw (busbw_runs; 0: none did): the median
  // and the lowest.
  double busbw_gbps = 0;
  double busbw_low_gbps = 0;
  uint32_t busbw_runs = 0;
};

struct History {
  size_t runs = 0;
  stats::LatencySketch issue_latency;  // merged over the runs
  double issue_cap_ns = 0;             // median of issue_latency: the clip point of W1
  double issue_w1_threshold_ns = 0;    // learned alarm threshold
  std::optional<double> v_inter_threshold;
  std::optional<double> v_minority_threshold;
  std::map<std::string, double> api_rate;  // mean over runs, calls per GPU op
  std::map<std::string, double> sync_rate;
  std::map<std::string, HistorySignature> signatures;  // by signatureKey()
};

struct HistoryOptions {
  double w1_floor_ns = 20'000;
  double w1_margin = 1.5;
  double void_margin = 0.05;
};

// 1-Wasserstein distance between two sketched distributions, each clipped at `cap` (values above
// count as cap), from their quantile functions on a 1000-point grid (each quantile within the
// sketches' relative accuracy). `below`: only where a's quantile is below b's (the part of W1
// where a lies lower, stats::wasserstein1Below).
double clippedW1(const stats::LatencySketch& a, const stats::LatencySketch& b, double cap,
                 bool below = false);

// The history record of a job's window: sketches, void percentages, per-signature medians, API
// rates and metrics. job_id, backend, scale and added_unix_ns are left to the caller.
flare::v1::HealthyBaseline makeBaseline(const JobModel& job);

// History from baseline runs (all of one backend and scale). Undecodable sketches are skipped.
History buildHistory(const std::vector<const flare::v1::HealthyBaseline*>& runs,
                     const HistoryOptions& options);

}  // namespace flare::engine
